"""Every task's checks can fail: zeros, a pass-through and an fp16 round trip are each rejected."""

from __future__ import annotations

import pytest

from grader.instructor.calibration import calibrate
from tests.conftest import all_tasks


@pytest.mark.parametrize("task", all_tasks(), ids=lambda t: t.task_id)
def test_lazy_answers_fail_and_the_reference_passes(task):
    assert calibrate(task) == []
