"""Checks for lab1/07_histogram.cu: a 256-bin byte histogram with global atomics, then privatised
in shared memory."""

from grader.tasks import NO_LIBRARIES, Case, CudaTask, Entry, In, Int, Out, PerfTarget, Rule, uses_shared_memory

ARGS = [In("data", "u8"), Int("n"), Out("bins", "u32")]
CASES = [
    Case("n=1", n=1, kind="uniform"),
    Case("n=2", n=2, kind="uniform"),
    Case("n=31", n=31, kind="uniform"),
    Case("n=33", n=33, kind="uniform"),
    Case("n=1000", n=1000, kind="uniform"),
    Case("n=4099 one value", n=4099, kind="constant"),
    Case("n=65537 few values", n=65537, kind="few"),
    Case(f"n={(1 << 20) + 1}", n=(1 << 20) + 1, kind="uniform"),
    Case(f"n={1 << 22} one value", n=1 << 22, kind="constant"),
    Case(f"n={1 << 26}", n=1 << 26, kind="uniform"),
]


def make_inputs(p, rng):
    n = p["n"]
    if p["kind"] == "constant":  # every thread hits one bin: the worst contention
        data = rng.integers(0, 256, 1, dtype="u8").expand(n).contiguous()
    elif p["kind"] == "few":
        data = rng.integers(60, 64, n, dtype="u8")
    else:
        data = rng.integers(0, 256, n, dtype="u8")
    return {"data": data, "n": n}


def reference(v):
    import torch

    return {"bins": torch.bincount(v["data"].long(), minlength=256).to(torch.int32)}


def baseline(v, o):
    import torch

    torch.bincount(v["data"], minlength=256)


def entry(symbol):
    return Entry(symbol, ARGS, reference=reference, baseline=baseline, bytes_moved=lambda v: v["n"])


TASK = CudaTask(
    lab="lab1",
    number="07",
    title="histogram (atomics)",
    sources=["07_histogram.cu"],
    entries=[entry("histogram_global"), entry("histogram_shared")],
    cases=CASES,
    make_inputs=make_inputs,
    timing_case=f"n={1 << 26}",
    rules=[
        NO_LIBRARIES,
        Rule("require", r"atomicAdd\s*\(", "count with atomicAdd: many threads update the same bin"),
        uses_shared_memory("histogram_shared keeps a private histogram per block in a __shared__ array"),
    ],
    perf=[PerfTarget("histogram_shared", "speedup_over:histogram_global", 2.0, 2, gate=True)],
    mistakes={
        "bins not zeroed": "the bins are filled with a sentinel before the call: counts added to them are wrong",
    },
)


def test_histogram(grade):
    grade(TASK)
