"""TODO regions: the parts of a task file the student writes.

In a reference solution a region is

    // TODO(lab1/01) begin: one thread per element ...
    <solution lines>
    //~ <stub line>
    // TODO(lab1/01) end

The skeleton is the solution with every region emptied down to its stub lines, so the two can
only differ inside regions. A stub line is what keeps the skeleton compiling (say, a `return`);
in the skeleton it reads `<stub line>  //~`, and that trailing mark is how the grader knows it is
still the stub. A region is untouched while it holds no code but stub lines; a student file whose
regions are all untouched is "not started".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

BEGIN = re.compile(r"^\s*//\s*TODO\((?P<tag>lab\d+/\d+)\)\s+begin\b")
END = re.compile(r"^\s*//\s*TODO\((?P<tag>lab\d+/\d+)\)\s+end\b")
STUB = re.compile(r"^(?P<indent>\s*)//~ ?(?P<code>.*)$")
STUB_MARK = "//~"


class RegionError(ValueError):
    """The file's TODO markers are unbalanced or mismatched."""


@dataclass
class Region:
    tag: str
    hint: str
    begin_line: int  # 1-based line of the begin marker
    body: list[str]


def find_regions(text: str, where: str = "<source>") -> list[Region]:
    regions: list[Region] = []
    open_region: Region | None = None
    for lineno, line in enumerate(text.splitlines(), start=1):
        if m := BEGIN.match(line):
            if open_region is not None:
                raise RegionError(f"{where}:{lineno}: TODO region opened inside another one")
            hint = line.split("begin", 1)[1].lstrip(": ").strip()
            open_region = Region(m["tag"], hint, lineno, [])
        elif m := END.match(line):
            if open_region is None or m["tag"] != open_region.tag:
                raise RegionError(f"{where}:{lineno}: `TODO({m['tag']}) end` without its begin")
            regions.append(open_region)
            open_region = None
        elif open_region is not None:
            open_region.body.append(line)
    if open_region is not None:
        raise RegionError(f"{where}:{open_region.begin_line}: TODO region never closed")
    return regions


def make_skeleton(solution: str, where: str = "<solution>") -> str:
    """The student file: each region reduced to its stub lines."""
    find_regions(solution, where)  # validates markers
    out: list[str] = []
    inside = False
    for line in solution.splitlines():
        if BEGIN.match(line):
            inside = True
            out.append(line)
        elif END.match(line):
            inside = False
            out.append(line)
        elif inside:
            if m := STUB.match(line):
                out.append(f"{m['indent']}{m['code']}  {STUB_MARK}")
        else:
            out.append(line)
    return "\n".join(out) + ("\n" if solution.endswith("\n") else "")


def _code_lines(lines: list[str]) -> list[str]:
    """Lines that carry code: comments and blank lines do not start a task."""
    return [s for s in (line.strip() for line in lines) if s and not s.startswith("//")]


def is_untouched(region: Region) -> bool:
    return all(line.endswith(STUB_MARK) for line in _code_lines(region.body))


def untouched_regions(student: str, where: str = "<source>") -> list[Region]:
    return [r for r in find_regions(student, where) if is_untouched(r)]


def not_started(student: str, where: str = "<source>") -> bool:
    regions = find_regions(student, where)
    return bool(regions) and all(is_untouched(r) for r in regions)
