"""compute-sanitizer runs: memcheck for out-of-bounds and misaligned accesses, racecheck for
shared-memory races. Findings are kept only where they point into the task's own source (or into
the course's headers that it includes, whose helpers are inlined into its kernels)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from grader import toolchain
from grader.records import SanitizerRun

TOOLS = ("memcheck", "racecheck")
_PREFIX = re.compile(r"^=+ ?")
_AT = re.compile(r"\bat (?P<fn>.+?)\+0x[0-9a-f]+ in (?P<file>[^\s:]+):(?P<line>\d+)")
_HAZARD = re.compile(r"Potential (?P<kind>RAW|WAR|WAW) hazard detected at __shared__")
_THREAD = re.compile(r"by thread \((?P<t>[\d,]+)\) in block \((?P<b>[\d,]+)\)")


@dataclass(frozen=True)
class Finding:
    tool: str
    what: str
    file: str
    line: int
    detail: str = ""

    def __str__(self) -> str:
        extra = f" ({self.detail})" if self.detail else ""
        return f"{self.tool}: {self.what} at {self.file}:{self.line}{extra}"


def findings(tool: str, output: str, sources: Iterable[str], headers: Iterable[str]) -> list[Finding]:
    """The findings in the task's sources and in the course's headers that its build read
    (grader/include): their helpers (cp_async_16, ldmatrix_x4) are inlined into the student's kernel,
    so a race between two of their lines is the kernel's race, where the task's own lines never show."""
    helpers = {Path(h).name for h in headers if Path(h).parent.parts[-2:] == ("grader", "include")}
    found = [f for name in {Path(s).name for s in sources} for f in parse(tool, output, Path(name))]
    where = "in the course's helper, inlined into your kernel: look at your calls of it around the barriers"
    for name in sorted(helpers):
        found += [
            Finding(f.tool, f.what, f"grader/include/{name}", f.line, f"{f.detail}; {where}" if f.detail else where)
            for f in parse(tool, output, Path(name))
        ]
    return found


def find_sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    try:
        candidate = toolchain.find_nvcc().parent / "compute-sanitizer"
    except toolchain.ToolchainError:
        return None
    return str(candidate) if candidate.exists() else None


def wrapper(tool: str) -> list[str]:
    exe = find_sanitizer()
    if exe is None:
        raise toolchain.ToolchainError(
            "compute-sanitizer not found: it ships with the CUDA toolkit (bin/compute-sanitizer); "
            "put the toolkit's bin folder on PATH"
        )
    cmd = [exe, "--tool", tool, "--print-limit", "20"]
    if tool == "racecheck":
        cmd += ["--racecheck-report", "hazard"]
    return cmd


def parse(tool: str, output: str, source: Path) -> list[Finding]:
    """Findings in `source` from compute-sanitizer's report (its lines start with =========)."""
    lines = [_PREFIX.sub("", line) for line in output.splitlines() if line.startswith("=")]
    findings: list[Finding] = []
    name = source.name
    for i, line in enumerate(lines):
        if tool == "racecheck" and (m := _HAZARD.search(line)):
            pair = [f for f in lines[i + 1 : i + 3] if (a := _AT.search(f)) and Path(a["file"]).name == name]
            if pair:
                accesses = ", ".join(f"{f.split()[0].lower()} at line {_AT.search(f)['line']}" for f in pair)
                scope = " within a warp" if "Warp Level" in line else ""
                first_line = int(_AT.search(pair[0])["line"])
                findings.append(
                    Finding(
                        tool,
                        f"shared-memory {m['kind']} hazard{scope} ({accesses})",
                        name,
                        first_line,
                        "no __syncthreads() orders these accesses",
                    )
                )
        elif tool == "racecheck" and "Race reported between" in line:
            first = _AT.search(line)
            second = _AT.search(lines[i + 1]) if i + 1 < len(lines) else None
            locs = [m for m in (first, second) if m and Path(m["file"]).name == name]
            if locs:
                kinds = re.findall(r"(Read|Write) access", line + " " + (lines[i + 1] if i + 1 < len(lines) else ""))
                other = f" and line {second['line']}" if second and first and second["line"] != first["line"] else ""
                hazards = re.search(r"\[(\d+) hazards?\]", lines[i + 1] if i + 1 < len(lines) else "")
                detail = f"{' / '.join(kinds)} without a barrier between them" + (
                    f", {hazards.group(1)} hazards" if hazards else ""
                )
                findings.append(Finding(tool, f"shared-memory race{other}", name, int(locs[0]["line"]), detail))
        elif tool == "memcheck" and re.match(
            r"(Invalid|Misaligned|Out-of-range|Uninitialized|Malloc|Free)", line.strip()
        ):
            for follow in lines[i + 1 : i + 4]:
                m = _AT.search(follow)
                if m and Path(m["file"]).name == name:
                    thread = next((_THREAD.search(f) for f in lines[i + 1 : i + 5] if _THREAD.search(f)), None)
                    detail = f"thread ({thread['t']}) of block ({thread['b']})" if thread else ""
                    findings.append(Finding(tool, line.strip(), name, int(m["line"]), detail))
                    break
    unique: dict[tuple[str, int, str], Finding] = {}
    for f in findings:
        unique.setdefault((f.what, f.line, f.tool), f)
    return list(unique.values())


_SUMMARY = re.compile(r"(ERROR SUMMARY|RACECHECK SUMMARY): \d+")


def outcome(tool: str, report: str, child_finished: bool, findings: list[Finding], log: str) -> SanitizerRun:
    """How the tool's run went. Clean only when the tool printed its summary and the task's
    process got to the end: a sanitizer that refused this GPU or driver is `not run`, never clean."""
    if findings:
        return SanitizerRun(tool, "findings", f"{len(findings)} in the task's sources; full report: {log}")
    if child_finished and _SUMMARY.search(report):
        return SanitizerRun(tool, "clean")
    lines = [_PREFIX.sub("", line).strip() for line in report.splitlines() if line.strip()]
    why = next((line for line in lines if "rror" in line or "not supported" in line), lines[-1] if lines else "")
    return SanitizerRun(tool, "not run", (why or "it printed nothing") + f" (full output: {log})")
