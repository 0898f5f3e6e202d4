"""Checks for lab2/09_numbers.ipynb: the student's microbenchmarks of one card, held against what
the card can physically do and against the grader's own measurements, made in the same kernel.

The notebook runs top to bottom first (its sweep, plot and table); then each check below runs as
one more cell in the same kernel, calls the student's functions again, at sizes the notebook did
not use, and compares. A microbenchmark has no single right answer, so the checks are bands, wide
enough for every card from a T4 to an H200 and for run-to-run noise, narrow enough that the
classic mistakes land outside them:

- a kernel the compiler emptied (no guarded write: the loads are dead code) or a timer read
  without waiting for the GPU gives a rate above the card's physical bound, computed here from the
  driver's own clocks and bus width (cudaDeviceGetAttribute), not from the notebook's `card`;
- bytes counted twice, or once per pass forgotten, misses the grader's own measurement by 2x or
  more (HBM against torch.sum over the same number of bytes, host copies against torch's own
  copies, launches against torch.cuda._sleep(0), eagerly and in a graph);
- a "shared memory" kernel that reads global memory, or one full of bank conflicts, stays far
  below 128 bytes per SM per clock (the band starts at 30%);
- an "L2" number taken at a size that does not fit in L2 shows no cliff: the size the grader picks
  (a quarter of L2, not a power of two) must read at least 1.3x faster than 1.5 GiB + 48 MiB.

The grader's own timing uses its own events here, so a notebook whose `time_ms` were changed
cannot move the reference it is compared with. Each check re-derives the bounds it needs.
"""

from grader.tasks import NotebookCheck, NotebookTask

# Defined in every check's cell (each check must stand alone: a failing one must not hide the rest).
GRADER = r"""
import statistics as _gstat
import torch as _gtorch
from cuda.bindings import runtime as _grt


def _g_attr(name):
    err, value = _grt.cudaDeviceGetAttribute(getattr(_grt.cudaDeviceAttr, name), _gtorch.cuda.current_device())
    assert err == _grt.cudaError_t.cudaSuccess, (name, err)
    return value


_g_props = _gtorch.cuda.get_device_properties(_gtorch.cuda.current_device())
_G_SMS = _g_props.multi_processor_count
_G_CLOCK = _g_attr("cudaDevAttrClockRate") * 1e3
_G_DRAM_PEAK = 2 * _g_attr("cudaDevAttrMemoryClockRate") * 1e3 * _g_attr("cudaDevAttrGlobalMemoryBusWidth") / 8 / 1e9
_G_SHARED_PEAK = _G_SMS * 128 * _G_CLOCK / 1e9
_G_L2 = _g_props.L2_cache_size


def _g_ms(fn, repeat=15, warmup=3):
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeat):
        a, b = _gtorch.cuda.Event(enable_timing=True), _gtorch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return _gstat.median(out)


def _g_band(what, got, ref, lo, hi, unit):
    assert isinstance(got, float | int) and got == got, f"{what} returned {got!r}, not a number"
    ratio = got / ref
    assert lo <= ratio <= hi, (
        f"{what} = {got:,.2f} {unit}, {ratio:.2f}x the grader's {ref:,.2f} {unit} on the same card "
        f"(the band is {lo}x to {hi}x)"
    )
"""


def check(name: str, body: str, points: float) -> NotebookCheck:
    return NotebookCheck(name, GRADER + body, points=points)


HBM_BYTES = (1536 + 48) << 20  # 1.5 GiB + 48 MiB: larger than any L2, not a power of two

HBM = check(
    "HBM read bandwidth against torch.sum",
    f"""
_n = {HBM_BYTES}
_x = _gtorch.ones(_n // 4, device="cuda")
_ref = _n / (_g_ms(lambda: _x.sum()) * 1e-3) / 1e9
del _x
_got = read_bandwidth(_n)
assert _got <= 1.02 * _G_DRAM_PEAK, (
    f"read_bandwidth({{_n}}) = {{_got:,.0f}} GB/s, past the card's DRAM peak of {{_G_DRAM_PEAK:,.0f}} GB/s "
    "(2 x memory clock x bus width): the kernel's loads were optimized away, the timer did not wait for the "
    "GPU, or the bytes are counted more than once"
)
_g_band(f"read_bandwidth({{_n}})", _got, _ref, 0.6, 1.3, "GB/s")
""",
    2,
)

L2 = check(
    "an L2-sized buffer reads faster than HBM",
    f"""
_small = max(1 << 20, (_G_L2 // 4) // (1 << 20) * (1 << 20) - (1 << 19))
_fast, _slow = read_bandwidth(_small), read_bandwidth({HBM_BYTES})
_bound = _G_SMS * 128 * _G_CLOCK / 1e9
assert _fast <= _bound, (
    f"read_bandwidth({{_small}}) = {{_fast:,.0f}} GB/s, more than every SM can receive (128 bytes per SM per "
    f"clock: {{_bound:,.0f}} GB/s)"
)
assert _fast >= 1.3 * _slow, (
    f"read_bandwidth({{_small}}) = {{_fast:,.0f}} GB/s, not clearly faster than read_bandwidth({HBM_BYTES}) = "
    f"{{_slow:,.0f}} GB/s: a buffer of a quarter of L2 ({{_G_L2 >> 20}} MiB) should be read from L2 at 1.3x or "
    "more; read it several times in one launch (a launch's overhead hides the rate of one short pass)"
)
""",
    2,
)

SHARED = check(
    "shared-memory bandwidth within the card's 128 bytes per SM per clock",
    """
_got = shared_bandwidth()
assert isinstance(_got, float | int) and _got == _got, f"shared_bandwidth() returned {_got!r}"
assert _got <= 1.05 * _G_SHARED_PEAK, (
    f"shared_bandwidth() = {_got:,.0f} GB/s, past {_G_SHARED_PEAK:,.0f} GB/s, what {_G_SMS} SMs at "
    f"{_G_CLOCK / 1e9:.2f} GHz can read at 128 bytes per clock: the loads were optimized away or the bytes overcounted"
)
assert _got >= 0.3 * _G_SHARED_PEAK, (
    f"shared_bandwidth() = {_got:,.0f} GB/s, {_got / _G_SHARED_PEAK:.0%} of the {_G_SHARED_PEAK:,.0f} GB/s "
    "shared memory can deliver: bank conflicts, too few warps, or global memory in the loop"
)
""",
    2,
)

LAUNCH = check(
    "launch and graph-node costs against torch's own",
    """
_k = 2000


def _g_eager():
    for _ in range(_k):
        _gtorch.cuda._sleep(0)


_gtorch.cuda._sleep(0)
_gtorch.cuda.synchronize()
_g_graph = _gtorch.cuda.CUDAGraph()
with _gtorch.cuda.graph(_g_graph):
    for _ in range(_k):
        _gtorch.cuda._sleep(0)
_ref_launch = _g_ms(_g_eager, repeat=5, warmup=1) * 1e3 / _k
_ref_node = _g_ms(_g_graph.replay, repeat=10) * 1e3 / _k
_launch, _node = launch_us(), graph_node_us()
assert 0 < _node < _launch, (
    f"graph_node_us() = {_node:.3f} µs and launch_us() = {_launch:.3f} µs: a node of a replayed graph costs less "
    "than a launch from Python, and neither is free"
)
_g_band("launch_us()", _launch, _ref_launch, 0.25, 4.0, "µs")
_g_band("graph_node_us()", _node, _ref_node, 0.25, 4.0, "µs")
""",
    2,
)

H2D = check(
    "host-to-device copies against torch's own",
    """
_n = 192 << 20
_dst = _gtorch.empty(_n, dtype=_gtorch.uint8, device="cuda")
_refs = {}
for _pinned in (True, False):
    _src = _gtorch.ones(_n, dtype=_gtorch.uint8, pin_memory=_pinned)
    _refs[_pinned] = _n / (_g_ms(lambda: _dst.copy_(_src, non_blocking=True), repeat=8) * 1e-3) / 1e9
del _src, _dst
_g_band("h2d_gbps(True)", h2d_gbps(True), _refs[True], 0.6, 1.5, "GB/s")
_g_band("h2d_gbps(False)", h2d_gbps(False), _refs[False], 0.6, 1.5, "GB/s")
""",
    1,
)

ATOMICS = check(
    "atomics: one address is slower than many, and neither beats the SMs",
    """
_spread, _one = atomic_rate(True), atomic_rate(False)
_bound = _G_SMS * 32 * _G_CLOCK / 1e9  # one warp instruction of 32 atomics per SM per clock, at most
for _what, _v in (("atomic_rate(True)", _spread), ("atomic_rate(False)", _one)):
    assert isinstance(_v, float | int) and 0 < _v <= _bound, (
        f"{_what} = {_v!r} G/s: not a positive rate below {_bound:,.0f} G/s (32 per SM per clock)"
    )
assert _spread >= 2 * _one, (
    f"atomic_rate(True) = {_spread:.1f} G/s is not at least twice atomic_rate(False) = {_one:.2f} G/s: "
    "atomics to one address queue at one L2 slice, spread ones do not"
)
""",
    1,
)

# The mistakes these checks are designed to catch, each with the input or check that exposes it
# (lab2/solutions/broken.py has a variant of each).
MISTAKES = {
    "dead loads": "read_bandwidth checked against the card's DRAM peak",
    "host timer without sync": "read_bandwidth checked against the card's DRAM peak",
    "bank conflicts": "shared_read's bandwidth checked against 30% of 128 bytes per SM per clock",
}

TASK = NotebookTask(
    lab="lab2",
    number="09",
    title="the numbers every GPU programmer should know",
    mistakes=MISTAKES,
    sources=["09_numbers.ipynb"],
    checks=[HBM, L2, SHARED, LAUNCH, H2D, ATOMICS],
    cell_timeout=120,
    timeout=600,
    gpu=True,
)


def test_numbers(grade):
    grade(TASK)
