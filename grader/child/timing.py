"""Timing kernels fairly and honestly: CUDA events, a cold L2, interleaved baselines, fresh buffers
for every call, and figures checked against what the card can physically do.

Each repetition first reads a buffer twice the size of L2 (Flush), so neither the student's code
nor the torch baseline profits from data the previous repetition left in cache. Student and
baselines alternate within the same loop, so clock and thermal drift hit all of them alike.
Repetitions go on until the relative standard error of every mean is under `rse` or the time
cap is spent.

A timer that calls the same function on the same buffers over and over can be gamed: code that
remembers its last arguments and returns at once reads as many times the copy bandwidth. So the
student's calls rotate over several buffer sets (`Rotation`) that get fresh inputs every round,
every output is re-poisoned before its call, and after every call a check on
the device (`Bounds`, enqueued behind the end event, never waited for) counts what is wrong. A
figure past the card's theoretical limits (`Limits`, from the driver's attributes and measured
bandwidths) is a failed measurement, never a score.
"""

from __future__ import annotations

import ctypes
import functools
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from grader.child import devices
from grader.child.buffers import PREFILL, bits

if TYPE_CHECKING:
    import torch


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

SETS = 4  # buffer sets the student's calls rotate over, where memory allows


def summarize(samples: list[float]) -> Stats:
    s = sorted(samples)
    q = statistics.quantiles(s, n=4) if len(s) >= 2 else [s[0], s[0], s[0]]
    mean = statistics.fmean(s)
    rse = statistics.stdev(s) / (mean * len(s) ** 0.5) if len(s) >= 2 and mean > 0 else 1.0
    return Stats(statistics.median(s), q[0], q[2], s[0], len(s), rse)


@dataclass
class Subject:
    """One thing to time. `run(rep)` is the timed call. `prepare(rep)` (before the L2 flush) and
    `check(rep)` (after the end event) run on the same stream but outside the timed region:
    they re-poison and pick this repetition's buffers, and count what the call got wrong, without
    ever making the host wait."""

    run: Callable[[int], object]
    prepare: Callable[[int], object] | None = None
    check: Callable[[int], object] | None = None


# How long the stream is held before each start event: about 50 µs at a 2 GHz SM clock, longer
# than the host needs to queue the event, the call (through ctypes) and the end event. Without
# it, a short call is timed from an idle GPU: the start event fires at once and the interval
# measures the host's launch latency, which differs between a student's ctypes call and torch's
# C++ baseline, instead of the GPU's work.
HOLD_CYCLES = 100_000


def hold() -> None:
    """Keep the current stream busy for HOLD_CYCLES so that what is queued next runs back to back."""
    import torch

    torch.cuda._sleep(HOLD_CYCLES)


@functools.cache
def flush() -> Flush:
    """This process's one flush buffer, shared by every Timer and every bandwidth measurement."""
    return Flush()


class Flush:
    """Evicts from L2 what the previous repetition left there, by reading (not writing) a buffer
    twice L2's size. A write would leave L2 full of dirty lines, whose write-back the next timed
    call would pay for; after a read, what L2 holds is clean and evicted for free. The previous
    repetition's own dirty lines (its outputs, the poison) are written back here, untimed, which
    is why a timed call may leave up to L2's size of writes in L2 (`Limits.dram_ceiling`)."""

    def __init__(self) -> None:
        import torch

        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
        self.buf = torch.ones(max(2 * l2, 1 << 20) // 4, dtype=torch.int32, device="cuda")
        self.out = torch.empty((), dtype=torch.int64, device="cuda")
        self.torch = torch

    def __call__(self) -> None:
        self.torch.sum(self.buf, dim=0, out=self.out)


class Timer:
    def __init__(self, host: bool = False) -> None:
        import torch

        self.torch = torch
        self.host = host  # host-pointer tasks include their copies: a wall clock is the honest timer
        self.flush = flush()

    def _once(self, subject: Subject, rep: int) -> float:
        torch = self.torch
        if subject.prepare is not None:
            subject.prepare(rep)
        self.flush()
        if self.host:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            subject.run(rep)
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) * 1e3
            if subject.check is not None:
                subject.check(rep)
            return ms
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if devices.count() > 1:  # what was prepared on the task's other devices is in place first
            devices.synchronize()
        hold()
        start.record()
        subject.run(rep)
        end.record()
        devices.wait_on_others(end)  # a check of an output on another device runs after the call
        if subject.check is not None:
            subject.check(rep)  # queued behind the end event: runs while the host goes on
        end.synchronize()
        return start.elapsed_time(end)

    def compare(
        self,
        fns: Mapping[str, Callable[[], object] | Subject],
        budget: Budget,
        each_rep: Callable[[int], object] | None = None,
    ) -> dict[str, Stats]:
        """Times every function, interleaved, after one untimed warm-up call each. `each_rep(rep)`
        runs before every repetition's round of calls (the buffer rotation)."""
        subjects = {k: v if isinstance(v, Subject) else Subject(run=lambda rep, f=v: f()) for k, v in fns.items()}
        for s in subjects.values():
            if s.prepare is not None:
                s.prepare(0)
            s.run(0)
        devices.synchronize()
        samples: dict[str, list[float]] = {k: [] for k in subjects}
        deadline = time.perf_counter() + budget.max_seconds
        for rep in range(budget.max_reps):
            if each_rep is not None:
                each_rep(rep)
            for name, s in subjects.items():
                samples[name].append(self._once(s, rep))
            if rep + 1 >= budget.min_reps:
                if all(summarize(s).rse < budget.rse for s in samples.values()) or time.perf_counter() > deadline:
                    break
        return {k: summarize(v) for k, v in samples.items()}


# --- rotation: which buffer set a repetition uses, and which data that set holds then ----------


@dataclass(frozen=True)
class Rotation:
    """K buffer sets (slots); repetition r calls slot r % K. From the second round on, the slot a
    repetition is about to use first gets a fresh draw of the case's inputs (a new seed, the same
    pointers): no call sees inputs an earlier call saw, so a result cached per pointer, or per
    content (say, a fingerprint of the first bytes), is wrong. Slot s holds dataset s, the draw its
    latest call saw."""

    sets: int

    def slot(self, rep: int) -> int:
        return rep % self.sets

    def dataset(self, rep: int) -> int:
        """The dataset (= slot) repetition `rep` reads."""
        return self.slot(rep)

    def draw(self, rep: int) -> int:
        """Which seeded draw repetition `rep` sees: a new one for every call."""
        return rep

    def refresh_before(self, rep: int) -> bool:
        """Whether slot(rep) gets a fresh draw before repetition `rep` (every use but its first)."""
        return rep >= self.sets


def choose_sets(per_set_bytes: int, free_bytes: int, wanted: int = SETS) -> int:
    """How many buffer sets to rotate: `wanted`, fewer where they would take more than half of the
    free memory, at least 1 (then the per-call poison still catches skipped work)."""
    if per_set_bytes <= 0:
        return wanted
    return max(1, min(wanted, int(free_bytes * 0.5) // per_set_bytes))


@dataclass
class Bounds:
    """What one output must hold, precomputed so that the check after every timed call costs a
    few elementwise kernels and no host wait: [lo, hi] per element for floats, the exact values
    for integers. The judge accepts |got - ref| <= atol + rtol * |ref| in float64; an output is
    float32 (or float16, compared as float32), so that reads got >= lo and got <= hi with lo the
    smallest float32 at or above ref - tol and hi the largest at or below ref + tol. Both are
    first widened by one float64 step, so float64 rounding never turns an accepted value away."""

    dtype: str
    lo: torch.Tensor | None = None
    hi: torch.Tensor | None = None
    nan_ok: torch.Tensor | None = None  # where the reference is NaN (a NaN is right there)
    exact: torch.Tensor | None = None

    @classmethod
    def of(cls, ref: torch.Tensor, dtype: str, atol: float, rtol: float, shape: tuple[int, ...]) -> Bounds:
        import torch

        from grader.tasks.spec import torch_dtype

        ref = ref.reshape(shape)
        if not torch_dtype(dtype).is_floating_point:
            return cls(dtype, exact=ref.to(torch_dtype(dtype)))
        r = ref.double()
        inf = torch.tensor(float("inf"), dtype=torch.float64, device=r.device)
        tol = atol + rtol * r.abs()
        lo64 = torch.where(torch.isinf(r), r, torch.nextafter(r - tol, -inf))
        hi64 = torch.where(torch.isinf(r), r, torch.nextafter(r + tol, inf))
        lo, hi = lo64.float(), hi64.float()
        lo = torch.where(lo.double() < lo64, torch.nextafter(lo, inf.float()), lo)
        hi = torch.where(hi.double() > hi64, torch.nextafter(hi, -inf.float()), hi)
        nan = torch.isnan(r)
        return cls(dtype, lo=lo, hi=hi, nan_ok=nan if bool(nan.any()) else None)

    def count_bad(self, got: torch.Tensor) -> torch.Tensor:
        """Wrong elements of `got`, as a 0-d tensor on its device (reading it is the caller's wait)."""
        import torch

        if self.exact is not None:
            return (got != self.exact).sum()
        assert self.lo is not None and self.hi is not None
        x = got if got.dtype == self.lo.dtype else got.float()
        ok = (x >= self.lo) & (x <= self.hi)
        if self.nan_ok is not None:
            ok |= self.nan_ok & torch.isnan(x)
        return (~ok).sum()

    def count_unwritten(self, got: torch.Tensor) -> torch.Tensor:
        """Elements still holding the grader's poison (PREFILL), as a 0-d tensor."""
        return (bits(got, self.dtype) == PREFILL[self.dtype]).sum()


# --- the card's limits -------------------------------------------------------------------------


def copy_bandwidth_gbps(nbytes: int = 1 << 28) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written."""
    import torch

    src = torch.empty(max(nbytes // 4, 1), dtype=torch.float32, device="cuda").fill_(1.0)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    return 2 * src.numel() * 4 / (ms * 1e-3) / 1e9


_COPIES: dict[int, float] = {}


def copy_bandwidth_like(bytes_moved: float) -> float:
    """The bandwidth of a device-to-device copy that moves `bytes_moved` bytes (half read, half
    written), timed as the Timer times a task's call; measured once per size in a process.

    A call's share of the copy compares it with this copy, not with the large one of
    `measure_limits`: whatever a call may leave in L2 past its end event (its last writes, up to
    L2's size) a copy of the same size may leave too, so the share does not depend on how the
    case's size compares with L2's."""
    nbytes = max(int(bytes_moved) // 8 * 4, 4)  # each buffer holds half, in whole floats
    if nbytes not in _COPIES:
        _COPIES[nbytes] = copy_bandwidth_gbps(nbytes)
    return _COPIES[nbytes]


def read_bandwidth_gbps(nbytes: int = 1 << 28) -> float:
    """Read-only bandwidth in GB/s: a torch sum over a buffer five times any current L2, whose
    one-float result is nothing next to what it reads."""
    import torch

    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").fill_(1.0)
    out = torch.empty((), dtype=torch.float32, device="cuda")
    ms = median_ms(lambda: torch.sum(src, dim=0, out=out))
    return nbytes / (ms * 1e-3) / 1e9


def median_ms(fn: Callable[[], object], warm: int = 3, reps: int = 15) -> float:
    """`fn` timed as the Timer times a task's call (flushed L2, held stream), so that shares of
    these bandwidths compare like with like."""
    import torch

    evict = flush()
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        evict()
        hold()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


# FP32 lanes (FMA units) per SM, by compute capability: the CUDA C programming guide's throughput
# table. None where unknown: no FLOP limit rather than a wrong one.
def fp32_lanes(major: int, minor: int) -> int | None:
    if major == 5 or (major == 6 and minor != 0):
        return 128
    if (major, minor) == (6, 0) or major == 7 or (major, minor) == (8, 0):
        return 64
    if 8 <= major <= 12:
        return 128
    return None


# Dense tensor-core FLOP per clock per SM at the card's fastest precision (FP8/INT8/FP4 where it
# has them), from NVIDIA's architecture whitepapers, rounded up: an upper bound, never a target.
_TENSOR_FLOP_PER_CLOCK = {
    (7, 0): 1024,
    (7, 2): 1024,
    (7, 5): 4096,
    (8, 0): 8192,
    (8, 6): 4096,
    (8, 7): 4096,
    (8, 9): 4096,
    (9, 0): 8192,
    (10, 0): 32768,
    (10, 3): 65536,
    (12, 0): 8192,
}


def theoretical(
    cc: tuple[int, int], sms: int, sm_clock_khz: int, mem_clock_khz: int, bus_bits: int
) -> tuple[float | None, float | None, float | None]:
    """(DRAM GB/s, FP32 GFLOP/s, tensor GFLOP/s) from the driver's attributes: memory clock x bus
    width x 2 (double data rate), and SMs x lanes x 2 (an FMA is two FLOPs) x the peak SM clock."""
    dram = 2 * mem_clock_khz * 1e3 * bus_bits / 8 / 1e9 if mem_clock_khz > 0 and bus_bits > 0 else None
    lanes = fp32_lanes(*cc)
    clock = sm_clock_khz * 1e3
    fp32 = sms * lanes * 2 * clock / 1e9 if lanes and clock > 0 and sms > 0 else None
    per_clock = _TENSOR_FLOP_PER_CLOCK.get(cc)
    tensor = sms * per_clock * clock / 1e9 if per_clock and clock > 0 and sms > 0 else None
    return dram, fp32, tensor


# CUdevice_attribute values (cuda.h); the driver keeps them stable across releases.
_ATTRS = {"sm_clock_khz": 13, "sms": 16, "mem_clock_khz": 36, "bus_bits": 37, "major": 75, "minor": 76}


def driver_attributes(ordinal: int = 0) -> dict[str, int] | None:
    """The attributes the limits need, straight from the driver (libcuda.so.1, present wherever
    a GPU is and already initialised by torch). torch's device properties lack the memory clock
    and bus width, CUDA 13's cudaDeviceProp dropped the clocks, and the grader's task process should
    not depend on cuda-python being importable; the driver is the one source every machine with a GPU
    has. None where it fails."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    if cuda.cuInit(0) != 0:
        return None
    dev = ctypes.c_int()
    if cuda.cuDeviceGet(ctypes.byref(dev), ordinal) != 0:
        return None
    out: dict[str, int] = {}
    for name, code in _ATTRS.items():
        v = ctypes.c_int()
        if cuda.cuDeviceGetAttribute(ctypes.byref(v), code, dev) != 0:
            return None
        out[name] = v.value
    return out


SLACK = 1.10  # clocks that boost past the driver's figure, and the event timer's granularity


@dataclass(frozen=True)
class Limits:
    """What the card can do, measured (copy, read-only) and theoretical (DRAM, FLOP/s) in the same
    run as the timing; GB/s or GFLOP/s past the theoretical limit is a failed measurement."""

    copy_gbps: float
    read_gbps: float
    dram_gbps: float | None
    fp32_gflops: float | None
    tensor_gflops: float | None
    l2_bytes: int

    def peak_gflops(self, flop_peak: str = "fp32") -> float | None:
        """The FLOP/s no honest figure can pass (the bound `past` checks against)."""
        return {"fp32": self.fp32_gflops, "tensor": self.tensor_gflops}.get(flop_peak)

    def rated_gflops(self, flop_peak: str = "fp32") -> float | None:
        """The FLOP/s a report may call "peak": FP32's is the rate itself; the tensor figure is
        the fastest precision's (FP8 or INT8, rounded up), twice or more what an FP16 kernel can
        reach, so a share of it would understate every tensor-core kernel: none is reported."""
        return self.fp32_gflops if flop_peak == "fp32" else None

    def dram_ceiling(
        self, bytes_moved: float, written_bytes: float | None = None, l2_reserved: bool = True
    ) -> float | None:
        """The most GB/s a call moving `bytes_moved` can show, or None where L2 could serve it all.

        L2 is flushed before every timed call, so what the call reads comes from DRAM. What L2
        can still hide is what stays in it past the end event: the writes (`written_bytes`, the
        outputs' size), at most L2's size; or, where the code reserved persisting L2 lines
        (`l2_reserved`), anything up to L2's size, since persisting lines survive the flush. The
        ceiling is the DRAM peak (or the measured bandwidths, were they higher) scaled by
        bytes / (bytes - what L2 can hide), with SLACK for clocks and timer granularity."""
        hidden = float(self.l2_bytes)
        if written_bytes is not None and not l2_reserved:
            hidden = min(hidden, written_bytes)
        if bytes_moved <= hidden:
            return None
        peak = max(self.dram_gbps or 0.0, self.read_gbps, self.copy_gbps)
        return peak * bytes_moved / (bytes_moved - hidden) * SLACK

    def past(
        self,
        *,
        gbps: float | None,
        gflops: float | None,
        bytes_moved: float | None,
        flop_peak: str = "fp32",
        written_bytes: float | None = None,
        l2_reserved: bool = True,
    ) -> str | None:
        """None when the figures are physically possible, else what exceeds which limit."""
        if gbps is not None and bytes_moved is not None:
            ceiling = self.dram_ceiling(bytes_moved, written_bytes, l2_reserved)
            if ceiling is not None and gbps > ceiling:
                peak = f"{self.dram_gbps:.0f} GB/s (memory clock × bus width × 2)" if self.dram_gbps else "unknown"
                return (
                    f"{gbps:.0f} GB/s, while this card's DRAM peak is {peak} and it measured "
                    f"{self.read_gbps:.0f} GB/s read-only and {self.copy_gbps:.0f} GB/s copying (no more than "
                    f"{ceiling:.0f} GB/s is possible here, even with L2 holding what it can)"
                )
        peak_f = self.peak_gflops(flop_peak)
        if gflops is not None and peak_f is not None and gflops > peak_f * SLACK:
            return (
                f"{gflops:.0f} GFLOP/s, while this card's {flop_peak.upper()} peak is {peak_f:.0f} GFLOP/s "
                f"(SMs × lanes × 2 × peak clock)"
            )
        return None


def persisting_l2_bytes() -> int | None:
    """The L2 set aside for persisting lines (cudaLimitPersistingL2CacheSize), read from the
    driver for the current context: 0 unless code asked for it. None where it cannot be read."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    value = ctypes.c_size_t()
    if cuda.cuCtxGetLimit(ctypes.byref(value), 0x06) != 0:  # CU_LIMIT_PERSISTING_L2_CACHE_SIZE
        return None
    return int(value.value)


def measure_limits() -> Limits:
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    l2 = int(getattr(props, "L2_cache_size", 0) or 0)
    attrs = driver_attributes(torch.cuda.current_device())
    dram = fp32 = tensor = None
    if attrs is not None:
        dram, fp32, tensor = theoretical(
            (attrs["major"], attrs["minor"]),
            attrs["sms"],
            attrs["sm_clock_khz"],
            attrs["mem_clock_khz"],
            attrs["bus_bits"],
        )
    return Limits(copy_bandwidth_gbps(), read_bandwidth_gbps(), dram, fp32, tensor, l2)
