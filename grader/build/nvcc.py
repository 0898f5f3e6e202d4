"""Builds task sources into shared libraries with nvcc.

Outputs are named by a hash of everything that affects them (source, course.h, flags, nvcc
version, architecture), so an unchanged task is never rebuilt and switching between a skeleton
and a solution costs nothing. Whatever must be built is built in one ninja run, in parallel, with
each compile's output kept in a log next to the library.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from grader import paths, toolchain
from grader.build.ptxas import parse_ptxas
from grader.records import KernelResources

# Never -G: device debug code is an order of magnitude slower and every task is timed.
FLAGS = ["-O3", "-lineinfo", "-std=c++17", "-Xcompiler", "-fPIC", "-shared", "-Xptxas", "-v"]


@dataclass
class BuildResult:
    source: Path
    ok: bool
    lib: Path | None
    log: str = ""
    error: str = ""  # nvcc's first error, file:line first
    kernels: list[KernelResources] = field(default_factory=list)
    cached: bool = False
    seconds: float = 0.0


def nvcc_command(source: Path, output: Path, arch: str) -> list[str]:
    return [
        str(toolchain.find_nvcc()),
        *FLAGS,
        *toolchain.gencode_flags(arch),
        f"-I{paths.INCLUDE}",
        str(source),
        "-o",
        str(output),
    ]


def _digest(source: Path, arch: str) -> str:
    h = hashlib.sha256()
    h.update(source.read_bytes())
    for header in sorted(paths.INCLUDE.glob("*.h")):
        h.update(header.read_bytes())
    h.update(" ".join([*FLAGS, arch, toolchain.nvcc_version()]).encode())
    return h.hexdigest()[:16]


def output_for(source: Path, arch: str) -> Path:
    sub = source.parent.parent.name if source.parent.name == "solutions" else source.parent.name
    tag = "sol" if source.parent.name == "solutions" else "student"
    return paths.BUILD / sub / f"{source.stem}.{tag}.{_digest(source, arch)}.so"


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


def _ninja() -> str | None:
    found = shutil.which("ninja")
    if found:
        return found
    try:
        import ninja  # the PyPI package ships the binary

        candidate = Path(ninja.BIN_DIR) / "ninja"
        return str(candidate) if candidate.exists() else None
    except ImportError:
        return None


def _ninja_escape(text: str) -> str:
    return text.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def build_all(sources: list[Path], arch: str | None = None, jobs: int | None = None) -> dict[Path, BuildResult]:
    """Builds every source (skipping those already built) and returns a result per source."""
    arch = arch or toolchain.target_arch()
    results: dict[Path, BuildResult] = {}
    todo: list[tuple[Path, Path]] = []
    for src in sources:
        out = output_for(src, arch)
        if out.exists():
            log = out.with_suffix(".log").read_text() if out.with_suffix(".log").exists() else ""
            results[src] = BuildResult(src, True, out, log, kernels=parse_ptxas(log), cached=True)
        else:
            todo.append((src, out))
    if todo:
        start = time.perf_counter()
        _run_builds(todo, arch, jobs)
        elapsed = time.perf_counter() - start
        for src, out in todo:
            log_path = out.with_suffix(".log")
            log = log_path.read_text() if log_path.exists() else ""
            ok = out.exists()
            results[src] = BuildResult(
                src,
                ok,
                out if ok else None,
                log,
                error="" if ok else first_error(log),
                kernels=parse_ptxas(log) if ok else [],
                seconds=elapsed,
            )
    return results


def _run_builds(todo: list[tuple[Path, Path]], arch: str, jobs: int | None) -> None:
    for _, out in todo:
        out.parent.mkdir(parents=True, exist_ok=True)
    commands = []
    for src, out in todo:
        tmp = out.with_suffix(".tmp.so")
        nvcc = shlex.join(nvcc_command(src, tmp, arch))
        # the library appears only once nvcc succeeded, so a half-written one is never loaded
        commands.append(
            f"{nvcc} > {shlex.quote(str(out.with_suffix('.log')))} 2>&1"
            f" && mv {shlex.quote(str(tmp))} {shlex.quote(str(out))}"
        )
    ninja = _ninja()
    if ninja is None or len(commands) == 1:
        for cmd in commands:
            subprocess.run(["/bin/sh", "-c", cmd], check=False)
        return
    build_file = paths.BUILD / f"build-{os.getpid()}.ninja"
    lines = ["rule sh", "  command = /bin/sh -c $cmd", "  description = nvcc $out", ""]
    for (src, out), cmd in zip(todo, commands, strict=True):
        lines.append(f"build {_ninja_escape(str(out))}: sh {_ninja_escape(str(src))}")
        lines.append(f"  cmd = {shlex.quote(cmd).replace('$', '$$')}")
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
