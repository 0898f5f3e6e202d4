"""Checks for lab1/01_vector_add.cu: c = a + b with one block of n threads."""

from grader.tasks import NO_LIBRARIES, In, Int, Out
from grader.tasks.elementwise import elementwise

TASK = elementwise(
    lab="lab1",
    number="01",
    title="vector add",
    source="01_vector_add.cu",
    symbol="vector_add",
    args=[In("a"), In("b"), Out("c"), Int("n")],
    fn=lambda a, b: a + b,
    sizes=[1, 2, 31, 32, 33, 255, 1000, 1024],  # one block holds at most 1024 threads
    timing_size=1024,
    rules=[NO_LIBRARIES],
    mistakes={
        "never written": "outputs are filled with NaN first: a kernel that computes but never stores leaves them",
        "tail": "sizes 1, 31, 33, 255, 1000 are not multiples of a block: a missing `i < n` guard writes into the "
        "canary past the end",
    },
)


def test_vector_add(grade):
    grade(TASK)
