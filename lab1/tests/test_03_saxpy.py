"""Checks for lab1/03_saxpy.cu: out = alpha * x + y over many blocks, with a bounds guard.

n is an int, so the contract stops below 2^31 elements and 32-bit indices are enough."""

from grader.tasks import NO_LIBRARIES, Float, In, Int, Out, PerfTarget
from grader.tasks.elementwise import elementwise


def baseline(v, o):
    import torch

    torch.add(v["y"], v["x"], alpha=v["alpha"], out=o["out"])  # one fused kernel, as fast as torch gets


TASK = elementwise(
    lab="lab1",
    number="03",
    title="saxpy (many blocks)",
    source="03_saxpy.cu",
    symbol="saxpy",
    args=[Int("n"), Float("alpha"), In("x"), In("y"), Out("out")],
    fn=lambda alpha, x, y: alpha * x + y,
    sizes=[1, 2, 31, 33, 255, 256, 257, 1000, 65537, (1 << 20) + 7, (1 << 26) + 3],
    timing_size=(1 << 26) + 3,
    baseline=baseline,
    rules=[NO_LIBRARIES],
    perf=[PerfTarget("saxpy", "share_of_copy", 0.75, 2, gate=True)],
    mistakes={
        "tail": "n = 2^26 + 3 and other sizes off the block size: no bounds guard writes past the end",
        "hang": "a loop that never ends is killed at the task's time limit, and the other tasks go on",
        "illegal address": "a write far outside the output is an illegal memory access, reported as a crash",
        "replayed results": "every case is called a second time on the same buffers refilled with new inputs, "
        "and every timed call gets fresh inputs: code that recognises its arguments and skips the work is wrong",
        "wrong stream": "a call queued behind a long sleep on the default stream: work on a private "
        "non-blocking stream finishes after the grader reads the output",
        "library by spelling": "the library rule reads the headers the preprocessor opened, so a macro-spelled "
        "#include of Thrust and a namespace alias are still found",
    },
)


def test_saxpy(grade):
    grade(TASK)
