"""Checks for lab6/03_one_shot.cu: a one-shot all-reduce for the small messages of a decode step,
every rank reading every rank's buffer directly, on 2 GPUs, one process each (skipped, naming the
counts, on a machine that shows fewer).

The grader builds 03_one_shot.cu into a shared library (with the course's flags, -O3 -lineinfo) and
starts 2 ranks with kiln_tp.launch(..., device="cuda"): rank r on GPU r. Each rank drives the
library through kiln_tp/ipc.py (given): one_shot_alloc, one_shot_export, the 64-byte handles
gathered over the process group, one_shot_open, then the scenarios below, in this order, on one
communicator, then one_shot_close and one_shot_free. Every input is a whole number from -8 to 8 and
new at every call (its call number is in it), so every sum is exact and every check is ==:
tolerance 0. Each rank checks its own buffer: the sum must be in place on every rank.

- test_sizes: one call each at n = 1, 2, 3, 4, 5, 7, 8, 9 (below and past a float4), 1000, 1001,
  4099, 65539 (past one round of the grid), 2^20 + 5 and 2^22 (many rounds). The 64 floats past n
  hold a sentinel that must survive.
- test_repeated: four calls at n = 4099, new inputs each: a flag left from the previous call must
  not let a rank read before its peer has written.
- test_back_to_back: three calls queued on one stream with no host wait between them.
- test_late_rank: rank 1 sleeps 0.5 s on the host before writing its input and calling: rank 0's
  call must wait for it, not read rank 1's old buffer.
- test_stream: the call on a stream of torch's behind a kernel that keeps it busy for tens of
  milliseconds and the input's copy; a kernel on the legacy stream runs first, on the old buffer.
- test_graph: the input's copy, the call and the sum's copy captured in one CUDA graph, replayed
  three times on new inputs.
- test_slow_reader: rank 0 reads rank 1's buffer slowly (the harness copies from rank 1's memory
  to rank 0's with the copy engines beside the call, taking a share of the link), while rank 1,
  as soon as its call is done on its stream, writes its next input into its buffer; five calls
  at n = 2^22, rank 0's sums checked. A rank that writes its sum before every peer has read its
  input, or leaves before they have, hands the slower peer a sum or its next input.

A scenario that raises ends the run: the scenarios after it fail, saying which one raised. A kernel
that never returns is caught by the rank's wait for its calls (kiln_tp.ipc.CALL_LIMIT_S): that
scenario fails naming its call; a library call that blocks the host ends in the launch's time limit.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from grader.tasks import PythonTask

LAB = Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT_S = 120.0  # a backstop: an honest run takes seconds, a stuck call CALL_LIMIT_S

TASK = PythonTask(
    lab="lab6",
    number="03",
    title="a one-shot all-reduce for small messages",
    sources=["03_one_shot.cu"],
    packages=["kiln_tp", "../lab5/kiln_llm", "../lab5/llama", "../lab4/kiln"],
    gpu=True,
    gpus=2,
    timeout=600,
    mistakes={
        "flag without acquire": "test_late_rank and test_repeated: a flag read with a plain load may be read once "
        "and never again: the rank waits forever or reads too early",
        "epoch not advanced": "test_repeated, test_late_rank: the flags of the previous call already hold the value "
        "the next call waits for, so a rank reads its peer's buffer before the peer's new input is there",
        "tail": "test_sizes: n = 1, 2, 3, 5, 4099, 65539, 2^20 + 5: the floats after the last whole float4",
        "writes past n": "test_sizes: the sentinel after n: a last float4 written whole where fewer than 4 floats "
        "are left",
        "own input left out": "every test: the sum over every rank includes this rank's own buffer",
        "result on rank 0 only": "every test checks every rank's buffer: the sum in place on each",
        "wrong stream": "test_stream and test_graph: the kernel on the legacy stream runs before the input is "
        "written on the caller's stream, and a capture fails",
        "no entry barrier": "test_late_rank: a rank that reads its peers before they have arrived adds what their "
        "buffers held before",
        "buffer reused while read": "test_slow_reader: a rank that writes its sum into its buffer before the "
        "barrier that says every peer has read its input hands a slower peer the sum in place of the input",
    },
)


@pytest.fixture(scope="module")
def found():
    from grader.tasks.python import task_library
    from kiln_tp import launch
    from kiln_tp.ipc import check_all_reduce

    return launch(2, check_all_reduce, str(task_library()), "one_shot", timeout=LAUNCH_TIMEOUT_S, device="cuda")


def check(found, scenario: str) -> None:
    wrong = [(rank, errors) for rank, errors in enumerate(found[scenario]) if errors]
    assert not wrong, "\n".join(f"rank {rank}: " + "; ".join(errors[:3]) for rank, errors in wrong)


@pytest.mark.points(3)
def test_sizes(found):
    check(found, "sizes")


@pytest.mark.points(2)
def test_repeated(found):
    check(found, "repeated")


@pytest.mark.points(1)
def test_back_to_back(found):
    check(found, "back_to_back")


@pytest.mark.points(2)
def test_late_rank(found):
    check(found, "late")


@pytest.mark.points(1)
def test_stream(found):
    check(found, "stream")


@pytest.mark.points(1)
def test_graph(found):
    check(found, "graph")


@pytest.mark.points(1)
def test_slow_reader(found):
    check(found, "slow_reader")


def test_one_shot(grade):
    grade(TASK)
