"""Checks for lab6/02_ring.cu: a ring all-reduce (reduce-scatter, then all-gather) over CUDA IPC
memory, on 2 GPUs, one process each (skipped, naming the counts, on a machine that shows fewer).

The grader builds 02_ring.cu into a shared library (with the course's flags, -O3 -lineinfo) and
starts 2 ranks with kiln_tp.launch(..., device="cuda"): rank r on GPU r. Each rank drives the
library through kiln_tp/ipc.py (given): ring_alloc, ring_export, the 64-byte handles gathered over
the process group, ring_open, then the scenarios below, in this order, on one communicator, then
ring_close and ring_free. Every input is a whole number from -8 to 8 and new at every call (its
call number is in it), so every sum is exact and every check is ==: tolerance 0. Each rank checks
its own buffer: the sum must be in place on every rank, not only on rank 0.

- test_sizes: one call each at n = 1 (fewer elements than ranks: one chunk is empty), 2, 3, 4, 5,
  7, 8, 9 (below and past a float4, n odd), 1000, 1001, 4099 (chunks with tails), 65539, 2^20 + 5
  and 2^22 (16 MB: many steps of a grid). The 64 floats past n hold a sentinel that must survive.
- test_repeated: four calls at n = 4099, new inputs each: a flag left from the previous call (an
  epoch not advanced, a flag not reset) must not let a rank read before its peer has written.
- test_back_to_back: three calls queued on one stream with no host wait between them, each next
  input written after the previous sum was copied out.
- test_late_rank: rank 1 sleeps 0.5 s on the host before writing its input and calling, at n = 1000
  and 2^20 + 3: rank 0's call must wait for it (its entry barrier), not read rank 1's old buffer.
- test_stream: the call on a stream of torch's, not the legacy default stream, queued behind a
  kernel that keeps that stream busy for tens of milliseconds and the input's copy: a kernel
  launched on another stream runs first, on the old buffer.
- test_graph: the input's copy, the call and the sum's copy captured in one CUDA graph, replayed
  three times on new inputs (the epochs live on the device: nothing to reset between replays).
- test_slow_reader: rank 0 reads rank 1's buffer slowly (the harness copies from rank 1's memory
  to rank 0's with the copy engines beside the call, taking a share of the link), while rank 1,
  as soon as its call is done on its stream, writes its next input into its buffer; five calls
  at n = 2^22, rank 0's sums checked. A rank that leaves its last all-gather step without a
  barrier hands its slower neighbour its next input in place of the sum.

A scenario that raises (a CUDA error, a capture that fails) ends the run: the scenarios after it
fail, saying which one raised. A kernel that never returns (a flag that never comes) is caught by
the rank's wait for its calls (kiln_tp.ipc.CALL_LIMIT_S, 15 s, against microseconds for a call):
that scenario fails naming its call, and the launch ends the stuck ranks once every rank has
reported. A library call that blocks the host itself ends in the launch's time limit.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from grader.tasks import PythonTask

LAB = Path(__file__).resolve().parents[1]
LAUNCH_TIMEOUT_S = 120.0  # a backstop: an honest run takes seconds, a stuck call CALL_LIMIT_S

TASK = PythonTask(
    lab="lab6",
    number="02",
    title="a ring all-reduce over CUDA IPC memory",
    sources=["02_ring.cu"],
    packages=["kiln_tp", "../lab5/kiln_llm", "../lab5/llama", "../lab4/kiln"],
    gpu=True,
    gpus=2,
    timeout=600,
    mistakes={
        "flag without acquire": "test_late_rank and test_repeated: a flag read with a plain load may be read once "
        "and never again (the compiler keeps it in a register): the rank waits forever or reads too early",
        "epoch not advanced": "test_repeated, test_late_rank: the flags of the previous call already hold the value "
        "the next call waits for, so a rank goes on before its peer has written its new input",
        "tail": "test_sizes: n = 5, 4099, 65539, 2^20 + 5: the floats after a chunk's last whole float4",
        "n < world": "test_sizes: n = 1: a chunk that starts past n is empty, not n - start floats long",
        "vector alignment": "test_sizes: chunks not a multiple of 4 floats make float4 accesses misaligned",
        "no all-gather": "test_sizes: after the reduce-scatter alone each rank holds one summed chunk; every rank "
        "must end with the whole sum",
        "result on rank 0 only": "every test checks every rank's buffer: the sum in place on each",
        "wrong stream": "test_stream and test_graph: the kernel on the legacy stream runs before the input is "
        "written on the caller's stream, and a capture fails",
        "no entry barrier": "test_late_rank: a rank that starts the reduce-scatter before its left neighbour "
        "has arrived adds what that neighbour's buffer held before",
        "buffer reused while read": "test_slow_reader: without a barrier after the last all-gather step a rank "
        "returns while its right neighbour may still be copying from its buffer, and its next input lands there",
    },
)


@pytest.fixture(scope="module")
def found():
    from grader.tasks.python import task_library
    from kiln_tp import launch
    from kiln_tp.ipc import check_all_reduce

    return launch(2, check_all_reduce, str(task_library()), "ring", timeout=LAUNCH_TIMEOUT_S, device="cuda")


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


def test_ring(grade):
    grade(TASK)
