"""Lab 7's benchmark (lab7/bench_gpt.py, task 07) without a GPU: what it counts and reports.

- the model FLOPs of a GPT-2 small step (6 per matmul weight and token, causal attention's 6 L T C);
- the PyTorch baseline's model (torch_loss) on the CPU in float32 against task 06's reference
  model in its spec file, so the baseline times the same network;
- kernel names sorted into what they do (a log-softmax's "Epilogue" is not cuBLASLt's);
- the report from a results dict: speeds against eager and compile, the idle time from the timed
  step, the figure; the run's own checks (losses apart, a figure past the card) and the gate.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAB7 = ROOT / "lab7"
if str(LAB7) not in sys.path:
    sys.path.insert(0, str(LAB7))

import bench_gpt as bench  # noqa: E402 (after the path set-up above)


def test_gpt2_small_flops_per_token() -> None:
    C, L, V, T = 768, 12, 50304, 1024
    assert bench.matmul_parameters(bench.GPT2) == L * 12 * C * C + V * C == 123_568_128
    assert bench.flops_per_token(bench.GPT2) == 6 * 123_568_128 + 6 * L * T * C


def test_the_baseline_is_task_06s_model() -> None:
    torch = pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("spec06", LAB7 / "tests" / "test_06_gpt_step.py")
    assert spec and spec.loader
    spec06 = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(LAB7))
    spec.loader.exec_module(spec06)
    from gpt import model

    cfg = model.GPTConfig(vocab_size=64, context=16, n_layer=2, n_head=2, d_model=128)
    params = {n: t + 0.01 * torch.randn(t.shape) for n, t in model.init_parameters(cfg, seed=1).items()}
    gen = torch.Generator().manual_seed(2)
    idx, targets = (torch.randint(0, cfg.vocab_size, (3, 16), generator=gen) for _ in range(2))
    mine = bench.torch_loss(cfg, params, idx, targets)
    theirs = spec06.reference_loss(cfg, params, idx, targets)
    assert torch.allclose(mine, theirs, rtol=1e-5, atol=1e-6), (float(mine), float(theirs))


@pytest.mark.parametrize(
    ("kernel", "what"),
    [
        ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "matmuls"),
        ("void cublasLt::epilogue::impl::globalKernel<8, 32, __nv_bfloat16>", "matmul epilogues"),
        ("void cunn_SoftMaxForward<8, float, float, float, LogSoftMaxForwardEpilogue>", "loss"),
        ("void attention_backward_kernel<__nv_bfloat16, Bwd<64, 8, 64> >", "attention"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16", "attention"),
        ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, cutlass::bfloat16_t>>", "attention"),
        ("void cudnn::fusion::compute_dot_do_o_specialized<true, 64>", "attention"),
        ("void cublasLt::splitKreduce_kernel<32, 16, int, float>", "matmuls"),
        ("triton_red_fused_native_layer_norm_0", "layer norms"),
        ("void layernorm_backward_bf16_kernel<256>", "layer norms"),
        ("void multi_tensor_apply_kernel<FusedAdamMathFunctor>", "optimizer"),
        ("void at::native::elementwise_kernel<128, 4>", "copies and elementwise"),
    ],
)
def test_kernels_are_sorted_by_what_they_do(kernel: str, what: str) -> None:
    assert bench.category(kernel) == what


def engine(ms: float, losses: list[float], ours: bool = False) -> dict[str, Any]:
    parts = {"forward + backward": 0.9 * ms, "optimizer": 0.05 * ms} | ({"non-finite check": 0.01} if ours else {})
    kernels = {name: 0.1 * ms for name, _ in bench.CATEGORIES}
    return {"step_ms": ms, "parts_ms": parts, "first_step_s": 20.0, "losses": losses, "peak_memory_bytes": 10 << 30,
            "profile_ms": kernels}  # fmt: skip


def results(yours_ms: float = 40.0, yours_losses: list[float] | None = None, rate: float = 800e12) -> dict[str, Any]:
    r = {
        "date": "2026-11-29", "device": "a GPU", "shape": bench.GPT2, "batch": 16, "tokens_per_step": 16384,
        "warmup": 5, "steps": 20, "flops_per_token": bench.flops_per_token(bench.GPT2), "matmul_flops_per_s": rate,
        "engines": {
            "graphed": engine(yours_ms, yours_losses or [10.9, 9.0], ours=True),
            "yours": engine(yours_ms + 3.0, [10.9, 9.0], ours=True),
            "eager": engine(48.0, [10.9, 9.0]),
            "compiled": engine(36.0, [10.9, 9.05]),
        },
    }  # fmt: skip
    bench.add_derived(r)
    return r


def test_the_report_and_its_figure(tmp_path: Path) -> None:
    r = results()
    yours = r["engines"]["graphed"]
    assert yours["vs_eager"] == pytest.approx(48 / 40) and yours["vs_compiled"] == pytest.approx(36 / 40)
    assert yours["profile_ms"][bench.IDLE] == pytest.approx(40 - 0.1 * 40 * len(bench.CATEGORIES))
    text = bench.table(r, "figures/gpt2-step.png")
    assert "| yours, one CUDA graph (task 07) | 40.00 |" in text and "1.20×" in text
    assert "| yours, eager (task 06) | 43.00 |" in text
    assert "≥ 1.2× PyTorch eager: met" in text and "≥ 0.9× torch.compile: met" in text
    assert bench.check(r) == [] and bench.gate(r) == []
    pytest.importorskip("matplotlib")
    bench.plot(r, tmp_path / "step.png")
    assert (tmp_path / "step.png").stat().st_size > 1000


def test_a_wrong_or_impossible_run_is_no_result_and_a_slow_one_fails_the_gate() -> None:
    assert any("from eager's" in p for p in bench.check(results(yours_losses=[10.9, 9.5])))
    assert any("past the card's measured matmul rate" in p for p in bench.check(results(rate=100e12)))
    slow = results(yours_ms=48.0 / (bench.GATE_EAGER - 0.05))
    assert bench.gate(slow) and "under the gate" in bench.gate(slow)[0]
    assert "≥ 1.2× PyTorch eager: missed" in bench.table(slow)


def test_the_command_line() -> None:
    args = bench.parse_args(["--batch", "4", "--steps", "3", "--skip-compile"])
    assert (args.batch, args.steps, args.skip_compile, args.solutions) == (4, 3, True, False)
    with pytest.raises(SystemExit):
        bench.parse_args(["--batch", "0"])


# --- lab7/curve.py: task 06's loss curve, drawn ---------------------------------------------------------

import curve  # noqa: E402


def _curve(yours: list[float], pytorch: list[float]) -> dict[str, Any]:
    return {
        "date": "2026-11-29",
        "device": "a card",
        "solutions": True,
        "model": {"n_layer": 2, "n_head": 2, "d_model": 128, "context": 64},
        "batch": 4,
        "allowed": 0.01,
        "yours": yours,
        "pytorch": pytorch,
    }


def test_the_curve_uses_the_specs_reference_and_allowance() -> None:
    pytest.importorskip("torch")
    spec = curve.spec()
    assert spec.CURVE_RTOL == 0.01 and hasattr(spec.Reference, "step")


def test_the_curve_reports_its_farthest_step_and_fails_as_the_spec_does() -> None:
    good = _curve([6.0, 4.0, 3.0], [6.0, 4.02, 3.0])
    s = curve.summary(good)
    assert s["worst_step"] == 2 and s["worst"] == pytest.approx(0.02 / 4.02)
    assert curve.problems(_curve([6.0, 4.0, 3.0], [6.0, 4.03, 3.0])) == []  # 0.74%
    (far,) = curve.problems(_curve([6.0, 4.0, 3.0], [6.0, 4.1, 3.0]))
    assert far.startswith("step 2:") and "allowed 1%" in far
    (nan,) = curve.problems(_curve([6.0, float("nan"), 3.0], [6.0, 4.0, 3.0]))
    assert "not finite" in nan
    text = curve.text(good, "figures/loss-curve.png")
    assert "6.0000 → 3.0000 in 3 steps" in text and "at step 2" in text and "](figures/loss-curve.png)" in text


def test_the_curve_is_drawn(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "curve.png"
    curve.plot(_curve([6.0 - 0.01 * k for k in range(300)], [6.0 - 0.0101 * k for k in range(300)]), png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_chapter_has_the_curves_block() -> None:
    text = curve.README.read_text()
    assert text.count(curve.BEGIN) == 1 and text.count(curve.END) == 1
    assert text.index(curve.BEGIN) < text.index(curve.END)
