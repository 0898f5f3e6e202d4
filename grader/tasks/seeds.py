"""The seeds of a task's inputs: deterministic per task, case and draw, and moved by GRADER_SEED.

GRADER_SEED is a secret (a CI variable) that moves every input, so that a submission cannot be
tuned to the published ones. The grading process derives each task's key from it and sends a task
process only its own task's key (in its ChildJob): the secret itself never reaches student code.
"""

from __future__ import annotations

import hashlib
import os

from grader.tasks.spec import Task


def task_key(task_id: str) -> str:
    """A task's key, from GRADER_SEED (a CI secret that moves every input). The grading process
    sends each task process only its task's key, so the secret itself never reaches student code."""
    secret = os.environ.get("GRADER_SEED", "")
    return hashlib.sha256(f"{secret}/{task_id}".encode()).hexdigest()


_KEYS: dict[str, str] = {}  # task id -> key, as the job brought it (in a task process)


def use_key(task_id: str, key: str) -> None:
    _KEYS[task_id] = key


def seed_for(task: Task, label: str, draw: int = 0) -> int:
    """Deterministic per task, case and draw, and moved by the secret seed."""
    key = _KEYS.get(task.task_id) or task_key(task.task_id)
    return int(hashlib.sha256(f"{key}/{label}/{draw}".encode()).hexdigest()[:12], 16)
