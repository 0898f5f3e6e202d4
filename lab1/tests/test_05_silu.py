"""Checks for lab1/05_silu.cu: SiLU on host buffers, with the student's own allocation, copies and
error checking."""

from grader.child.context import RunContext
from grader.tasks import NO_LIBRARIES, HostIn, HostOut, Rule, Size, Verdict
from grader.tasks.elementwise import elementwise

SIZES = [0, 1, 2, 31, 33, 1000, (1 << 20) + 3, 1 << 24]
HUGE = [(1 << 31) + 17]  # n is a size_t: past 2^31 elements an int index overflows (make grade)


def torch_silu(x):
    import torch

    return torch.nn.functional.silu(x)


def baseline(v, o):
    import torch

    o["y"].copy_(torch.nn.functional.silu(v["x"].cuda()).cpu())


def impossible_size_returns_an_error(ctx: RunContext) -> None:
    """An allocation that cannot succeed must come back as an error code, not a crash."""
    import numpy as np

    silu = ctx.entry("silu")
    tiny_x, tiny_y = np.zeros(1, np.float32), np.zeros(1, np.float32)
    n = 1 << 42  # 16 TiB of floats: no GPU has that much memory
    rc = silu({"x": tiny_x, "y": tiny_y, "n": n})
    if rc == 0:
        ctx.fail(
            f"silu(n={n}) returned cudaSuccess although no GPU can allocate {4 * n >> 40} TiB: check every "
            "runtime call with CUDA_CHECK and return its error",
            Verdict.WRONG,
        )


def no_device_memory_leak(ctx: RunContext) -> None:
    """Repeated calls must give back what they allocate."""
    import numpy as np
    import torch

    silu = ctx.entry("silu")
    n = 1 << 22
    x, y = np.ones(n, np.float32), np.zeros(n, np.float32)
    ctx.check_rc("silu", silu({"x": x, "y": y, "n": n}), f"n={n}")
    torch.cuda.synchronize()
    free_before, _ = torch.cuda.mem_get_info()
    for _ in range(4):
        ctx.check_rc("silu", silu({"x": x, "y": y, "n": n}), f"n={n}")
    torch.cuda.synchronize()
    free_after, _ = torch.cuda.mem_get_info()
    lost = free_before - free_after
    if lost >= 2 * 4 * n:
        ctx.fail(
            f"device memory leaks: 4 calls with n={n} left {lost / 2**20:.0f} MiB allocated: cudaFree "
            "every buffer you cudaMalloc",
            Verdict.WRONG,
        )


def failure_after_an_allocation_leaks_nothing(ctx: RunContext) -> None:
    """The clean-up path: when the first buffer fits and the second does not, silu must return the
    error, leave y untouched and give the first buffer back. The GPU is filled first (a torch
    tensor) so that this happens with tens of MiB, not with a host array as large as the card."""
    import numpy as np
    import torch

    silu = ctx.entry("silu")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    # 64 MiB left: a 2 MiB page granularity and the driver's own small allocations still leave room
    # for one buffer of 0.6 x that (on an H200, 8 MiB left had the first 4 MiB allocation fail too)
    filler = torch.empty(max(free - (64 << 20), 0), dtype=torch.uint8, device="cuda")
    try:
        torch.cuda.synchronize()
        left, _ = torch.cuda.mem_get_info()
        # one buffer of 0.6 x what is left fits; two do not (allocations round up to 2 MiB pages)
        n = int(left * 0.6) // 4
        x, y = np.ones(n, np.float32), np.full(n, 7.0, np.float32)
        rc = silu({"x": x, "y": y, "n": n})
        torch.cuda.synchronize()
        after, _ = torch.cuda.mem_get_info()
    finally:
        del filler
        torch.cuda.empty_cache()
    if rc == 0:
        ctx.fail(
            f"silu(n={n}) returned cudaSuccess although its second buffer could not be allocated "
            f"({left >> 20} MiB were free): check every cudaMalloc and return its error",
            Verdict.WRONG,
        )
    if not (y == 7.0).all():
        ctx.fail(f"silu(n={n}) failed but wrote into y: leave y untouched when it fails", Verdict.WRONG)
    lost = left - after
    if lost >= 2 << 20:
        ctx.fail(
            f"silu(n={n}) leaked {lost / 2**20:.0f} MiB when its second allocation failed: free every buffer "
            "on every exit path, the failing ones too (the clean-up pattern of the chapter's section 4)",
            Verdict.WRONG,
        )


TASK = elementwise(
    lab="lab1",
    number="05",
    title="SiLU, host + device code",
    source="05_silu.cu",
    symbol="silu",
    args=[HostIn("x"), HostOut("y"), Size("n")],
    fn=torch_silu,
    sizes=SIZES,
    huge_sizes=HUGE,
    scale=4.0,
    timing_size=1 << 24,
    baseline=baseline,
    rules=[
        NO_LIBRARIES,
        Rule("require", r"cudaMalloc\s*\(", "allocate the device buffers yourself with cudaMalloc"),
        Rule("require", r"cudaMemcpy\w*\s*\(", "move the data with cudaMemcpy"),
        Rule("require", r"cudaFree\s*\(", "free what you allocate with cudaFree"),
        Rule("require", r"<<<", "compute on the GPU: launch a kernel"),
    ],
    checks=[impossible_size_returns_an_error, no_device_memory_leak, failure_after_an_allocation_leaks_nothing],
    mistakes={
        "unchecked errors": "a size no GPU can allocate must return the error, not cudaSuccess",
        "leak": "free device memory is compared before and after four calls",
        "leak on failure": "a second allocation made to fail after the first succeeded must free the first",
    },
)


def test_silu(grade):
    grade(TASK)
