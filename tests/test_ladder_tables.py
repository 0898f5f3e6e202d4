"""Every ladder a task declares has its table in its lab's chapter, in the shape the declaration
gives (header and row labels; the numbers are `make bench-labN`'s to write, on a GPU), and no
chapter holds a table that no ladder declares. A lab's chapter is its README.md and the Markdown
files beside it (lab 2 splits its chapter over three files): each block's markers sit in exactly
one of them, the file `make bench-labN` writes the block into. With no ladder declared anywhere, a
README without ladder blocks passes; one with an orphan block does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from grader import paths
from grader.report import ladders, timings
from grader.tasks.spec import Task


def _chapter(lab: str) -> str:
    """The lab's Markdown files, one text: a block counts wherever in the chapter it sits."""
    return "\n".join(p.read_text() for p in sorted((paths.ROOT / lab).glob("*.md")))


def test_every_ladder_has_its_table_in_shape(tasks: list[Task]) -> None:
    problems = [p for t in ladders.laddered(tasks) for p in ladders.drift(t, _chapter(t.lab))]
    assert not problems, "\n".join(problems)


def test_every_ladder_block_is_in_one_file(tasks: list[Task]) -> None:
    """`make bench-labN` must find one file to write each table into (ladders.chapter raises otherwise)."""
    problems = []
    for t in ladders.laddered(tasks):
        try:
            ladders.chapter(paths.ROOT / t.lab, ladders.marker(t.task_id), t.task_id)
        except LookupError as e:
            problems.append(str(e))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("lab", [p.name for p in paths.labs()])
def test_no_table_without_a_ladder(lab: str, tasks: list[Task]) -> None:
    assert ladders.orphans([t for t in tasks if t.lab == lab], _chapter(lab)) == []


def test_every_ladder_declaration_can_run(tasks: list[Task]) -> None:
    problems = [f"{t.task_id}: {p}" for t in ladders.laddered(tasks) for p in t.ladder.problems(t)]  # type: ignore[union-attr]
    assert not problems, "\n".join(problems)


def test_a_block_is_found_in_whichever_file_holds_it(tmp_path: Path) -> None:
    """A chapter split over files: the block's file is found, not assumed to be README.md; a marker in
    two files, or in none of several, is an error that names the files; a lab in one README.md without
    the marker gets README.md, where a new block is appended."""
    (tmp_path / "README.md").write_text("# Lab\n\n<!-- timings:labX -->\n")
    (tmp_path / "2-ladders.md").write_text(f"# Ladders\n\n{ladders.begin('labX/07')}\n{ladders.end('labX/07')}\n")
    assert ladders.chapter(tmp_path, ladders.marker("labX/07"), "labX/07") == tmp_path / "2-ladders.md"
    assert ladders.chapter(tmp_path, timings.marker("labX"), "timings") == tmp_path / "README.md"

    (tmp_path / "3-more.md").write_text(ladders.begin("labX/07") + "\n")
    with pytest.raises(LookupError, match="2 files"):
        ladders.chapter(tmp_path, ladders.marker("labX/07"), "labX/07")
    with pytest.raises(LookupError, match="none of"):
        ladders.chapter(tmp_path, ladders.marker("labX/08"), "labX/08")

    carded = tmp_path / "carded"  # a card's timings block, without the anchor, also marks its file
    carded.mkdir()
    (carded / "README.md").write_text("# Lab\n")
    (carded / "1-timed.md").write_text(timings.begin("labX", "NVIDIA H100") + "\n")
    assert ladders.chapter(carded, timings.marker("labX"), "timings") == carded / "1-timed.md"

    single = tmp_path / "single"
    single.mkdir()
    (single / "README.md").write_text("# Lab\n")
    assert ladders.chapter(single, ladders.marker("labX/08"), "labX/08") == single / "README.md"
