"""Checks for lab1/02_matrix_add.cu: C = A + B over (rows, cols) row-major with 16x16 blocks.

rows and cols are ints, so rows * cols may pass 2^31: the huge case (run by `make grade`) holds
the flat index to 64 bits."""

from grader.tasks import NO_LIBRARIES, In, Int, Out
from grader.tasks.elementwise import elementwise

TASK = elementwise(
    lab="lab1",
    number="02",
    title="matrix add (2D blocks)",
    source="02_matrix_add.cu",
    symbol="matrix_add",
    args=[In("A"), In("B"), Out("C"), Int("rows"), Int("cols")],
    fn=lambda A, B: A + B,  # noqa: N803 - matrices are capitals, as in the task file
    dims=("rows", "cols"),
    sizes=[(1, 1), (1, 2), (2, 1), (16, 16), (17, 17), (31, 33), (33, 31), (100, 257), (1000, 1000), (4096, 4096)],
    huge_sizes=[(32769, 65536)],  # 2^31 + 2^16 elements, 8 GiB per matrix
    timing_size=(4096, 4096),
    rules=[NO_LIBRARIES],
    mistakes={
        "off-by-one guard": "17 x 17, 31 x 33, 100 x 257: a guard such as `row <= rows` writes one row past the end",
        "32-bit offsets": "32769 x 65536 (make grade): `int i = row * cols + col` overflows past 2^31 elements",
    },
)


def test_matrix_add(grade):
    grade(TASK)
