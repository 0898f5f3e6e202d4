"""Checks for lab1/03_saxpy.cu: out = alpha * x + y over many blocks, with a bounds guard."""

from grader.tasks import NO_LIBRARIES, Case, CudaTask, Entry, Float, In, Int, Out, PerfTarget

SIZES = [1, 2, 31, 33, 255, 256, 257, 1000, 65537, (1 << 20) + 7, (1 << 26) + 3]


def make_inputs(p, rng):
    n = p["n"]
    return {"n": n, "alpha": rng.scalar(0.5, 3.0), "x": rng.randn(n), "y": rng.randn(n)}


def baseline(v, o):
    import torch

    torch.add(v["y"], v["x"], alpha=v["alpha"], out=o["out"])


TASK = CudaTask(
    lab="lab1",
    number="03",
    title="saxpy (many blocks)",
    sources=["03_saxpy.cu"],
    entries=[
        Entry(
            "saxpy",
            [Int("n"), Float("alpha"), In("x"), In("y"), Out("out")],
            reference=lambda v: {"out": v["alpha"] * v["x"].double() + v["y"].double()},
            baseline=baseline,
            bytes_moved=lambda v: 12 * v["n"],
        )
    ],
    cases=[Case(f"n={n}", n=n) for n in SIZES],
    make_inputs=make_inputs,
    output_shapes=lambda v: {"out": (v["n"],)},
    timing_case=f"n={(1 << 26) + 3}",
    rules=[NO_LIBRARIES],
    perf=[PerfTarget("saxpy", "share_of_copy", 0.75, 2)],
)


def test_saxpy(grade):
    grade(TASK)
