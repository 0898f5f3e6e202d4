"""The rules and not-started detection: on the source text before the build (`check_source`),
and on what the build compiled after it (`check_build`): the headers it read, the libraries it
links, what each C entry point's code reaches, and each kernel's shared memory, barriers,
inline PTX and SASS. The rules' run-time half is grader/child/observe.py."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from grader import paths, toolchain
from grader.build import objects, packages
from grader.build.nvcc import BuildFacts, BuildResult, KernelFacts
from grader.records import Verdict
from grader.tasks.regions import (
    HASH,
    RegionError,
    code_text,
    find_regions,
    is_untouched,
    locate_in,
    not_started,
    style_for,
)
from grader.tasks.rules import opcodes_matching, shown, symbol_matches
from grader.tasks.spec import CudaTask, Rule, Task

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_STRING = re.compile(r'"(?:\\.|[^"\\\n])*"')
# Python (and notebook cells): strings first, so a `#` inside one is not a comment
_PY_TOKEN = re.compile(r"(\"\"\"|''')[\s\S]*?\1|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'|#[^\n]*")


def _blank(match: re.Match[str]) -> str:
    return "\n" * match.group(0).count("\n") or " "  # keeps line numbers right


def _strip_python(code: str, strings: bool) -> str:
    def sub(m: re.Match[str]) -> str:
        token = m.group(0)
        if token.startswith("#"):
            return " "
        return '""' + "\n" * token.count("\n") if strings else token

    return _PY_TOKEN.sub(sub, code)


def strip_comments(source: str, where: str = "", strings: bool = True) -> str:
    """Source without comments (and, with `strings`, string contents), so a mention in prose breaks
    no rule. `where`, the file's name, picks the language: `#` comments for Python and for the
    code cells of a notebook (joined, as `code_text` gives them), `//` and `/* */` otherwise."""
    code, _ = code_text(source, where)
    if style_for(where) == HASH:
        return _strip_python(code, strings)
    return _COMMENT.sub(_blank, _STRING.sub('""', code) if strings else code)


@dataclass
class StaticOutcome:
    verdict: Verdict | None  # None: nothing stops the task here
    message: str
    notes: list[str]


def check_source(task: Task, source: str, where: str) -> StaticOutcome:
    try:
        regions = find_regions(source, where)
    except RegionError as e:
        return StaticOutcome(Verdict.RULE, f"{e} (restore the TODO markers from the skeleton)", [])
    if regions and not_started(source, where):
        return StaticOutcome(
            Verdict.NOT_STARTED,
            f"every TODO({task.task_id}) region in {where} is still empty: write your code between "
            f"the `begin` and `end` lines",
            [],
        )
    notes = [f"{r.at(where)}: TODO({r.tag}) region is still untouched ({r.hint})" for r in regions if is_untouched(r)]
    code = strip_comments(source, where, strings=False)
    code_no_strings = strip_comments(source, where)
    cells = code_text(source, where)[1]  # a notebook's: where each code cell starts in `code`
    for rule in task.rules:
        if rule.compiled:
            continue  # judged on the build: check_build
        # includes live inside <> or "", and inline PTX inside asm strings: such rules read the
        # comment-free code with its strings
        text = code if rule.strings or "include" in rule.pattern else code_no_strings
        found = re.search(rule.pattern, text)
        if rule.kind == "forbid" and found:
            line = text[: found.start()].count("\n") + 1
            place = locate_in(where, cells, line)
            return StaticOutcome(Verdict.RULE, f"{place}: `{found.group(0).strip()}`: {rule.why}", notes)
        if rule.kind == "require" and not found:
            return StaticOutcome(Verdict.RULE, f"{where}: {rule.why}", notes)
    return StaticOutcome(None, "", notes)


# --- rules on the build ---------------------------------------------------------------------

# how nvcc's preprocessor (gcc's, or cudafe's) says an #include found nothing
_MISSING_HEADER = re.compile(
    r"^(?P<file>[^\s:(]+)(?::(?P<line>\d+):\d+: fatal error: (?P<h1>[^\s:]+): No such file or directory"
    r'|\((?P<line2>\d+)\): (?:catastrophic )?error: cannot open source file "(?P<h2>[^"]+)")',
    re.M,
)


def check_build(task: Task, build: BuildResult, sources: Mapping[str, Path]) -> StaticOutcome:
    """The task's compiled rules, in the order the spec gives them, on what `build` compiled.

    A file that is not started got its verdict before the build, unless the run was forced
    (make verify runs untouched skeletons): then, as before the build, no rule applies. A build
    that failed because an #include of a library found nothing is still the library rule's
    business: on a machine without cuBLAS, `#include <cublas_v2.h>` breaks that rule, not the
    compiler. An entry point that the build's target cannot run (`Entry.min_cc`, `max_cc`: rung 4
    of lab 2's tensor-core ladder anywhere but sm_90) is left out: no rule judges its code there, a
    rule that names only such entry points is not judged, and where no entry point runs only the
    library rules are."""
    rules = [r for r in task.rules if r.compiled]
    if any(_unstarted(p) for p in sources.values()):
        return StaticOutcome(None, "", [])
    if not build.ok or build.facts is None:
        if any(r.kind == "no_libraries" for r in rules):
            for m in _MISSING_HEADER.finditer(build.log):
                header = m["h1"] or m["h2"]
                if packages.library_of_header(header):
                    why = next(r.why for r in rules if r.kind == "no_libraries")
                    where = f"{paths.rel(Path(m['file']))}:{m['line'] or m['line2']}"
                    return StaticOutcome(Verdict.RULE, f"{where}: {_line_of(where)}includes {header}: {why}", [])
        return StaticOutcome(None, "", [])
    if not any(r.kind == "allow_lookup" for r in rules):
        message = lookups(build.facts)
        if message:
            return StaticOutcome(Verdict.RULE, message, [])
    every = tuple(e.symbol for e in getattr(task, "entries", ()))
    skipped = skipped_by_build(task, build)
    entries = tuple(e for e in every if e not in skipped)
    if every and not entries:
        rules = [r for r in rules if r.kind in ("no_libraries", "no_library")]
    for rule in rules:
        named = tuple(getattr(rule, "entries", ()))
        if named and skipped:
            kept = tuple(e for e in named if e not in skipped)
            if not kept:
                continue
            rule = dataclasses.replace(rule, entries=kept)  # type: ignore[call-arg]  # a CompiledRule
        judge = _JUDGES.get(rule.kind)
        message = judge(rule, build.facts, entries) if judge else None
        if message:
            return StaticOutcome(Verdict.RULE, message, [])
    return StaticOutcome(None, "", [])


def skipped_by_build(task: Task, build: BuildResult) -> dict[str, str]:
    """The task's entry points that the card the build targets cannot run, each with its reason
    (CudaTask.skipped): the code compiled for them there is not theirs to be judged by."""
    if not isinstance(task, CudaTask) or not build.arch:
        return {}
    try:
        return task.skipped(toolchain.compute_capability(build.arch))
    except (toolchain.ToolchainError, ValueError):
        return {}


def _unstarted(path: Path) -> bool:
    try:
        source = path.read_text()
        return bool(find_regions(source, str(path))) and not_started(source, str(path))
    except (OSError, UnicodeDecodeError, RegionError):
        return False


def _line_of(where: str) -> str:
    """ "`<the line>` " for "file:line", or "" when the file cannot be read."""
    file, _, line = where.rpartition(":")
    try:
        text = (paths.ROOT / file if not Path(file).is_absolute() else Path(file)).read_text()
        return f"`{text.splitlines()[int(line) - 1].strip()}` "
    except (OSError, ValueError, IndexError):
        return ""


def _short(header: str) -> str:
    """The header as an #include names it: from the library's folder (thrust/transform.h), or
    the file name (cublas_v2.h)."""
    parts = Path(header).parts
    for i, part in enumerate(parts):
        if part in packages.LIBRARY_FOLDERS and i < len(parts) - 1:
            return "/".join(parts[i:])
    return parts[-1]


def _no_libraries(rule: Rule, facts: BuildFacts, entries: tuple[str, ...] = ()) -> str | None:
    return _libraries(rule, facts, lambda library: True)


def _no_library(rule: Rule, facts: BuildFacts, entries: tuple[str, ...] = ()) -> str | None:
    return _libraries(rule, facts, lambda library: bool(re.fullmatch(rule.pattern, library)))


def _libraries(rule: Rule, facts: BuildFacts, counts: Callable[[str], bool]) -> str | None:
    """The first library header, linked library or library symbol (of a library `counts`) the
    build reached for, as a message; None when there is none."""
    for header, where in facts.library_headers.items():
        library = packages.library_of_header(header, paths.ROOT)
        if not library or not counts(library):
            continue
        if where:
            return f"{where}: {_line_of(where)}brings in {_short(header)} ({library}): {rule.why}"
        return f"the build read {_short(header)} ({library}), a library header: {rule.why}"
    for header in facts.headers:  # a record without include lines (none found)
        library = packages.library_of_header(header, paths.ROOT)
        if library and counts(library):
            return f"the build read {_short(header)} ({library}), a library header: {rule.why}"
    linked = [n for n in facts.needed or [] if (lib := packages.library_of_soname(n)) and counts(lib)]
    if linked:
        return f"the library links {', '.join(linked)}: {rule.why}"
    called = [s for s in facts.library_symbols or [] if (lib := packages.library_of_symbol(s)) and counts(lib)]
    if called:
        shown = ", ".join(called[:3]) + (", ..." if len(called) > 3 else "")
        return f"the library calls {shown}: {rule.why}"
    return None


def _chosen(rule: Rule, facts: BuildFacts) -> tuple[list[KernelFacts], str | None]:
    """The kernels a per-kernel rule judges, or the message when there are none to judge."""
    if not facts.kernels:
        return [], f"no kernel was compiled from {_files(facts)}: {rule.why}"
    if not rule.pattern:
        return facts.kernels, None
    chosen = [k for k in facts.kernels if re.search(rule.pattern, k.kernel)]
    if not chosen:
        names = ", ".join(k.kernel.split("(")[0] for k in facts.kernels)
        return [], f"no kernel named like `{rule.pattern}` was compiled (there are: {names}): {rule.why}"
    return chosen, None


def _files(facts: BuildFacts) -> str:
    return ", ".join(sorted({k.source for k in facts.kernels})) or "the task's files"


def _failing(rule: Rule, facts: BuildFacts, complies: Callable[[KernelFacts], bool]) -> tuple[KernelFacts, str] | str:
    """The kernel that breaks a per-kernel rule (with how many more do), or the message when no
    kernel can be judged; "" when the rule holds. With a pattern every matching kernel must
    comply; without, one kernel of the task is enough."""
    chosen, problem = _chosen(rule, facts)
    if problem:
        return problem
    without = [k for k in chosen if not complies(k)]
    if not without or (not rule.pattern and len(without) < len(chosen)):
        return ""
    more = f" (nor do {len(without) - 1} other kernels)" if len(without) > 1 else ""
    return without[0], more


def _shared_memory(rule: Rule, facts: BuildFacts, entries: tuple[str, ...] = ()) -> str | None:
    found = _failing(rule, facts, lambda k: k.uses_shared_memory)
    if isinstance(found, str):
        return found or None
    k, more = found
    return (
        f"{k.source}: kernel `{k.kernel}` uses no shared memory{more}: ptxas gives it {k.smem_bytes} bytes of "
        f"shared memory and its code never reads or writes any (a __shared__ array that is never used is compiled "
        f"away): {rule.why}"
    )


def _barrier(rule: Rule, facts: BuildFacts, entries: tuple[str, ...] = ()) -> str | None:
    found = _failing(rule, facts, lambda k: k.has_barrier)
    if isinstance(found, str):
        return found or None
    k, more = found
    count = k.barriers if k.barriers is not None else "no"
    return (
        f"{k.source}: kernel `{k.kernel}` has no block-wide barrier{more}: ptxas reports {count} barriers for it "
        f"(a __syncthreads() the compiler can prove never runs is removed): {rule.why}"
    )


# --- what the entry points' code reaches, and the kernels it can launch ---------------------------


def lookups(facts: BuildFacts) -> str | None:
    """A run-time symbol lookup in the student's objects, as a message; None when there is none."""
    for source, symbols in (facts.undefined or {}).items():
        sites = (facts.lookups or {}).get(source, {})
        found = [
            s
            for s in symbols
            if s in objects.LOOKUPS and not objects.library_lookup(s, sites.get(s, ()), facts.headers)
        ]
        if found:
            callers = sorted({f for s in found for f in sites.get(s, ())})
            where = f" (in {', '.join(callers[:3])})" if callers else ""
            return (
                f"{source}: its compiled code calls {', '.join(found)}{where}, a run-time symbol lookup: a function "
                f"found that way (the cuBLAS that torch already loaded, a driver entry point) escapes this task's "
                f"rules on what it may use; call the CUDA runtime directly, and only what the task allows"
            )
    return None


def _named(rule: Rule, task_entries: tuple[str, ...]) -> tuple[str, ...]:
    return getattr(rule, "entries", ()) or task_entries


def reached(facts: BuildFacts, entry: str) -> tuple[list[str], list[KernelFacts]] | None:
    """The external symbols and the compiled kernels `entry`'s code reaches; None when the build
    could not say (no readelf, or no C function of that name): then every symbol and kernel."""
    if facts.reach is None or entry not in facts.reach:
        return None
    r = facts.reach[entry]
    kernels = [k for k in facts.kernels if k.mangled in r.kernels]
    return r.calls, kernels


def _everything(facts: BuildFacts) -> tuple[list[str], list[KernelFacts]]:
    symbols = sorted({s for syms in (facts.undefined or {}).values() for s in syms})
    return symbols, list(facts.kernels)


def _runtime_calls(symbols: list[str]) -> str:
    shown = [s for s in symbols if re.match(r"(cuda|cu[A-Z]|cublas|cudnn|cufft|curand|cusparse|cusolver)", s)]
    if not shown:
        return "no CUDA runtime or library function"
    return ", ".join(shown[:8]) + (", ..." if len(shown) > 8 else "")


def _calls(rule: Rule, facts: BuildFacts, entries: tuple[str, ...]) -> str | None:
    pattern = {"graph_replay": "cudaGraphLaunch", "pinned_copies": "cudaMallocHost|cudaHostAlloc|cudaHostRegister"}
    wanted = pattern.get(rule.kind, rule.pattern)
    for entry in _named(rule, entries):
        found = reached(facts, entry)
        symbols = found[0] if found else _everything(facts)[0]
        if not any(symbol_matches(wanted, s) for s in symbols):
            if found is None:
                return f"the compiled code never calls {shown(wanted)}: {rule.why}"
            return (
                f"`{entry}` never calls {shown(wanted)}: no code it reaches refers to it (a call in a helper that it "
                f"never calls does not count; it reaches {_runtime_calls(symbols)}): {rule.why}"
            )
    return None


def _never_calls(rule: Rule, facts: BuildFacts, entries: tuple[str, ...]) -> str | None:
    named = getattr(rule, "entries", ())
    groups = [(e, reached(facts, e)) for e in named] or [("", None)]
    for entry, found in groups:
        symbols = found[0] if found else _everything(facts)[0]
        bad = [s for s in symbols if symbol_matches(rule.pattern, s)]
        if bad:
            whose = f"`{entry}` reaches a call of" if found else "the compiled code calls"
            return f"{whose} {', '.join(bad[:3])}: {rule.why}"
    return None


def _kernels_of(rule: Rule, facts: BuildFacts, entries: tuple[str, ...]) -> list[tuple[str, list[KernelFacts]]]:
    """Per entry point (or one group for the whole build when the record cannot say), the compiled
    kernels it reaches, named like the rule's pattern when the rule uses it for kernels."""
    groups: list[tuple[str, list[KernelFacts]]] = []
    for entry in _named(rule, entries):
        found = reached(facts, entry)
        if found is None:
            return [("", _everything(facts)[1])]
        groups.append((entry, found[1]))
    return groups or [("", list(facts.kernels))]


def _names(kernels: list[KernelFacts]) -> str:
    return ", ".join(k.kernel.split("(")[0] for k in kernels) or "none"


def _whom(entry: str) -> str:
    return f"`{entry}` reaches" if entry else "the build compiled"


def _tensor_cores(rule: Rule, facts: BuildFacts, entries: tuple[str, ...]) -> str | None:
    for entry, kernels in _kernels_of(rule, facts, entries):
        chosen = [k for k in kernels if not rule.pattern or re.search(rule.pattern, k.kernel)]
        if any(k.sass is None for k in chosen):
            return None  # no cuobjdump here: the task process judges the kernels that ran
        if not any(k.tensor_core_opcodes for k in chosen):
            return (
                f"no kernel {_whom(entry)} executes a tensor-core instruction: the SASS of "
                f"{_names(chosen)} has no HMMA or HGMMA: {rule.why}"
            )
    return None


def _cuda_cores(rule: Rule, facts: BuildFacts, entries: tuple[str, ...]) -> str | None:
    for entry, kernels in _kernels_of(rule, facts, entries):
        chosen = [k for k in kernels if not rule.pattern or re.search(rule.pattern, k.kernel)]
        users = [k for k in chosen if k.tensor_core_opcodes]
        if users:
            ops = ", ".join(users[0].tensor_core_opcodes[:3])
            return f"{_whom(entry)} {_names(users)}, which executes tensor-core instructions ({ops}): {rule.why}"
    return None


def _sass(rule: Rule, facts: BuildFacts, entries: tuple[str, ...]) -> str | None:
    named = getattr(rule, "kernels", "")
    for entry, kernels in _kernels_of(rule, facts, entries):
        chosen = [k for k in kernels if not named or re.search(named, k.kernel)]
        if any(k.sass is None for k in chosen):
            return None  # no cuobjdump here: the task process judges the kernels that ran
        if not any(re.match(rule.pattern, op) for k in chosen for op in k.sass or ()):
            return f"no kernel {_whom(entry)} ({_names(chosen)}) executes {shown(rule.pattern)} (SASS): {rule.why}"
    return None


def _no_sass(rule: Rule, facts: BuildFacts, entries: tuple[str, ...]) -> str | None:
    named = getattr(rule, "kernels", "")
    for entry, kernels in _kernels_of(rule, facts, entries):
        chosen = [k for k in kernels if not named or re.search(named, k.kernel)]
        for k in chosen:
            found = opcodes_matching(rule.pattern, k.sass)
            if found:
                name = k.kernel.split("(")[0]
                return f"{_whom(entry)} {name}, whose SASS has {', '.join(found[:3])}: {rule.why}"
    return None  # (without cuobjdump here, the task process judges the kernels that ran)


def _inline_ptx(rule: Rule, facts: BuildFacts, entries: tuple[str, ...]) -> str | None:
    for entry, kernels in _kernels_of(rule, facts, entries):
        if not any(re.search(rule.pattern, i) for k in kernels for i in k.inline_asm):
            have = sorted({i for k in kernels for i in k.inline_asm})
            return (
                f"no kernel {_whom(entry)} ({_names(kernels)}) has `{shown(rule.pattern)}` in an asm statement whose "
                f"result is used (its inline PTX: {', '.join(have) or 'none'}): {rule.why}"
            )
    return None


def _kernel_named(rule: Rule, facts: BuildFacts, entries: tuple[str, ...]) -> str | None:
    for entry, kernels in _kernels_of(rule, facts, entries):
        if not any(re.search(rule.pattern, k.kernel) for k in kernels):
            named = shown(rule.pattern)
            return f"no kernel {_whom(entry)} is named like `{named}` (there: {_names(kernels)}): {rule.why}"
    return None


_JUDGES: dict[str, Callable[[Rule, BuildFacts, tuple[str, ...]], str | None]] = {
    "no_libraries": _no_libraries,
    "no_library": _no_library,
    "shared_memory": _shared_memory,
    "barrier": _barrier,
    "calls": _calls,
    "calls_each_time": _calls,
    "never_calls": _never_calls,
    "graph_replay": _calls,
    "pinned_copies": _calls,
    "tensor_cores": _tensor_cores,
    "no_tensor_cores": _cuda_cores,
    "inline_ptx": _inline_ptx,
    "sass": _sass,
    "sass_reached": _sass,
    "no_sass": _no_sass,
    "kernel_named": _kernel_named,
}
