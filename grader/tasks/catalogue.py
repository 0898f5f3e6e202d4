"""The task catalogue: every task of every lab, found by id, loaded from its spec file.

One place answers "which tasks are there" for the pytest plugin, `make verify`, the course's own
tests and the broken variants. A task id is `lab1/03`; within one lab `03` (or `3`) is enough.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from grader import paths
from grader.tasks.spec import Task


def load_task(spec_file: Path) -> Task:
    spec_file = Path(spec_file)
    name = f"grader_spec_{spec_file.parent.parent.name}_{spec_file.stem}"
    if name in sys.modules:
        module = sys.modules[name]
    else:
        spec = importlib.util.spec_from_file_location(name, spec_file)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {spec_file}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    task = getattr(module, "TASK", None)
    if not isinstance(task, Task):
        raise ImportError(f"{spec_file} defines no TASK = CudaTask(...) (or another kind of task)")
    task.spec_file = str(spec_file.resolve())
    return task


def spec_files(lab: Path) -> list[Path]:
    return sorted((lab / "tests").glob("test_[0-9][0-9]_*.py"))


def lab_tasks(lab: Path) -> list[Task]:
    return [load_task(f) for f in spec_files(lab)]


def all_tasks(labs: list[str] | None = None) -> list[Task]:
    """Every task, lab by lab; `labs` narrows it to names like ["lab1"]."""
    return [t for lab in paths.labs() if not labs or lab.name in labs for t in lab_tasks(lab)]


def matches(task: Task, selector: str) -> bool:
    """`lab2/03` names one task anywhere; `03` or `3` a task number in whichever lab is graded."""
    return names_number(task.lab, task.number, selector)


def names_number(lab: str, number: str, selector: str) -> bool:
    """Whether `selector` names task `number` of `lab`, as `matches` judges a task."""
    selector = selector.strip()
    if "/" in selector:
        other, _, wanted = selector.partition("/")
        return (other if other.startswith("lab") else f"lab{other}") == lab and wanted.zfill(2) == number
    return selector.zfill(2) == number


def select(tasks: list[Task], selectors: str) -> list[Task]:
    """The tasks any comma-separated selector names; all of them for an empty string."""
    wanted = [s for s in selectors.split(",") if s.strip()]
    return [t for t in tasks if not wanted or any(matches(t, s) for s in wanted)]


def task_by_id(task_id: str) -> Task:
    found = [t for t in all_tasks() if matches(t, task_id)]
    if len(found) != 1:
        raise KeyError(f"no single task {task_id!r}: ids look like lab1/03")
    return found[0]
