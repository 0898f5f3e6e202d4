"""The rules and not-started detection: on the source text before the build (`check_source`),
and on what the build compiled after it (`check_build`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from grader import paths
from grader.build import packages
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
from grader.tasks.spec import Rule, Task

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
    compiler."""
    rules = [r for r in task.rules if r.compiled]
    if not rules or any(_unstarted(p) for p in sources.values()):
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
    for rule in rules:
        message = _JUDGES[rule.kind](rule, build.facts)
        if message:
            return StaticOutcome(Verdict.RULE, message, [])
    return StaticOutcome(None, "", [])


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


def _no_libraries(rule: Rule, facts: BuildFacts) -> str | None:
    for header, where in facts.library_headers.items():
        library = packages.library_of_header(header, paths.ROOT)
        if where:
            return f"{where}: {_line_of(where)}brings in {_short(header)} ({library}): {rule.why}"
        return f"the build read {_short(header)} ({library}), a library header: {rule.why}"
    for header in facts.headers:  # a record without include lines (none found)
        library = packages.library_of_header(header, paths.ROOT)
        if library:
            return f"the build read {_short(header)} ({library}), a library header: {rule.why}"
    linked = [n for n in facts.needed or [] if packages.library_of_soname(n)]
    if linked:
        return f"the library links {', '.join(linked)}: {rule.why}"
    if facts.library_symbols:
        shown = ", ".join(facts.library_symbols[:3]) + (", ..." if len(facts.library_symbols) > 3 else "")
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


def _shared_memory(rule: Rule, facts: BuildFacts) -> str | None:
    found = _failing(rule, facts, lambda k: k.uses_shared_memory)
    if isinstance(found, str):
        return found or None
    k, more = found
    return (
        f"{k.source}: kernel `{k.kernel}` uses no shared memory{more}: ptxas gives it {k.smem_bytes} bytes of "
        f"shared memory and its code never reads or writes any (a __shared__ array that is never used is compiled "
        f"away): {rule.why}"
    )


def _barrier(rule: Rule, facts: BuildFacts) -> str | None:
    found = _failing(rule, facts, lambda k: k.has_barrier)
    if isinstance(found, str):
        return found or None
    k, more = found
    count = k.barriers if k.barriers is not None else "no"
    return (
        f"{k.source}: kernel `{k.kernel}` has no block-wide barrier{more}: ptxas reports {count} barriers for it "
        f"(a __syncthreads() the compiler can prove never runs is removed): {rule.why}"
    )


_JUDGES = {"no_libraries": _no_libraries, "shared_memory": _shared_memory, "barrier": _barrier}
