"""Every ladder a task declares has its table in its lab's README, in the shape the declaration
gives (header and row labels; the numbers are `make bench-labN`'s to write, on a GPU), and no
README holds a table that no ladder declares. With no ladder declared anywhere, a README without
ladder blocks passes; one with an orphan block does not."""

from __future__ import annotations

import pytest

from grader import paths
from grader.report import ladders
from grader.tasks.spec import Task


def _readme(lab: str) -> str:
    path = paths.ROOT / lab / "README.md"
    return path.read_text() if path.exists() else ""


def test_every_ladder_has_its_table_in_shape(tasks: list[Task]) -> None:
    problems = [p for t in ladders.laddered(tasks) for p in ladders.drift(t, _readme(t.lab))]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("lab", [p.name for p in paths.labs()])
def test_no_table_without_a_ladder(lab: str, tasks: list[Task]) -> None:
    assert ladders.orphans([t for t in tasks if t.lab == lab], _readme(lab)) == []


def test_every_ladder_declaration_can_run(tasks: list[Task]) -> None:
    problems = [f"{t.task_id}: {p}" for t in ladders.laddered(tasks) for p in t.ladder.problems(t)]  # type: ignore[union-attr]
    assert not problems, "\n".join(problems)
