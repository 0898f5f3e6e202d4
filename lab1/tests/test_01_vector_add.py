"""Checks for lab1/01_vector_add.cu: c = a + b with one block of n threads."""

from grader.tasks import NO_LIBRARIES, Case, CudaTask, Entry, In, Int, Out

SIZES = [1, 2, 31, 32, 33, 255, 1000, 1024]


def make_inputs(p, rng):
    n = p["n"]
    return {"a": rng.randn(n), "b": rng.randn(n), "n": n}


def baseline(v, o):
    import torch

    torch.add(v["a"], v["b"], out=o["c"])


TASK = CudaTask(
    lab="lab1",
    number="01",
    title="vector add",
    sources=["01_vector_add.cu"],
    entries=[
        Entry(
            "vector_add",
            [In("a"), In("b"), Out("c"), Int("n")],
            reference=lambda v: {"c": v["a"] + v["b"]},
            baseline=baseline,
            bytes_moved=lambda v: 12 * v["n"],
        )
    ],
    cases=[Case(f"n={n}", n=n) for n in SIZES],
    make_inputs=make_inputs,
    output_shapes=lambda v: {"c": (v["n"],)},
    timing_case="n=1024",
    rules=[NO_LIBRARIES],
)


def test_vector_add(grade):
    grade(TASK)
