"""Building CUDA code with the grader's nvcc build: per-task units in the grading process
(nvcc.py), and `shared_library` for code outside the grader (lab 4's and lab 5's compilers build
their kernels at run time through it, and share its cache, flags and error messages)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


class BuildError(Exception):
    """A library that could not be built: no CUDA toolkit here, or a compile error (nvcc's first)."""


def shared_library(
    name: str, sources: Sequence[Path], *, group: str, stem: str, include_dirs: Sequence[Path] = ()
) -> Path:
    """`sources` compiled with the course's flags and linked into one shared library under
    `.build/<group>/`, its name starting with `stem`; the library's path. Built once per set of
    inputs (sources, headers, flags, toolkit): later calls, in any process, find it built.
    `name` says what is built in error messages. Raises BuildError."""
    from grader import toolchain
    from grader.build.nvcc import BuildUnit, build_all

    # nothing reads rules' facts from these libraries: leave out the SASS and object scans
    unit = BuildUnit(
        name=name,
        sources=tuple(sources),
        group=group,
        stem=stem,
        include_dirs=tuple(include_dirs),
        facts=False,
        sass=False,
    )
    try:
        result = build_all([unit])[unit]
    except toolchain.ToolchainError as e:
        raise BuildError(f"cannot build {name}: {e}") from None
    if not result.ok or result.lib is None:
        files = ", ".join(s.name for s in sources)
        raise BuildError(f"building {name} ({files}) failed: {result.error}")
    return result.lib
