"""Shared fixtures for the course's own tests."""

from __future__ import annotations

import pytest

from grader.tasks import catalogue
from grader.tasks.spec import Task


def all_tasks() -> list[Task]:
    return catalogue.all_tasks()


@pytest.fixture(scope="session")
def tasks() -> list[Task]:
    return all_tasks()
