"""Checks for lab1/06_max_pool.cu: 4x4 max pooling, stride 1, clipped at the bottom/right border,
computed from a 16x16 shared-memory tile with its halo."""

from grader.tasks import (
    NO_LIBRARIES,
    Case,
    CudaTask,
    Entry,
    In,
    Int,
    Out,
    PerfTarget,
    uses_shared_memory,
    uses_syncthreads,
)

SHAPES = [
    (1, 1),
    (2, 2),
    (3, 5),
    (4, 4),
    (16, 16),
    (17, 31),
    (33, 33),
    (31, 100),
    (100, 300),
    (1000, 999),
    (4096, 4096),
]


def make_inputs(p, rng):
    return {"in": rng.randn(p["H"], p["W"]), "H": p["H"], "W": p["W"]}


def pool(x):
    import torch.nn.functional as F  # noqa: N812 - the name every PyTorch reader knows

    # in (H, W) -> padded (1, 1, H+3, W+3) with -inf on the bottom/right -> out (H, W)
    padded = F.pad(x[None, None], (0, 3, 0, 3), value=float("-inf"))
    return F.max_pool2d(padded, kernel_size=4, stride=1)[0, 0]


TASK = CudaTask(
    lab="lab1",
    number="06",
    title="4x4 max pool (halo tile)",
    sources=["06_max_pool.cu"],
    entries=[
        Entry(
            "max_pool_4x4",
            [In("in"), Out("out"), Int("H"), Int("W")],
            reference=lambda v: {"out": pool(v["in"])},
            baseline=lambda v, o: pool(v["in"]),
            bytes_moved=lambda v: 8 * v["H"] * v["W"],
        )
    ],
    # H and W are ints, so H * W may pass 2^31: the huge case (make grade) holds 64-bit offsets
    cases=[Case(f"{h}x{w}", H=h, W=w) for h, w in SHAPES] + [Case("32769x65536", H=32769, W=65536, huge=True)],
    make_inputs=make_inputs,
    timing_case="4096x4096",
    rules=[
        NO_LIBRARIES,
        uses_shared_memory("load each block's tile and its halo into a __shared__ array once, then pool from it"),
        uses_syncthreads("every thread reads tile elements other threads loaded: __syncthreads() in between"),
    ],
    perf=[PerfTarget("max_pool_4x4", "speedup", 2.0, 2, gate=True)],
    mistakes={
        "race": "a barrier before the tile's loads: threads read halo elements before they are loaded, so "
        "outputs are wrong or two runs disagree",
    },
)


def test_max_pool(grade):
    grade(TASK)
