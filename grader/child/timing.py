"""Timing kernels fairly: CUDA events, a cold L2, interleaved baselines, enough repetitions.

Each repetition first overwrites a buffer twice the size of L2, so neither the student's code
nor the torch baseline profits from data the previous repetition left in cache. Student and
baseline alternate within the same loop, so clock and thermal drift hit both alike. Repetitions
go on until the relative standard error of both means is under `rse` or the time cap is spent.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Stats:
    median_ms: float
    q1_ms: float
    q3_ms: float
    min_ms: float
    n: int
    rse: float


@dataclass(frozen=True)
class Budget:
    """How hard to try: the unit tests' quick look, or the benchmark's careful one."""

    min_reps: int
    max_reps: int
    max_seconds: float
    rse: float = 0.01


QUICK = Budget(min_reps=5, max_reps=200, max_seconds=0.4)
BENCH = Budget(min_reps=20, max_reps=2000, max_seconds=3.0)


def summarize(samples: list[float]) -> Stats:
    s = sorted(samples)
    q = statistics.quantiles(s, n=4) if len(s) >= 2 else [s[0], s[0], s[0]]
    mean = statistics.fmean(s)
    rse = statistics.stdev(s) / (mean * len(s) ** 0.5) if len(s) >= 2 and mean > 0 else 1.0
    return Stats(statistics.median(s), q[0], q[2], s[0], len(s), rse)


class Timer:
    def __init__(self, host: bool = False) -> None:
        import torch

        self.torch = torch
        self.host = host  # host-pointer tasks include their copies: a wall clock is the honest timer
        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
        self.flush_buf = torch.empty(max(2 * l2, 1 << 20) // 4, dtype=torch.int32, device="cuda")

    def _once(self, fn: Callable[[], object]) -> float:
        torch = self.torch
        self.flush_buf.fill_(0x1234)  # evicts the previous repetition's data from L2
        if self.host:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            return (time.perf_counter() - t0) * 1e3
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def compare(self, fns: dict[str, Callable[[], object]], budget: Budget) -> dict[str, Stats]:
        """Times every function, interleaved, after one untimed warm-up call each."""
        for fn in fns.values():
            fn()
        self.torch.cuda.synchronize()
        samples: dict[str, list[float]] = {k: [] for k in fns}
        deadline = time.perf_counter() + budget.max_seconds
        for rep in range(budget.max_reps):
            for name, fn in fns.items():
                samples[name].append(self._once(fn))
            if rep + 1 >= budget.min_reps:
                if all(summarize(s).rse < budget.rse for s in samples.values()) or time.perf_counter() > deadline:
                    break
        return {k: summarize(v) for k, v in samples.items()}


def copy_bandwidth_gbps(nbytes: int = 1 << 28) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written."""
    import torch

    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").fill_(1.0)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(15):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    del src, dst
    return 2 * nbytes / (statistics.median(times) * 1e-3) / 1e9
