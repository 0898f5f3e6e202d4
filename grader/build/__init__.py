"""Building CUDA code with the grader's nvcc build: per-task units in the grading process
(nvcc.py), and `shared_library` for code outside the grader (lab 4's and lab 5's compilers build
their kernels at run time through it, and share its cache, flags and error messages)."""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

# Set in a Python task's process to the folder its packages were staged in, a new one for every
# grading run (grader/child/pytests.py): sources found there are built from a settled copy.
STAGE_ENV = "GRADER_STAGE_DIR"
SETTLED_SUFFIXES = (".cu", ".cuh", ".cpp", ".h", ".hpp")


class BuildError(Exception):
    """A library that could not be built: no CUDA toolkit here, or a compile error (nvcc's first)."""


def cuda_error_string(rc: int) -> str:
    """`invalid argument (cudaError 1)`: the runtime's words for a cudaError_t that an entry point of
    such a library returned (through cuda-python), or its number alone where they are not known."""
    try:
        from cuda.bindings import runtime as cudart

        answer = cudart.cudaGetErrorString(cudart.cudaError_t(rc))
        text = answer[-1] if isinstance(answer, tuple) else answer
        text = text.decode() if isinstance(text, bytes) else str(text)
        return f"{text} (cudaError {rc})"
    except Exception:  # no cuda-python, or a number it does not know: the number will do
        return f"cudaError {rc}"


def shared_library(
    name: str,
    sources: Sequence[Path],
    *,
    group: str,
    stem: str,
    include_dirs: Sequence[Path] = (),
    split_compile: bool = False,
    libraries: Sequence[str] = (),
) -> Path:
    """`sources` compiled with the course's flags and linked into one shared library under
    `.build/<group>/`, its name starting with `stem`; the library's path. Built once per set of
    inputs (sources, headers, flags, toolkit): later calls, in any process, find it built.
    `name` says what is built in error messages. Raises BuildError.

    `split_compile`: nvcc spreads each source's optimizer and ptxas work over every core (see
    split_compile_flags), for a library of a few sources that each instantiate many kernels.
    `libraries`: the CUDA libraries it links, named as a CudaTask's `libraries` are ("cublasLt"),
    found the same way (grader/build/packages.py): lab 7's training step builds task 03's cuBLASLt
    file into its library."""
    from grader import toolchain
    from grader.build.nvcc import BuildUnit, build_all

    staged = _staged_sources(sources, include_dirs)
    if staged is not None:
        stage, settled = staged
        sources = [_moved(s, stage, settled) for s in sources]
        include_dirs = [_moved(d, stage, settled) for d in include_dirs]
    try:
        flags = split_compile_flags() if split_compile else ()
        # nothing reads rules' facts from these libraries: leave out the SASS and object scans
        unit = BuildUnit(
            name=name,
            sources=tuple(sources),
            group=group,
            stem=stem,
            flags=flags,
            libraries=tuple(libraries),
            include_dirs=tuple(include_dirs),
            facts=False,
            sass=False,
        )
        result = build_all([unit])[unit]
    except toolchain.ToolchainError as e:
        raise BuildError(f"cannot build {name}: {e}") from None
    if not result.ok or result.lib is None:
        files = ", ".join(s.name for s in sources)
        error = result.error if staged is None else result.error.replace(str(staged[1]), str(staged[0]))
        raise BuildError(f"building {name} ({files}) failed: {error}")
    return result.lib


def _staged_sources(sources: Sequence[Path], include_dirs: Sequence[Path]) -> tuple[Path, Path] | None:
    """(stage, settled copy) for sources in the grading run's stage folder (STAGE_ENV), else None.

    The build's key names each source by its path (relative includes and line info depend on it),
    and the grader stages a Python task's packages in a new folder for every run: built from there,
    the same kernels would be compiled again at every grading run (lab 4's kiln kernels: 10 s on two
    cores). So the C, C++ and CUDA files of the stage's include folders and of the sources' folders
    are copied, keeping their places, into .build/settled/<digest of their names and bytes>/, and
    built from there: the same files find the same folder and the library built last time, an edit
    makes a new folder. Error messages name the stage's paths again (shared_library)."""
    from grader import paths

    where = os.environ.get(STAGE_ENV)
    if not where:
        return None
    stage = Path(where).resolve()
    if not all(s.resolve().is_relative_to(stage) for s in sources):
        return None
    roots = {s.resolve().parent for s in sources} | {
        d.resolve() for d in include_dirs if d.resolve().is_relative_to(stage)
    }
    files = sorted({f for r in roots for f in r.rglob("*") if f.is_file() and f.suffix in SETTLED_SUFFIXES})
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.relative_to(stage).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    settled = paths.BUILD / "settled" / digest.hexdigest()[:20]
    for f in files:
        target = settled / f.relative_to(stage)
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            part = target.with_name(f".{target.name}.{os.getpid()}")
            shutil.copyfile(f, part)
            os.replace(part, target)  # whole files only, whoever else settles the same files at once
    return stage, settled


def _moved(path: Path, stage: Path, settled: Path) -> Path:
    """`path`'s place in the settled copy where it lies in the stage, else `path` itself."""
    resolved = path.resolve()
    return settled / resolved.relative_to(stage) if resolved.is_relative_to(stage) else path


@functools.cache
def split_compile_flags() -> tuple[str, ...]:
    """nvcc's flags that compile one translation unit on several threads, those this toolkit knows.

    nvcc compiles a source's kernels one after the other, in its optimizer (cicc) and in ptxas: a
    source that instantiates a hundred kernel templates takes a minute on one core while the others
    idle. `--split-compile=0` spreads the optimizer's work over every core, and ptxas's own
    `--split-compile=0` its kernels (CUDA 12.x and later; NVIDIA documents no more than a minimal
    effect on the code). Flags a toolkit does not list in its --help are left out, so an older one
    still builds, serially. They are part of the build key, as every flag is."""
    from grader import toolchain

    nvcc = toolchain.find_nvcc()
    flags: list[str] = []
    if "--split-compile" in _help(str(nvcc)):
        flags.append("--split-compile=0")
        ptxas = shutil.which("ptxas", path=str(nvcc.resolve().parent)) or shutil.which("ptxas")
        if ptxas and "--split-compile" in _help(ptxas):
            flags += ["-Xptxas", "--split-compile=0"]
    return tuple(flags)


def _help(tool: str) -> str:
    try:
        out = subprocess.run([tool, "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout + out.stderr
