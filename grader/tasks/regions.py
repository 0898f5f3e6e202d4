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

A tag is the task's id, `lab1/01` (the grader's own fixture tasks use `fixtures/92`).

The comment leader depends on the language: `//` for CUDA and C++ (.cu, .cuh, .cpp, .h, ...),
`#` for Python modules and for the code cells of notebooks, where the markers read
`# TODO(lab4/03) begin: ...`, `#~ <stub line>` and `<stub line>  # ~`: ruff format and black put
a space after `#`, so the skeleton is written in the form they leave alone, and `#~` and `# ~`
(like `//~` and `// ~`, which clang-format makes) are read alike. Every function takes the
file's name as `where` and picks the style from its suffix (`//` when the suffix says nothing),
or an explicit `style`. A notebook (`.ipynb`) is read as JSON with the standard library (the
grading process may lack nbformat): its code cells carry the regions, each region knows its
cell, and its skeleton is made cell by cell with outputs and execution counts cleared.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, Literal

Style = Literal["//", "#"]

SLASH: Style = "//"
HASH: Style = "#"
STYLES: dict[str, Style] = {
    ".cu": SLASH,
    ".cuh": SLASH,
    ".cpp": SLASH,
    ".cc": SLASH,
    ".c": SLASH,
    ".h": SLASH,
    ".hpp": SLASH,
    ".py": HASH,
    ".ipynb": HASH,
}
NOTEBOOK_SUFFIX = ".ipynb"


@dataclass(frozen=True)
class _Patterns:
    begin: re.Pattern[str]
    end: re.Pattern[str]
    stub: re.Pattern[str]
    mark: str  # what the skeleton writes after a stub line: `//~` or `# ~`
    marks: tuple[str, ...]  # what is read as one: also the spaced or unspaced other form


@functools.cache
def patterns(style: Style) -> _Patterns:
    lead = re.escape(style)
    return _Patterns(
        begin=re.compile(rf"^\s*{lead}\s*TODO\((?P<tag>[a-z]\w*/\d+)\)\s+begin\b"),
        end=re.compile(rf"^\s*{lead}\s*TODO\((?P<tag>[a-z]\w*/\d+)\)\s+end\b"),
        stub=re.compile(rf"^(?P<indent>\s*){lead} ?~ ?(?P<code>.*)$"),
        mark=f"{style} ~" if style == HASH else f"{style}~",
        marks=(f"{style}~", f"{style} ~"),
    )


# the `//` style, as this module has always exported them
BEGIN = patterns(SLASH).begin
END = patterns(SLASH).end
STUB = patterns(SLASH).stub
STUB_MARK = patterns(SLASH).mark


class RegionError(ValueError):
    """The file's TODO markers are unbalanced or mismatched."""


@dataclass
class Region:
    tag: str
    hint: str
    begin_line: int  # 1-based line of the begin marker (within its cell, for a notebook)
    body: list[str]
    style: Style = SLASH
    cell: int | None = None  # 1-based position of the notebook cell that holds it

    def at(self, where: str) -> str:
        """Where the region starts, as a student finds it: `f.cu:12` or `nb.ipynb, cell 3, line 2`."""
        return locate(where, self.begin_line, self.cell)


def locate(where: str, line: int, cell: int | None = None) -> str:
    return f"{where}:{line}" if cell is None else f"{where}, cell {cell}, line {line}"


def is_notebook(where: str) -> bool:
    return PurePath(where).suffix == NOTEBOOK_SUFFIX


def style_for(where: str) -> Style:
    """The comment leader for a file name: by its suffix, `//` when the suffix is not known."""
    return STYLES.get(PurePath(where).suffix, SLASH)


def _style(where: str, style: Style | None) -> Style:
    return style if style is not None else style_for(where)


# --- notebooks, read without nbformat -------------------------------------------------------


def _load_notebook(text: str) -> dict[str, Any] | None:
    try:
        nb = json.loads(text)
    except ValueError:
        return None
    return nb if isinstance(nb, dict) and isinstance(nb.get("cells"), list) else None


def _cell_source(cell: dict[str, Any]) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def code_cells(text: str) -> list[tuple[int, str]]:
    """(1-based cell position, source) of every code cell; none when the text is not a notebook
    (the task process then says what nbformat finds wrong with it)."""
    nb = _load_notebook(text)
    if nb is None:
        return []
    return [
        (i, _cell_source(c))
        for i, c in enumerate(nb["cells"], start=1)
        if isinstance(c, dict) and c.get("cell_type") == "code"
    ]


def code_text(text: str, where: str) -> tuple[str, list[tuple[int, int]]]:
    """The code of a task file, and for a notebook where each of its cells starts: the code
    cells joined by newlines, with (first line in the joined text, cell position) per cell.
    For any other file: the text itself and no cells."""
    if not is_notebook(where):
        return text, []
    parts, starts, line = [], [], 1
    for cell, src in code_cells(text):
        starts.append((line, cell))
        parts.append(src)
        line += src.count("\n") + 1
    return "\n".join(parts), starts


def locate_in(where: str, starts: list[tuple[int, int]], line: int) -> str:
    """`line` of `code_text`'s joined text, as `locate` writes it."""
    for first, cell in reversed(starts):
        if line >= first:
            return locate(where, line - first + 1, cell)
    return locate(where, line)


# --- regions ----------------------------------------------------------------------------------


def _find(text: str, where: str, style: Style, cell: int | None) -> list[Region]:
    pat = patterns(style)
    regions: list[Region] = []
    open_region: Region | None = None
    for lineno, line in enumerate(text.splitlines(), start=1):
        if m := pat.begin.match(line):
            if open_region is not None:
                raise RegionError(f"{locate(where, lineno, cell)}: TODO region opened inside another one")
            hint = line.split("begin", 1)[1].lstrip(": ").strip()
            open_region = Region(m["tag"], hint, lineno, [], style, cell)
        elif m := pat.end.match(line):
            if open_region is None or m["tag"] != open_region.tag:
                raise RegionError(f"{locate(where, lineno, cell)}: `TODO({m['tag']}) end` without its begin")
            regions.append(open_region)
            open_region = None
        elif open_region is not None:
            open_region.body.append(line)
    if open_region is not None:
        raise RegionError(f"{open_region.at(where)}: TODO region never closed")
    return regions


def find_regions(text: str, where: str = "<source>", style: Style | None = None) -> list[Region]:
    """The TODO regions of a task file; `where` names it (its suffix picks the comment style and
    says whether it is a notebook, whose regions live in its code cells, one cell each at most)."""
    st = _style(where, style)
    if is_notebook(where):
        return [r for cell, src in code_cells(text) for r in _find(src, where, st, cell)]
    return _find(text, where, st, None)


def _skeleton_text(solution: str, style: Style) -> str:
    pat = patterns(style)
    out: list[str] = []
    inside = False
    for line in solution.splitlines():
        if pat.begin.match(line):
            inside = True
            out.append(line)
        elif pat.end.match(line):
            inside = False
            out.append(line)
        elif inside:
            if m := pat.stub.match(line):
                out.append(f"{m['indent']}{m['code']}  {pat.mark}")
        else:
            out.append(line)
    return "\n".join(out) + ("\n" if solution.endswith("\n") else "")


def make_skeleton(solution: str, where: str = "<solution>", style: Style | None = None) -> str:
    """The student file: each region reduced to its stub lines. For a notebook, each code cell's
    regions, with every output and execution count cleared (the solution's results stay out)."""
    find_regions(solution, where, style)  # validates markers
    st = _style(where, style)
    if not is_notebook(where):
        return _skeleton_text(solution, st)
    nb = _load_notebook(solution)
    if nb is None:
        raise RegionError(f"{where}: not a notebook (invalid JSON, or no `cells` list)")
    for cell in nb["cells"]:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        src = _skeleton_text(_cell_source(cell), st)
        cell["source"] = src.splitlines(keepends=True) if isinstance(cell.get("source"), list) else src
        cell["outputs"] = []
        cell["execution_count"] = None
    # the layout nbformat writes: one-space indent, sorted keys, UTF-8 as is
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def _code_lines(lines: list[str], style: Style) -> list[str]:
    """Lines that carry code: comments and blank lines do not start a task."""
    return [s for s in (line.strip() for line in lines) if s and not s.startswith(style)]


def is_untouched(region: Region) -> bool:
    marks = patterns(region.style).marks
    return all(line.endswith(marks) for line in _code_lines(region.body, region.style))


def has_code(region: Region) -> bool:
    """Whether a region holds a line of code that is not a stub (a solution's region must)."""
    marks = patterns(region.style).marks
    return any(not line.endswith(marks) for line in _code_lines(region.body, region.style))


def untouched_regions(student: str, where: str = "<source>", style: Style | None = None) -> list[Region]:
    return [r for r in find_regions(student, where, style) if is_untouched(r)]


def not_started(student: str, where: str = "<source>", style: Style | None = None) -> bool:
    regions = find_regions(student, where, style)
    return bool(regions) and all(is_untouched(r) for r in regions)
