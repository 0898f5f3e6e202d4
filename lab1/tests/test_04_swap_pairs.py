"""Checks for lab1/04_swap_pairs.cu: swap adjacent elements through shared memory."""

from grader.tasks import NO_LIBRARIES, Case, CudaTask, Entry, In, Int, Out, uses_shared_memory, uses_syncthreads

SIZES = [1, 2, 3, 31, 33, 255, 256, 257, 1000, 1001, (1 << 20) + 1, 1 << 26]


def make_inputs(p, rng):
    return {"in": rng.randn(p["n"]), "n": p["n"]}


def reference(v):
    x = v["in"]
    out = x.clone()
    m = (v["n"] // 2) * 2
    out[:m] = x[:m].view(-1, 2).flip(1).reshape(-1)
    return {"out": out}


def baseline(v, o):
    m = (v["n"] // 2) * 2
    o["out"][:m].view(-1, 2).copy_(v["in"][:m].view(-1, 2).flip(1))


TASK = CudaTask(
    lab="lab1",
    number="04",
    title="swap pairs (shared memory)",
    sources=["04_swap_pairs.cu"],
    entries=[
        Entry(
            "swap_pairs",
            [In("in"), Out("out"), Int("n")],
            reference=reference,
            baseline=baseline,
            bytes_moved=lambda v: 8 * v["n"],
        )
    ],
    cases=[Case(f"n={n}", n=n) for n in SIZES],
    make_inputs=make_inputs,
    timing_case=f"n={1 << 26}",
    rules=[
        NO_LIBRARIES,
        uses_shared_memory("this task is about shared memory: stage the block's elements in a __shared__ tile"),
        uses_syncthreads("threads read what other threads wrote to shared memory: that needs __syncthreads()"),
    ],
    mistakes={
        "writes its input": "inputs are compared with a copy after the call: swapping in place is caught",
        "race": "a barrier before the loads instead of between loads and reads: runs disagree or the sanitizer's "
        "racecheck reports the hazard",
        "dead code": "the shared-memory rule reads what ptxas allocated: an unused __shared__ tile is compiled away",
    },
)


def test_swap_pairs(grade):
    grade(TASK)
