"""Builds task sources into shared libraries with nvcc, and records what the build compiled.

A build unit is one task's graded files (one or more `.cu`/`.cpp`) with the task's own nvcc
flags, libraries and header wheels. Each source is compiled on its own (`-c`), then the objects
are linked `-shared` into one library; whatever must be built is built in one ninja run, in
parallel, each step's output kept in the unit's log.

Outputs are named by a key over everything that goes into the build: every source (content and
path, since `__FILE__` is compiled in), course.h, the course's flags and the task's, the
libraries (where they were found, their versions), the header wheels (their versions), nvcc's
version and the architecture (sm_90a rather than sm_90 for a task built for the card's
architecture-specific target: `CudaTask.arch_specific`). A record beside each library (`.json`)
lists the headers the preprocessor read: those outside the toolkit, the system and installed
wheels (which the key covers by their versions) are stored with a hash of their content, so
editing a header the task includes rebuilds it, while a lookup of an unchanged task costs a few
hashes and one small read.

The record also keeps what the rules judge (grader/parent/static_checks.py): the headers that
belong to a library and the line of a graded file that brought each in, the shared libraries and
library symbols the .so needs, the symbols each object leaves undefined and, per C entry point,
the library calls and kernels its code reaches (grader/build/objects.py), and per kernel ptxas's
shared memory and barriers, what its PTX touches, its inline-asm instructions and its SASS
opcodes. The task process reads the same record to judge the kernels a call launched.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.metadata as md
import json
import os
import re
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from grader import paths, toolchain
from grader.build import objects, packages, phases
from grader.build.objects import EntryReach
from grader.build.ptxas import PtxFacts, demangle, parse_entries, parse_ptx
from grader.records import KernelResources, Verdict
from grader.tasks.rules import SASS_RULES

Confine = Callable[[Path], list[str]]  # a unit's folder -> the command prefix that sandboxes a step

if TYPE_CHECKING:
    from grader.tasks.python import PythonTask
    from grader.tasks.spec import CudaTask

# Every compile. Never -G: device debug code is an order of magnitude slower and every task is timed.
FLAGS = ["-O3", "-lineinfo", "-std=c++17", "-Xcompiler", "-fPIC", "-Xptxas", "-v"]
LINK_FLAGS = ["-shared"]
# what a task's nvcc_flags may not say: the grader decides debug level, outputs and build steps
REFUSED_TASK_FLAGS = ("-G", "--device-debug", "-o", "--output-file", "-c", "--compile", "-shared", "--shared")
COMPILED = (".cu", ".cpp", ".cc", ".cxx", ".c")  # a task's other files (headers) are hashed, not compiled
RECORD_FORMAT = 3  # what a build record holds and means: bump it when that changes, and stale records rebuild


@dataclass(frozen=True)
class BuildUnit:
    """One shared library: which files, built how, and where its outputs go
    (`.build/<group>/<stem>.<key>.so`, with `.log` and `.json` beside it)."""

    name: str  # for messages: the task id, or the file for a lone source
    sources: tuple[Path, ...]
    group: str  # the folder under .build/
    stem: str  # the outputs' names start so: "03_saxpy.sol"
    flags: tuple[str, ...] = ()
    libraries: tuple[str, ...] = ()
    include_packages: tuple[str, ...] = ()
    include_dirs: tuple[Path, ...] = ()
    # False: the build says only whether it compiles, without the SASS and object facts the rules
    # read (seconds a build: the course's check that every variant compiles builds 170 of them)
    facts: bool = True
    sass: bool = True  # the kernels' SASS too (cuobjdump, seconds): only rules on instructions read it
    # True: whether the code compiles, and nothing is built: each .cu through nvcc's front end to PTX
    # alone (`--ptx`: the front end parses and type-checks the host code too, templates instantiated,
    # but cudafe++, the host compile, ptxas and the link never run), each .cpp through the host
    # compiler's syntax check. A third of a build's time or less: the course's check that every broken
    # variant compiles makes 170 of them. The product is a stamp (`.ok`), not a library.
    check_only: bool = False
    # True: built for the architecture-specific target of the card's (sm_90a for sm_90), whose code
    # runs on that compute capability alone (CudaTask.arch_specific)
    arch_specific: bool = False

    @classmethod
    def for_task(cls, task: CudaTask | PythonTask, sources: Mapping[str, Path], variant: str) -> BuildUnit:
        """The task's unit: all its files in the order the spec lists them, the lab folder on the
        include path (so a variant graded from elsewhere finds the lab's headers), the spec's flags,
        libraries and header wheels. `variant` (student, solution, variant) keeps caches apart.
        A PythonTask that builds a library (PythonTask.builds_library) gives its C++/CUDA files
        alone, with its own nvcc_flags."""
        rels = list(getattr(task, "library_sources", task.sources))
        files = tuple(sources[rel] for rel in rels)
        tag = {"solution": "sol", "student": "student"}.get(variant, "variant")
        return cls(
            name=task.task_id,
            sources=files,
            group=task.lab,
            stem=f"{sources[rels[0]].stem}.{tag}",
            flags=tuple(task.nvcc_flags),
            libraries=tuple(getattr(task, "libraries", ())),
            include_packages=tuple(getattr(task, "include_packages", ())),
            include_dirs=(task.lab_dir(),),
            sass=any(getattr(r, "kind", "") in SASS_RULES for r in task.rules),
            arch_specific=getattr(task, "arch_specific", False),
        )

    @classmethod
    def single(cls, source: Path) -> BuildUnit:
        """One file on its own with the course's flags (every .cu compiles: tests/test_compile_all.py)."""
        solution = source.parent.name == "solutions"
        group = source.parent.parent.name if solution else source.parent.name
        return cls(paths.rel(source), (source,), group, f"{source.stem}.{'sol' if solution else 'student'}")


@dataclass
class KernelFacts:
    """One kernel as compiled, for the rules: ptxas's static shared memory and barriers, and
    whether its PTX (with the functions it calls) touches shared memory or has a barrier."""

    kernel: str  # demangled, as KernelResources names it
    source: str  # the graded file it was compiled from (repo-relative)
    smem_bytes: int
    barriers: int | None  # None: this ptxas does not report barriers
    ptx_shared: bool
    ptx_barrier: bool
    mangled: str = ""
    inline_asm: list[str] = field(default_factory=list)  # "fma.rn.f32", "mov.u32 %laneid" (its callees' too)
    sass: list[str] | None = None  # distinct SASS opcodes; None: cuobjdump was not found

    @property
    def tensor_core_opcodes(self) -> list[str]:
        return objects.tensor_core_opcodes(self.sass or ())

    @property
    def uses_shared_memory(self) -> bool:
        # ptxas reports static shared memory only; dynamic (extern __shared__) shows in the PTX
        return self.smem_bytes > 0 or self.ptx_shared

    @property
    def has_barrier(self) -> bool:
        return bool(self.barriers) or self.ptx_barrier


@dataclass
class BuildFacts:
    """What a successful build compiled and links, as the rules judge it."""

    headers: list[str] = field(default_factory=list)  # every header the preprocessor read
    # a header that belongs to a library -> "file:line" of the graded file's #include that led to it
    library_headers: dict[str, str] = field(default_factory=dict)
    needed: list[str] | None = None  # the .so's DT_NEEDED; None: readelf is missing
    library_symbols: list[str] | None = None  # undefined symbols of a CUDA library (cublas*, cudnn*, ...)
    kernels: list[KernelFacts] = field(default_factory=list)
    # per graded source, the symbols its object leaves undefined; None: readelf is missing
    undefined: dict[str, list[str]] | None = None
    # per C entry point, the external symbols and the kernels its code reaches
    reach: dict[str, EntryReach] | None = None
    # per graded source, each run-time symbol lookup (dlsym ...) -> the functions that refer to it
    lookups: dict[str, dict[str, list[str]]] | None = None

    def kernel(self, mangled_or_name: str) -> KernelFacts | None:
        """The compiled kernel of this name (mangled, or demangled as a profiler shows it)."""
        for k in self.kernels:
            if mangled_or_name in (k.mangled, k.kernel) or k.kernel.split("(")[0] == mangled_or_name:
                return k
        return None


@dataclass
class BuildResult:
    source: Path  # the unit's first file
    ok: bool
    lib: Path | None
    log: str = ""
    error: str = ""  # nvcc's first error, file:line first; or why the build could not be tried
    kernels: list[KernelResources] = field(default_factory=list)
    cached: bool = False
    seconds: float = 0.0
    # what a failed build means: the student's compile error, a machine that lacks something
    # (ENVIRONMENT), or a task spec the grader refuses (GRADER_ERROR)
    verdict: Verdict = Verdict.COMPILE_ERROR
    unit: BuildUnit | None = None
    facts: BuildFacts | None = None
    arch: str = ""  # the target it was built for (sm_90, sm_90a); "" where no build was tried


def first_error(log: str) -> str:
    """The first compiler error with its location and the two lines nvcc prints under it."""
    lines = log.splitlines()
    for line in lines:
        if re.search(r"\berror\b", line, re.I) and not line.startswith("ptxas info"):
            m = re.match(r"(?P<file>[^\s(]+)\((?P<line>\d+)\): (?P<msg>.*)", line)
            if not m:
                return line.strip()
            where = Path(m["file"])
            head = f"{paths.rel(where)}:{m['line']}: {m['msg']}"
            try:  # the student's own line reads better than nvcc's preprocessed echo of it
                code = where.read_text().splitlines()[int(m["line"]) - 1]
                return f"{head}\n    {code.strip()}"
            except (OSError, IndexError):
                return head
    return lines[-1] if lines else "nvcc failed without output"


# a failed build whose log says one of these failed for the machine's sake (or the task spec's:
# nvcc refusing a flag), not for the student's code
_ENVIRONMENT_FAILURES = re.compile(
    r"unsupported (GNU|clang|Microsoft Visual Studio) version"
    r"|^nvcc fatal\s*:"
    r"|^(/bin/)?sh: \d+: \S+: not found$"
    r"|cannot find -l\S+"
    r"|ld(\.\w+)?: error: cannot open /\S+\.so\S*: No such file"  # a system library the linker was told of
    r"|ptxas fatal\s*:\s*Value '\w+' is not defined",
    re.M,
)


def environment_problem(log: str) -> str | None:
    m = _ENVIRONMENT_FAILURES.search(log)
    if m is None:
        return None
    end = log.find("\n", m.start())
    line = log[log.rfind("\n", 0, m.start()) + 1 : end if end >= 0 else len(log)]
    return f"the CUDA toolchain on this machine failed, not the code: {line.strip()}"


# --- the toolkit ----------------------------------------------------------------------------


@functools.cache
def _nvcc_identity(nvcc: Path) -> str:
    """nvcc's full version (V13.0.88 and its build), for the key: a patch release rebuilds."""
    out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True).stdout
    return " ".join(line for line in out.splitlines() if "release" in line or line.startswith("Build"))


@dataclass(frozen=True)
class Toolkit:
    root: Path  # the toolkit's top folder: headers below it are covered by its version
    include_dirs: tuple[Path, ...]
    lib_dirs: tuple[Path, ...]


@functools.cache
def _toolkit(nvcc: Path) -> Toolkit:
    """Where nvcc itself looks for headers and libraries (its dry run prints nvcc.profile's values):
    nvcc may be a wrapper script, so its own location says nothing."""
    out = subprocess.run(
        [str(nvcc), "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull], capture_output=True, text=True
    )
    text = out.stdout + out.stderr
    values = dict(re.findall(r"^#\$ (\w+)=(.*)$", text, re.M))

    def folders(name: str, flag: str) -> tuple[Path, ...]:
        found = re.findall(rf'{flag}"?\s*"?([^"\s]+)', values.get(name, ""))
        return tuple(Path(os.path.normpath(f)) for f in found)

    root = Path(os.path.normpath(values.get("TOP", str(nvcc.resolve().parent.parent))))
    includes = folders("INCLUDES", "-I") + folders("SYSTEM_INCLUDES", "-isystem")
    libs = tuple(d for d in folders("LIBRARIES", "-L") if d.name != "stubs")
    return Toolkit(root, includes or (root / "include",), libs or (root / "lib64",))


# --- one unit: what goes in, and the key over it -------------------------------------------


@dataclass
class _Plan:
    unit: BuildUnit
    arch: str  # the target: the run's, or its architecture-specific form for an arch_specific unit
    key: str
    base: Path  # outputs: base.so, base.log, base.json; base.work<pid>/ while building
    compile_extra: list[str]  # -I for header wheels and libraries, the task's flags
    link_extra: list[str]  # the task's flags, -L/-l/rpath per library
    external: list[Path]  # header folders whose content the key covers by a version

    @property
    def lib(self) -> Path:
        return self.base.with_name(self.base.name + (".ok" if self.unit.check_only else ".so"))

    @property
    def record(self) -> Path:
        return self.base.with_name(self.base.name + ".json")

    @property
    def log(self) -> Path:
        return self.base.with_name(self.base.name + ".log")

    @property
    def work(self) -> Path:
        # per process: two graders building the same unit at once never share intermediates
        return self.base.with_name(f"{self.base.name}.work{os.getpid()}")


class _UnitProblem(Exception):  # noqa: N818 - carries a verdict, like CheckFailure
    def __init__(self, verdict: Verdict, message: str) -> None:
        super().__init__(message)
        self.verdict = verdict
        self.message = message


def _keyed_path(path: Path) -> str:
    """A source or include folder as the build key names it: relative to the checkout when inside
    it, so that a copy of the checkout (a student release made from it with its .build, a clone
    moved elsewhere) finds the builds of the same files at the same places. The headers such a
    build read are still checked, each at the path the build recorded, before it is reused."""
    full = Path(os.path.abspath(path))
    try:
        return f"<checkout>/{full.relative_to(paths.ROOT)}"
    except ValueError:
        return str(full)


def _plan(unit: BuildUnit, arch: str, identity: str, nvcc: Path) -> _Plan:
    refused = [f for f in unit.flags if f in REFUSED_TASK_FLAGS or f.startswith(("-G", "--device-debug"))]
    if refused:
        raise _UnitProblem(
            Verdict.GRADER_ERROR,
            f"task spec error: nvcc_flags may not contain {', '.join(refused)} (the grader sets those)",
        )
    unknown = [n for n in unit.libraries if n not in packages.LINK_LIBRARIES]
    if unknown:
        known = ", ".join(packages.LINK_LIBRARIES)
        raise _UnitProblem(Verdict.GRADER_ERROR, f"task spec error: unknown library {unknown[0]!r} (known: {known})")
    compile_extra: list[str] = [f"-I{d}" for d in unit.include_dirs]
    link_extra: list[str] = []
    external: list[Path] = []
    material: list[object] = [
        FLAGS,
        objects.SECTION_FLAGS,
        LINK_FLAGS,
        list(unit.flags),
        arch,
        identity,
        [_keyed_path(d) for d in unit.include_dirs],
    ]
    for dist in unit.include_packages:
        if dist not in packages.HEADER_PACKAGES:
            known = ", ".join(packages.HEADER_PACKAGES)
            raise _UnitProblem(
                Verdict.GRADER_ERROR, f"task spec error: unknown header package {dist!r} (known: {known})"
            )
        try:
            folder = packages.header_dir(dist)
        except toolchain.ToolchainError as e:
            raise _UnitProblem(Verdict.ENVIRONMENT, str(e)) from None
        compile_extra.append(f"-I{folder}")
        external.append(folder)
        material.append([dist, md.version(dist), str(folder)])
    if unit.libraries:
        tk = _toolkit(nvcc)
        for name in unit.libraries:
            try:
                found = packages.find_library(name, tk.lib_dirs, tk.include_dirs)
            except ValueError as e:
                raise _UnitProblem(Verdict.GRADER_ERROR, f"task spec error: {e}") from None
            except toolchain.ToolchainError as e:
                raise _UnitProblem(Verdict.ENVIRONMENT, str(e)) from None
            if found.include_dir is not None and f"-I{found.include_dir}" not in compile_extra:
                compile_extra.append(f"-I{found.include_dir}")
                external.append(found.include_dir)
            link_extra += found.link_flags
            material.append([name, str(found.lib_dir), found.file, found.version])
    compile_extra += unit.flags
    link_extra = [*unit.flags, *link_extra]

    material.append(["facts", unit.facts, unit.sass, unit.check_only])
    h = hashlib.sha256(json.dumps(material).encode())
    for src in unit.sources:
        h.update(_keyed_path(src).encode() + b"\0")
        try:
            h.update(src.read_bytes())
        except OSError as e:
            raise _UnitProblem(Verdict.COMPILE_ERROR, f"{paths.rel(src)} cannot be read: {e.strerror}") from None
    for header in sorted(paths.INCLUDE.glob("*.h")):
        h.update(header.read_bytes())
    key = h.hexdigest()[:16]
    base = paths.BUILD / unit.group / f"{unit.stem}.{key}"
    return _Plan(unit, arch, key, base, compile_extra, link_extra, external)


def _hash_file(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    except OSError:
        return None


def _cached(plan: _Plan) -> BuildResult | None:
    """The unit's earlier build, if its library and record are there and no header it read changed."""
    if not plan.lib.exists():
        return None
    try:
        record = json.loads(plan.record.read_text())
    except (OSError, ValueError):
        return None
    if record.get("format") != RECORD_FORMAT or record.get("key") != plan.key:
        return None
    try:
        if any(_hash_file(p) != digest for p, digest in record["headers"].items() if digest is not None):
            return None
        facts = _facts_from(record)
        kernels = [KernelResources(**k) for k in record["kernels_resources"]]
    except (KeyError, TypeError, AttributeError):  # a record this grader does not read: build again
        return None
    log = plan.log.read_text() if plan.log.exists() else ""
    return BuildResult(
        plan.unit.sources[0],
        True,
        plan.lib,
        log,
        kernels=kernels,
        cached=True,
        unit=plan.unit,
        facts=facts,
        arch=plan.arch,
    )


def _failed_before(plan: _Plan) -> BuildResult | None:
    """The unit's last build, when it failed on a compile error and nothing it may have read changed
    since (its log, written when it failed, is newer than the course's headers and every header
    in its include folders; the key covers the rest). The head start's build of a file with an
    error is then the grader's verdict too, not a second nvcc run that fails the same way."""
    if plan.lib.exists() or not plan.log.exists():
        return None
    try:
        failed_at = plan.log.stat().st_mtime_ns
        folders = [paths.INCLUDE, *plan.unit.include_dirs]
        headers = [h for d in folders for pattern in ("*.h", "*.cuh", "*.hpp") for h in Path(d).rglob(pattern)]
        if any(h.stat().st_mtime_ns >= failed_at for h in headers):
            return None
        log = plan.log.read_text(errors="replace")
    except OSError:
        return None
    if environment_problem(log) or not log.strip():  # the machine's failure, not the code's: try again
        return None
    return _failure(plan, log)


def _failure(plan: _Plan, log: str) -> BuildResult:
    problem = environment_problem(log)
    return BuildResult(
        plan.unit.sources[0],
        False,
        None,
        log,
        error=problem or first_error(log),
        verdict=Verdict.ENVIRONMENT if problem else Verdict.COMPILE_ERROR,
        unit=plan.unit,
        arch=plan.arch,
    )


def _facts_from(record: dict) -> BuildFacts:
    reach = record["reach"]
    return BuildFacts(
        headers=list(record["headers"]),
        library_headers=dict(record["library_headers"]),
        needed=record["needed"],
        library_symbols=record["library_symbols"],
        kernels=[KernelFacts(**k) for k in record["kernels"]],
        undefined=record["undefined"],
        reach=None if reach is None else {e: EntryReach(**r) for e, r in reach.items()},
        lookups=record["lookups"],
    )


def read_record(lib: Path) -> BuildFacts | None:
    """The facts recorded beside a built library (for the task process, which judges the
    kernels a call launched); None when there is no record this grader reads."""
    try:
        record = json.loads(lib.with_suffix(".json").read_text())
        if record.get("format") != RECORD_FORMAT:
            return None
        return _facts_from(record)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


# --- building ---------------------------------------------------------------------------------


def build_all(
    units: Sequence[BuildUnit | Path],
    arch: str | None = None,
    jobs: int | None = None,
    confine: Confine | None = None,
) -> dict[BuildUnit | Path, BuildResult]:
    """Builds every unit not built before and returns a result per unit (a bare Path is one file
    on its own, keyed by that Path). A unit that cannot be tried here (a missing library or header
    wheel, a refused flag) gets a failed result with its verdict; no nvcc at all raises
    ToolchainError, since no unit can be built. `confine`, given a unit's folder, returns the
    command that runs a build step in the sandbox (grading submissions)."""
    arch = arch or toolchain.target_arch()
    nvcc = toolchain.find_nvcc()  # every call: a machine without nvcc must never look built
    identity = _nvcc_identity(nvcc)
    results: dict[BuildUnit | Path, BuildResult] = {}
    todo: dict[Path, tuple[_Plan, list[BuildUnit | Path]]] = {}
    for item in units:
        unit = BuildUnit.single(item) if isinstance(item, Path) else item
        try:
            plan = _plan(unit, toolchain.specific_arch(arch) if unit.arch_specific else arch, identity, nvcc)
        except _UnitProblem as e:
            results[item] = BuildResult(unit.sources[0], False, None, error=e.message, verdict=e.verdict, unit=unit)
            continue
        if plan.base in todo:
            todo[plan.base][1].append(item)
        elif (hit := _cached(plan)) is not None:
            results[item] = hit
        else:
            todo[plan.base] = (plan, [item])
    if not todo:
        return results
    # another process may be building the same units (make test-labN's head start, begun before
    # pytest: grader/build/head_start.py; make check's workers): wait for it, then take what it built
    with _locked(sorted(todo)):
        for base, (plan, items) in list(todo.items()):
            if (hit := _cached(plan) or _failed_before(plan)) is not None:
                results.update(dict.fromkeys(items, hit))
                del todo[base]
        if todo:
            start = time.perf_counter()
            _run_builds([plan for plan, _ in todo.values()], jobs, nvcc, confine)
            elapsed = time.perf_counter() - start
            tk = _toolkit(nvcc)
            for plan, items in todo.values():
                result = _finish(plan, tk)
                result.seconds = elapsed
                results.update(dict.fromkeys(items, result))
    return results


@contextlib.contextmanager
def _locked(bases: Sequence[Path]) -> Iterator[None]:
    """An exclusive lock per unit (`<base>.lock`, flock: released when the process ends, however it
    ends), taken in one order by every process so that two never wait on each other."""
    with contextlib.ExitStack() as stack:
        for base in bases:
            base.parent.mkdir(parents=True, exist_ok=True)
            handle = stack.enter_context(open(base.with_name(base.name + ".lock"), "a"))
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _compile_command(plan: _Plan, i: int, src: Path, nvcc: Path) -> list[str]:
    work = plan.work
    if plan.unit.check_only:
        # nvcc --ptx leaves nothing for a .cpp (no device code), so a .cpp gets the syntax check
        mode = ["--ptx", "-o", str(work / f"{i}.ptx")] if src.suffix == ".cu" else ["-c", "-Xcompiler", "-fsyntax-only"]
        return [
            str(nvcc),
            *FLAGS,
            *toolchain.gencode_flags(plan.arch, sass=False),
            f"-I{paths.INCLUDE}",
            *plan.compile_extra,
            "-MD",
            "-MF",
            str(work / f"{i}.d"),
            *mode,
            os.path.abspath(src),
        ]
    return [
        str(nvcc),
        *FLAGS,
        *objects.SECTION_FLAGS,  # one section per function: its relocations say what it calls
        *toolchain.gencode_flags(plan.arch),
        f"-I{paths.INCLUDE}",
        *plan.compile_extra,
        # the headers this compile read, for the cache and the library rule; the PTX and the
        # preprocessed source, for the rules (read, then deleted with the work folder)
        "-MD",
        "-MF",
        str(work / f"{i}.d"),
        "--keep",
        "--keep-dir",
        str(work / str(i)),
        "-c",
        os.path.abspath(src),
        "-o",
        str(work / f"{i}.o"),
    ]


def _link_command(plan: _Plan, objects: list[Path], nvcc: Path) -> list[str]:
    return [
        str(nvcc),
        *FLAGS,
        *LINK_FLAGS,
        *toolchain.gencode_flags(plan.arch),
        *[str(o) for o in objects],
        "-o",
        str(plan.work / "lib.so"),
        *plan.link_extra,
    ]


def _compiled(plan: _Plan) -> list[tuple[int, Path]]:
    return [(i, s) for i, s in enumerate(plan.unit.sources) if s.suffix in COMPILED]


def _run_builds(plans: list[_Plan], jobs: int | None, nvcc: Path, confine: Confine | None = None) -> None:
    steps: list[tuple[list[Path], list[Path], str]] = []  # (outputs, inputs, shell command)
    for plan in plans:
        shutil.rmtree(plan.work, ignore_errors=True)
        plan.work.mkdir(parents=True)
        for i, _src in _compiled(plan):
            (plan.work / str(i)).mkdir()
        # untrusted sources: each step in the sandbox, which may write only this unit's folder
        prefix = shlex.join(confine(plan.work)) + " /bin/sh -c " if confine else ""

        def step(command: list[str], log: Path, prefix: str = prefix) -> str:
            inner = f"{shlex.join(command)} > {shlex.quote(str(log))} 2>&1"
            return prefix + shlex.quote(inner) if prefix else inner

        objects = []
        for i, src in _compiled(plan):
            obj = plan.work / f"{i}.o"
            compile_command = _compile_command(plan, i, src, nvcc)
            if not plan.unit.check_only and (
                phased := phases.script(compile_command, src, obj, plan.work / f"{i}.d", plan.work / str(i))
            ):
                (plan.work / f"{i}.sh").write_text(phased)
                compile_command = ["/bin/sh", str(plan.work / f"{i}.sh")]
            command = step(compile_command, plan.work / f"{i}.log")
            if plan.unit.check_only:  # the stamp says the check passed: --ptx and -fsyntax-only leave no .o
                command += f" && touch {shlex.quote(str(obj))}"
            steps.append(([obj], [src], command))
            objects.append(obj)
        if plan.unit.check_only:
            steps.append(([plan.work / "lib.so"], objects, f"touch {shlex.quote(str(plan.work / 'lib.so'))}"))
        else:
            link = step(_link_command(plan, objects, nvcc), plan.work / "link.log")
            steps.append(([plan.work / "lib.so"], objects, link))
    ninja = find_ninja()
    if ninja is None or len(steps) <= 2:
        for _outputs, inputs, cmd in steps:  # in order: a unit's objects come before its link
            if all(p.exists() for p in inputs):
                subprocess.run(["/bin/sh", "-c", cmd], cwd=paths.BUILD, check=False)
        return
    # per process and thread: two threads of one process (a lab's compiler building its kernels in
    # the background) may run builds of different units at once
    build_file = paths.BUILD / f"build-{os.getpid()}-{threading.get_native_id()}.ninja"
    lines = ["rule sh", "  command = /bin/sh -c $cmd", "  description = nvcc $out", ""]
    for outputs, inputs, cmd in steps:
        outs = " ".join(_ninja_escape(str(p)) for p in outputs)
        ins = " ".join(_ninja_escape(str(p)) for p in inputs)
        lines.append(f"build {outs}: sh {ins}")
        lines.append(f"  cmd = {shlex.quote(cmd).replace('$', '$$')}")
    build_file.parent.mkdir(parents=True, exist_ok=True)
    build_file.write_text("\n".join(lines) + "\n")
    try:
        subprocess.run(
            [ninja, "-f", str(build_file), "-k", "0", "-j", str(jobs or os.cpu_count() or 2)],
            cwd=paths.BUILD,
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        build_file.unlink(missing_ok=True)


def find_ninja() -> str | None:
    """ninja: on PATH, or the PyPI package's binary (the builds here, and cpp_extension's)."""
    found = shutil.which("ninja")
    if found:
        return found
    try:
        import ninja  # the PyPI package ships the binary

        candidate = Path(ninja.BIN_DIR) / "ninja"
        return str(candidate) if candidate.exists() else None
    except (ImportError, AttributeError):
        return None


def _ninja_escape(text: str) -> str:
    return text.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def _finish(plan: _Plan, tk: Toolkit) -> BuildResult:
    """After ninja: the unit's log, and for a success its record (written before the library is
    moved into place, so a library is never found without one); the work folder goes."""
    work = plan.work
    logs = [work / f"{i}.log" for i, _ in _compiled(plan)] + [work / "link.log"]
    parts = [f.read_text(errors="replace") for f in logs if f.exists()]
    log = "\n".join(p for p in parts if p)
    # whole or not at all: two processes (make check's pytest-xdist workers) may build the same
    # unit at once, and a task process must never read the other's record half written
    paths.write_atomically(plan.log, log)
    unit = plan.unit
    ok = (work / "lib.so").exists()
    try:
        if not ok:
            return _failure(plan, log)
        record = _record(plan, tk, log)
        paths.write_atomically(plan.record, json.dumps(record))
        os.replace(work / "lib.so", plan.lib)
        return BuildResult(
            unit.sources[0],
            True,
            plan.lib,
            log,
            kernels=[KernelResources(**k) for k in record["kernels_resources"]],
            unit=unit,
            facts=_facts_from(record),
            arch=plan.arch,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


# --- the record: what the build read, compiled and links --------------------------------------


def _record(plan: _Plan, tk: Toolkit, log: str) -> dict:
    work = plan.work
    graded = {os.path.normpath(os.path.abspath(s)) for s in plan.unit.sources}
    headers: list[str] = []
    for i, _ in _compiled(plan):
        for h in _dep_file(work / f"{i}.d"):
            if h not in graded and h not in headers:
                headers.append(h)
    untracked = [str(tk.root), *map(str, tk.include_dirs), *map(str, plan.external), *_SYSTEM_HEADER_ROOTS]
    tracked = {h: None if _covered(h, untracked) else _hash_file(h) for h in headers}
    library = [h for h in headers if packages.library_of_header(h, paths.ROOT)]
    sites = _include_sites(plan, set(library), graded | {h for h, d in tracked.items() if d}) if library else {}

    kernels: list[dict] = []
    resources: list[dict] = []
    # all files' PTX at once: with -rdc a kernel may call a function another file defines
    ptx = parse_ptx("\n".join(f.read_text(errors="replace") for f in sorted(work.glob("*/*.ptx"))))
    opcodes = objects.sass(work / "lib.so") if plan.unit.facts and plan.unit.sass else None
    for i, src in _compiled(plan):
        log_file = work / f"{i}.log"
        entries = parse_entries(log_file.read_text(errors="replace")) if log_file.exists() else []
        names = demangle([e.mangled for e in entries])
        for e, name in zip(entries, names, strict=True):
            e.resources.kernel = name
            facts = ptx.get(e.mangled, PtxFacts(False, False))
            resources.append(asdict(e.resources))
            kernels.append(
                asdict(
                    KernelFacts(
                        name,
                        paths.rel(src),
                        e.resources.smem_bytes,
                        e.barriers,
                        facts.shared,
                        facts.barrier,
                        mangled=e.mangled,
                        inline_asm=list(facts.inline_asm),
                        sass=None if opcodes is None else opcodes.get(e.mangled, []),
                    )
                )
            )
    needed, symbols = ([], []) if plan.unit.check_only else _dynamic(work / "lib.so")
    own = [(paths.rel(src), work / f"{i}.o") for i, src in _compiled(plan)]
    found = objects.object_facts(own, {k["mangled"] for k in kernels}) if plan.unit.facts else None
    return {
        "format": RECORD_FORMAT,
        "key": plan.key,
        "unit": plan.unit.name,
        "headers": tracked,
        "library_headers": sites,
        "needed": needed,
        "library_symbols": symbols,
        "kernels": kernels,
        "kernels_resources": resources,
        "undefined": None if found is None else found.undefined,
        "reach": None if found is None else {e: asdict(r) for e, r in found.reach.items()},
        "lookups": None if found is None else found.lookups,
    }


# the host compiler's and the distribution's headers: they change with the system, not with a task
_SYSTEM_HEADER_ROOTS = ("/usr/include", "/usr/lib", "/usr/local/include", "/opt/rh")


def _covered(header: str, roots: list[str]) -> bool:
    """Whether the key already covers this header (toolkit, system, a wheel by its version)."""
    parts = Path(header).parts
    if "site-packages" in parts or "dist-packages" in parts:
        return True
    return any(header.startswith(r.rstrip("/") + "/") for r in roots)


def _dep_file(path: Path) -> list[str]:
    """The prerequisites of every rule of a make-style dependency file (-MD -MF): normalized
    absolute paths, each once. nvcc writes one rule; a build of nvcc's phases side by side
    (grader/build/phases.py) two, one per preprocess."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    tokens = [t.replace("\\ ", " ") for t in re.split(r"(?<!\\)\s+", text.replace("\\\n", " ")) if t]
    out: dict[str, None] = {}
    in_rule = False
    for k, t in enumerate(tokens):
        if t.endswith(":") or (k + 1 < len(tokens) and tokens[k + 1] == ":"):
            in_rule = in_rule or t.endswith(":")  # a target ("obj:" or "obj :"), not a prerequisite
            continue
        if in_rule:
            out[os.path.normpath(os.path.join(str(paths.BUILD), t.replace("$$", "$")))] = None
    return list(out)


_MARKER = re.compile(r'^# (\d+) "((?:[^"\\]|\\.)*)"((?: \d+)*)[ \t]*$', re.M)


def _include_sites(plan: _Plan, wanted: set[str], own: set[str]) -> dict[str, str]:
    """For each library header: "file:line" of the #include in the task's own files (the graded
    sources, or a header of theirs) that brought it in, read from the preprocessed sources'
    line markers. Only the headers such a line includes directly are kept (the rest follow from
    them); the first library header is kept in any case, with no line if none was found."""
    sites: dict[str, str] = {}
    first: str | None = None
    for i, _ in _compiled(plan):
        keep = plan.work / str(i)
        for ii in sorted(keep.glob("*.ii"), key=lambda p: (".cpp4." not in p.name, p.name)):
            text = ii.read_text(errors="replace")
            stack: list[list] = []  # [file, line number of the text at offset, offset]
            for m in _MARKER.finditer(text):
                line, name, flags = int(m[1]), m[2].replace("\\\\", "\\"), m[3].split()
                file = os.path.normpath(name) if name.startswith("/") else name
                after = m.end() + 1
                if "1" in flags and stack:
                    top = stack[-1]
                    here = top[1] + text.count("\n", top[2], m.start())
                    top[1], top[2] = here, m.start()
                    if file in wanted:
                        first = first or file
                        if top[0] in own and file not in sites:
                            sites[file] = f"{paths.rel(Path(top[0]))}:{here}"
                    stack.append([file, line, after])
                elif "2" in flags:
                    while len(stack) > 1 and stack[-1][0] != file:
                        stack.pop()
                    stack[-1:] = [[file, line, after]]
                elif stack:
                    stack[-1] = [file, line, after]
                else:
                    stack.append([file, line, after])
    if not sites and wanted:
        sites[first or sorted(wanted)[0]] = ""
    return sites


def _dynamic(lib: Path) -> tuple[list[str] | None, list[str] | None]:
    """The shared libraries the .so needs, and the CUDA library symbols it leaves undefined."""
    readelf = shutil.which("readelf")
    if readelf is None:
        return None, None
    out = subprocess.run([readelf, "-W", "-d", "--dyn-syms", str(lib)], capture_output=True, text=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)
    undefined = re.findall(r"^\s*\d+:\s+\S+\s+\d+\s+\w+\s+\w+\s+\w+\s+UND\s+([^\s@]+)", out, re.M)
    return needed, sorted({s for s in undefined if packages.library_of_symbol(s)})[:50]
