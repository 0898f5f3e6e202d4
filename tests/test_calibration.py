"""Every task's checks can fail: zeros, a pass-through and an fp16 round trip are each rejected."""

from __future__ import annotations

import pytest

from grader.instructor.calibration import calibrate
from grader.tasks.spec import Scalar
from tests.conftest import all_tasks


@pytest.mark.parametrize("task", all_tasks(), ids=lambda t: t.task_id)
def test_lazy_answers_fail_and_the_reference_passes(task):
    assert calibrate(task) == []


@pytest.mark.parametrize("task", all_tasks(), ids=lambda t: t.task_id)
def test_a_64_bit_size_is_tested_past_2_to_the_31(task):
    """A contract with a 64-bit size allows more than 2^31 elements: a case must go there, or
    32-bit offset arithmetic would pass unnoticed."""
    entries = getattr(task, "entries", ())
    # a `stream` argument is a handle, not a size
    sized = [a for e in entries for a in e.args if isinstance(a, Scalar) and a.name != "stream"]
    wide = [a.name for a in sized if a.ctype in ("u64", "i64")]
    if wide:
        assert any(c.huge and c.size > 1 << 31 for c in task.cases), f"{task.task_id}: {wide} but no case past 2^31"
