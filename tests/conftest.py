"""Shared fixtures for the course's own tests."""

from __future__ import annotations

import pytest

from grader import paths
from grader.loader import load_task
from grader.spec import Task


def all_tasks() -> list[Task]:
    return [load_task(f) for lab in paths.labs() for f in paths.spec_files(lab)]


@pytest.fixture(scope="session")
def tasks() -> list[Task]:
    return all_tasks()
