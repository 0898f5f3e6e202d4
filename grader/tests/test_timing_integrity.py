"""Timing that cannot be gamed: the buffer rotation, the per-call output checks, the card's limits
and the stream-cause message, on the CPU; a figure past the limits from a real run on the GPU."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest
import torch

from grader import paths, toolchain
from grader.child import cudalib, timing
from grader.child.buffers import PREFILL, guarded
from grader.child.compare import bad_mask, judge
from grader.records import CheckFailure, Verdict

# An H100 SXM as the driver describes it: 132 SMs at 1980 MHz, HBM3 at 2619 MHz on a 5120-bit bus.
H100 = {"cc": (9, 0), "sms": 132, "sm_clock_khz": 1_980_000, "mem_clock_khz": 2_619_000, "bus_bits": 5120}


def limits(**kw: float) -> timing.Limits:
    dram, fp32, tensor = timing.theoretical(**H100)
    base = {
        "copy_gbps": 3000.0,
        "read_gbps": 3100.0,
        "dram_gbps": dram,
        "fp32_gflops": fp32,
        "tensor_gflops": tensor,
        "l2_bytes": 50 << 20,
    }
    return timing.Limits(**(base | kw))  # type: ignore[arg-type]


# --- rotation ------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_every_call_sees_a_fresh_draw(k: int) -> None:
    """No two calls see the same inputs (a cache per pointer or per content never hits), and
    consecutive calls never share a buffer set when there are several."""
    rot = timing.Rotation(k)
    reps = range(6 * k)
    if k > 1:
        assert all(rot.slot(r) != rot.slot(r + 1) for r in reps)
    assert len({rot.draw(r) for r in reps}) == len(reps)
    assert all(rot.dataset(r) == rot.slot(r) for r in reps)
    assert [r for r in reps if rot.refresh_before(r)] == [r for r in reps if r >= k]  # every use but a slot's first


def test_buffer_sets_fit_the_memory() -> None:
    assert timing.choose_sets(1 << 30, 80 << 30) == timing.SETS
    assert timing.choose_sets(10 << 30, 40 << 30) == 2
    assert timing.choose_sets(50 << 30, 40 << 30) == 1  # then the per-call poison alone guards the timing
    assert timing.choose_sets(0, 0) == timing.SETS


# --- the check after every call -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_bounds_never_reject_what_the_judge_accepts(dtype: str) -> None:
    torch.manual_seed(0)
    ref = torch.randn(20000, dtype=torch.float64) * torch.logspace(-6, 6, 20000, dtype=torch.float64)
    ref[:3] = torch.tensor([float("inf"), float("-inf"), float("nan")])
    ref[3] = 0.0
    atol, rtol = (1e-5, 1e-5) if dtype == "f32" else (1e-3, 1e-3)
    b = timing.Bounds.of(ref, dtype, atol, rtol, (20000,))
    t = torch.float32 if dtype == "f32" else torch.float16
    for scale in (0.0, 0.5, 0.999, 1.0, 1.001, 2.0):
        noise = (atol + rtol * ref.abs()) * scale * torch.sign(torch.randn(20000, dtype=torch.float64))
        got = (ref + torch.nan_to_num(noise)).to(t)
        judged = bad_mask(got, ref, atol, rtol)
        x = got.float()
        ok = (x >= b.lo) & (x <= b.hi) | (b.nan_ok & torch.isnan(x))
        assert torch.equal(~ok, judged), (scale, int((~ok).sum()), int(judged.sum()))
        assert int(b.count_bad(got)) == int(judged.sum())
    assert judge("out", got, ref, atol, rtol, None) is not None


def test_poison_and_wrong_values_are_counted() -> None:
    ref = torch.arange(1000, dtype=torch.float64)
    b = timing.Bounds.of(ref, "f32", 1e-5, 1e-5, (1000,))
    g = guarded((1000,), "f32", "cpu")
    assert int(b.count_bad(g.data)) == 1000 and int(b.count_unwritten(g.data)) == 1000
    g.data.copy_(ref.float())
    assert int(b.count_bad(g.data)) == 0 and int(b.count_unwritten(g.data)) == 0
    g.data[7] += 1
    assert int(b.count_bad(g.data)) == 1


def test_integer_bounds_are_exact() -> None:
    ref = torch.randint(0, 1 << 20, (256,), dtype=torch.int64)
    b = timing.Bounds.of(ref, "u32", 0.0, 0.0, (256,))
    got = ref.to(torch.int32)
    assert int(b.count_bad(got)) == 0
    got[3] += 1
    assert int(b.count_bad(got)) == 1
    assert int(b.count_unwritten(torch.full((256,), PREFILL["u32"], dtype=torch.int32))) == 256


# --- the card's limits ----------------------------------------------------------------------------


def test_theoretical_peaks_from_driver_attributes() -> None:
    dram, fp32, tensor = timing.theoretical(**H100)
    assert dram == pytest.approx(3352.3, rel=1e-3)  # NVIDIA's datasheet: 3.35 TB/s
    assert fp32 == pytest.approx(66908, rel=1e-3)  # 67 TFLOP/s FP32
    assert tensor is not None and tensor > 1979e3  # above the FP8 dense peak: a bound, never a target
    assert timing.fp32_lanes(8, 0) == 64 and timing.fp32_lanes(8, 6) == 128 and timing.fp32_lanes(20, 0) is None
    assert timing.theoretical((20, 0), 100, 2_000_000, 0, 0) == (None, None, None)


def test_only_the_fp32_rate_is_reported_as_peak() -> None:
    # the tensor figure is the FP8 bound: "7% of peak" for an FP16 kernel at 15% of its rate misleads
    lim = limits()
    assert lim.rated_gflops("fp32") == lim.fp32_gflops
    assert lim.rated_gflops("tensor") is None and lim.peak_gflops("tensor") == lim.tensor_gflops


def test_a_figure_past_the_card_is_a_failed_measurement() -> None:
    lim = limits()
    n = (1 << 26) + 3  # lab 1's saxpy timing case: 12 bytes per element
    # the report that started it all: 11 times the copy bandwidth
    msg = lim.past(gbps=11 * 3000.0, gflops=None, bytes_moved=12 * n, written_bytes=4 * n, l2_reserved=False)
    assert msg is not None and "33000 GB/s" in msg and "3352 GB/s" in msg and "memory clock" in msg
    # an honest kernel at 93% of the DRAM peak is fine
    assert lim.past(gbps=0.93 * 3352, gflops=None, bytes_moved=12 * n, written_bytes=4 * n, l2_reserved=False) is None


def test_what_l2_can_hide_is_allowed() -> None:
    lim = limits()
    l2 = 50 << 20
    # a working set L2 could hold entirely: no DRAM limit applies
    assert lim.dram_ceiling(l2 // 2, written_bytes=l2 // 2, l2_reserved=False) is None
    # 64 MB read, 1 KB written (a histogram): L2 hides almost nothing, the ceiling is the DRAM peak
    hist = lim.dram_ceiling(64 << 20, written_bytes=1024, l2_reserved=False)
    assert hist == pytest.approx(3352.3 * timing.SLACK, rel=1e-3)
    # the same where code reserved persisting L2 lines (they survive the flush): L2's whole size
    reserved = lim.dram_ceiling(64 << 20, written_bytes=1024, l2_reserved=True)
    assert reserved is not None and reserved > 4 * hist
    assert lim.past(gbps=9000.0, gflops=None, bytes_moved=64 << 20, written_bytes=1024, l2_reserved=False)
    assert lim.past(gbps=9000.0, gflops=None, bytes_moved=64 << 20, written_bytes=1024, l2_reserved=True) is None


def test_flops_past_the_peak() -> None:
    lim = limits()
    msg = lim.past(gbps=None, gflops=90_000.0, bytes_moved=None)
    assert msg is not None and "FP32 peak is 66908 GFLOP/s" in msg
    assert lim.past(gbps=None, gflops=50_000.0, bytes_moved=None) is None
    assert lim.past(gbps=None, gflops=90_000.0, bytes_moved=None, flop_peak="tensor") is None
    unknown = limits(fp32_gflops=None)
    assert unknown.past(gbps=None, gflops=1e9, bytes_moved=None) is None  # no limit rather than a wrong one


def test_measured_bandwidth_raises_the_ceiling_never_lowers_it() -> None:
    no_attrs = limits(dram_gbps=None)
    ceiling = no_attrs.dram_ceiling(1 << 32, written_bytes=1 << 30, l2_reserved=False)
    assert ceiling is not None and 3100 < ceiling < 3600


# --- a private stream: the cause named ------------------------------------------------------------


def test_wrong_then_right_after_a_device_wide_wait_names_the_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: waited.append(True))
    state = {"judged": 0}

    def judge_() -> None:  # the kernel finishes only once the whole device was waited for
        state["judged"] += 1
        if not waited:
            raise CheckFailure(Verdict.WRONG, "`out`: 1000 of 1000 elements wrong")

    with pytest.raises(CheckFailure) as e:
        cudalib.judged_after_call(judge_, "saxpy, case n=67108867")
    assert e.value.verdict == Verdict.WRONG
    assert "a stream the grader does not wait on" in e.value.message and "default stream" in e.value.message
    assert state["judged"] == 2


def test_still_wrong_after_waiting_is_the_plain_mismatch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)

    def judge_() -> None:
        raise CheckFailure(Verdict.WRONG, "`out`: 3 of 1000 elements wrong")

    with pytest.raises(CheckFailure) as e:
        cudalib.judged_after_call(judge_, "saxpy")
    assert "3 of 1000" in e.value.message and "stream" not in e.value.message


# --- on the GPU: a figure past the card fails the task ----------------------------------------------

FIXTURE = paths.ROOT / "grader" / "tests" / "fixtures" / "ladder"


@pytest.mark.gpu
@pytest.mark.skipif(not toolchain.has_gpu(), reason="no NVIDIA GPU: the limits are measured on one")
def test_an_impossible_figure_fails_the_task(tmp_path) -> None:
    """The fixture's copy kernels with a spec that claims 1000 times the bytes they move: no kernel
    can be that fast, so the measurement is void and the task fails with its own message."""
    from grader.parent import runner
    from grader.tasks.catalogue import load_task

    (tmp_path / "tests").mkdir()
    spec = tmp_path / "tests" / "test_95_overstated.py"
    spec.write_text(
        textwrap.dedent(f"""
        import dataclasses, importlib.util
        s = importlib.util.spec_from_file_location("fixture_94", {str(FIXTURE / "tests" / "test_94_copy.py")!r})
        m = importlib.util.module_from_spec(s)
        s.loader.exec_module(m)
        TASK = dataclasses.replace(
            m.TASK,
            number="95",
            entries=[dataclasses.replace(e, bytes_moved=lambda v: 1000 * 8 * v["n"]) for e in m.TASK.entries[:1]],
            perf=[],
            ladder=None,
        )
        """)
    )
    assert importlib.util.spec_from_file_location("check", spec) is not None
    task = load_task(spec)
    (r,) = runner.grade([task], runner.Options(timing="quick", timeout=120), {task.task_id: FIXTURE / "94_copy.cu"})
    assert r.verdict == Verdict.WRONG, r.message
    assert "timing figure past what the card can do" in r.message and "GB/s" in r.message
    assert r.points == 0
