"""Loading task specs from their files."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from grader.spec import Task


def load_task(spec_file: Path) -> Task:
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
        raise ImportError(f"{spec_file} defines no TASK = Task(...)")
    task.spec_file = str(spec_file.resolve())
    return task
