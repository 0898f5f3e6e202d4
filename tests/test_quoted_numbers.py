"""Measured numbers quoted by hand in the course's markdown agree with the generated blocks.

`make bench-labN` writes its tables between `<!-- ... begin -->` and `<!-- ... end -->` markers,
naming the card, driver and toolkit. Prose and summary tables elsewhere quote some of those
figures; each such quote carries a tag right after it that names the row it comes from:

    the reference reaches 92%<!-- from lab1: lab1/03 -->

The tag reads `from <lab>: <text of the row's first cell>`, and the figure before it must appear,
as written, in a row of one of that lab's generated blocks whose first cell contains that text.
A re-run of the benchmark that changes the figure then fails here until the quote is updated,
instead of leaving two numbers for one measurement. Figures derived from several rows (a ratio
of two times) are quoted as the rows' own figures instead.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FIGURE = r"(?P<figure>[<≥~]?\d[\d,]*(?:\.\d+)?\s?(?:×|x|%|µs|ms|s|tok/s|GB/s|TB/s|TFLOP/s)?)"
TAG = re.compile(FIGURE + r"\s*<!-- from (?P<lab>lab\d+): (?P<row>.+?) -->")
BLOCK = re.compile(r"<!-- (?P<name>[^>]*?)[ :]begin -->\n(?P<body>.*?)<!-- (?P=name)[ :]end -->", re.S)


def markdown_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted(ROOT.glob("lab*/*.md")), *sorted(ROOT.glob("grader/*.md"))]
    return [f for f in files if f.is_file()]


def generated_rows(lab: str) -> list[list[str]]:
    """The table rows (cells, stripped) of every generated block in `lab`'s markdown files."""
    rows = []
    for f in sorted((ROOT / lab).glob("*.md")):
        for block in BLOCK.finditer(f.read_text()):
            for line in block["body"].splitlines():
                if line.startswith("|") and not set(line) <= set("|-: "):
                    rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def squeeze(text: str) -> str:
    return re.sub(r"\s+", "", text)


QUOTES = [(f, m) for f in markdown_files() for m in TAG.finditer(f.read_text())]


def test_the_tags_are_found():
    """The README's lab 1 targets table quotes the reference's figures: if no tag is found, the
    pattern above no longer matches how quotes are written."""
    assert any(f.name == "README.md" and f.parent == ROOT for f, _ in QUOTES), "no tagged quote in README.md"


@pytest.mark.parametrize(
    ("path", "match"), QUOTES, ids=[f"{f.relative_to(ROOT)}:{m['row'][:30]}:{m['figure']}" for f, m in QUOTES]
)
def test_quote_matches_its_generated_row(path: Path, match: re.Match[str]):
    lab, row, figure = match["lab"], match["row"], squeeze(match["figure"])
    candidates = [cells for cells in generated_rows(lab) if squeeze(row) in squeeze(cells[0])]
    assert candidates, f"{path.relative_to(ROOT)}: no row of {lab}'s generated blocks starts with {row!r}"
    whole = re.compile(r"(?<![\d.,])" + re.escape(figure) + r"(?![\d])")  # 2% is not in 92%
    assert any(whole.search(squeeze(cell)) for cells in candidates for cell in cells[1:]), (
        f"{path.relative_to(ROOT)} quotes {match['figure']!r} from {lab}'s row {row!r}, which now reads: "
        + " | ".join(" | ".join(c) for c in candidates)
    )


def test_summary_tables_tag_their_figures():
    """Every figure in a column of measured results ("Reference solution ...") of the top README
    carries a tag: an untagged number there is a hand-copied one nothing checks."""
    text = (ROOT / "README.md").read_text()
    problems = []
    for table in re.finditer(r"(?m)^\|.*Reference solution.*\|\n\|[-| :]+\|\n((?:\|.*\|\n)+)", text):
        header = [c.strip() for c in table[0].splitlines()[0].strip().strip("|").split("|")]
        col = next(i for i, c in enumerate(header) if c.startswith("Reference solution"))
        for line in table[1].splitlines():
            cell = line.strip().strip("|").split("|")[col]
            untagged = TAG.sub("", cell)
            if re.search(r"\d", re.sub(r"\(.*?\)", "", untagged)):
                problems.append(f"untagged figure in: {cell.strip()}")
    assert not problems, "\n".join(problems)
