"""Lab 7 task 01's tolerances, on the CPU: what its spec's docstring claims, computed.

The spec (lab7/tests/test_01_cross_entropy.py) judges float32 outputs within 2e-6 + 1e-5·|ref|,
bf16 gradients within 2e-6 + 8e-3·|ref|, and the loss of logits near 1e4 within 4e-3. Here, with
the spec's own inputs and references, float32 computations in the kernel's form pass those
tolerances, with the summation orders an honest kernel may use (torch's sum; one long chain per
lane of a warp), while a sum kept in bf16 fails, and a loss formed as log-sum-exp minus x_t at
1e4 passes only the large-logits check's own tolerance. Calibration (tests/test_calibration.py)
already proves zeros, a pass-through and an fp16 round trip fail.
"""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from grader.child.compare import judge  # noqa: E402 - after the importorskip
from grader.tasks.spec import Rng  # noqa: E402

SPEC = Path(__file__).resolve().parents[1] / "lab7" / "tests" / "test_01_cross_entropy.py"


def _load(name: str, path: Path) -> ModuleType:
    """A task's spec file as a module of its own (each task's section below loads its spec with it)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


S = _load("lab7_cross_entropy_spec", SPEC)
SMALL = [s for s in S.SHAPES if s[0] * s[1] <= 1 << 21]


def _inputs(rows: int, v: int, bad: bool = False, inside: bool = False, mean: float = 0.0) -> dict[str, Any]:
    return S.make_inputs({"rows": rows, "V": v, "bad": bad, "inside": inside, "mean": mean}, Rng(7, "cpu"))


def _lane_chains(e: torch.Tensor, lanes: int) -> torch.Tensor:
    """Each row's sum as `lanes` float32 chains (lane l adds elements l, l + lanes, ... in order),
    then a butterfly of the lanes' sums: one warp per row."""
    rows, v = e.shape
    pad = (-v) % lanes
    chains = torch.nn.functional.pad(e, (0, pad)).view(rows, -1, lanes).cumsum(1, dtype=torch.float32)[:, -1]
    while chains.shape[1] > 1:
        chains = chains[:, ::2] + chains[:, 1::2]
    return chains[:, 0]


def kernel_form(
    v: dict[str, Any], dt: str, lanes: int = 0, bf16_sum: bool = False, lse_first: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, dlogits) as the kernel computes them, in float32: m, s = sum exp(x - m), the loss
    (m - x_t) + log s (or (m + log s) - x_t), dloss (exp(x - m) / s - onehot) rounded once."""
    x = v[f"logits_{dt}"].float()
    t, ignore = v["target"], v["ignore_index"]
    rows, n = x.shape
    valid = (t != ignore) & (t >= 0) & (t < n)
    tt = torch.where(valid, t, 0)
    m = x.max(1).values
    e = torch.exp(x - m[:, None])
    if bf16_sum:
        s = torch.zeros(rows, dtype=torch.bfloat16)
        for j in range(n):
            s = s + e[:, j].to(torch.bfloat16)
        s = s.float()
    else:
        s = _lane_chains(e, lanes) if lanes else e.sum(1)
    xt = x.gather(1, tt[:, None])[:, 0]
    loss = ((m + torch.log(s)) - xt) if lse_first else ((m - xt) + torch.log(s))
    grad = e / s[:, None]
    grad[torch.arange(rows), tt] -= 1.0
    grad = grad * v["dloss"][:, None]
    loss = torch.where(t == ignore, 0.0, torch.where(valid, loss, float("nan")))
    grad = torch.where((t == ignore)[:, None], 0.0, torch.where(valid[:, None], grad, float("nan")))
    return loss, grad.to(torch.bfloat16 if dt == "bf16" else torch.float32)


def _failures(v: dict[str, Any], dt: str, got: tuple[torch.Tensor, torch.Tensor], loss_atol: float = 0.0) -> list[str]:
    want = S.reference(v[f"logits_{dt}"], v["target"], v["dloss"], v["ignore_index"])
    f32 = S.TOLERANCE["f32"]
    tols = [(loss_atol or f32[0], f32[1]), S.TOLERANCE[dt]]
    out = []
    for name, g, w, tol in zip(("loss", "dlogits"), got, want, tols, strict=True):
        report = judge(name, g, w, *tol, None)
        if report:
            out.append(report)
    return out


@pytest.mark.parametrize("dt", S.DTYPES)
@pytest.mark.parametrize("shape", SMALL, ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_kernels_float32_form_passes(shape: tuple, dt: str) -> None:
    v = _inputs(*shape)
    assert _failures(v, dt, kernel_form(v, dt)) == []


@pytest.mark.parametrize("dt", S.DTYPES)
def test_one_warp_per_row_passes_at_the_longest_rows(dt: str) -> None:
    """Chains of 1000 float4s per lane (V = 128256 over 32 lanes): the honest alternative's order."""
    for rows, v_ in ((2, 128256), (3, 50257)):
        v = _inputs(rows, v_)
        assert _failures(v, dt, kernel_form(v, dt, lanes=32)) == []


def test_a_sum_kept_in_bf16_fails() -> None:
    v = _inputs(4, 4099)
    assert _failures(v, "bf16", kernel_form(v, "bf16", bf16_sum=True))


@pytest.mark.parametrize("dt", S.DTYPES)
def test_log_sum_exp_first_passes_the_large_logits_check(dt: str) -> None:
    """At 1e4, (m + log s) - x_t rounds to float32's spacing there: within the check's 4e-3, and the
    gradients are as exact as anywhere (x - m is)."""
    v = _inputs(8, 4099, mean=S.LARGE_MEAN)
    assert _failures(v, dt, kernel_form(v, dt, lse_first=True), loss_atol=S.LARGE_LOSS_ATOL) == []
    assert _failures(v, dt, kernel_form(v, dt), loss_atol=S.LARGE_LOSS_ATOL) == []


# --- task 02: layer norm and RMSNorm backward ---------------------------------------------------
#
# The spec (lab7/tests/test_02_norm_backward.py) judges float32 outputs (dx_f32, dweight, dbias)
# within 1e-5 + 2e-5·|ref| and bf16 dx within 1e-5 + 8e-3·|ref|, against its formula in float64.
# Here: that formula is autograd's gradient; the kernel's float32 form, with the reference's
# summation orders (per-lane chains, slices of rows, strided chains over the partial rows) and with
# one chain per column over every row, passes with a margin; a column sum kept in bf16, and each
# forgotten term, fails on the spec's own inputs.

NB_SPEC = Path(__file__).resolve().parents[1] / "lab7" / "tests" / "test_02_norm_backward.py"


NB = _load("lab7_norm_backward_spec", NB_SPEC)
NB_SMALL = [s for s in NB.SHAPES if s[0] * s[1] <= 1 << 16]


def _nb_inputs(rows: int, c: int) -> dict[str, Any]:
    return NB.make_inputs({"rows": rows, "C": c}, Rng(11, "cpu"))


def _chains(t: torch.Tensor, lanes: int, width: int) -> torch.Tensor:
    """Row sums of t (rows, C) as the kernel adds them: lane l owns the width-element vectors l,
    l + lanes, ... and adds them in one float32 chain, then the lanes' sums go through a tree."""
    rows, c = t.shape
    vecs = -(-c // width)
    k = -(-vecs // lanes)
    padded = torch.nn.functional.pad(t, (0, k * lanes * width - c)).view(rows, k, lanes, width)
    acc = torch.zeros(rows, lanes, dtype=torch.float32)
    for i in range(k):
        for e in range(width):
            acc = acc + padded[:, i, :, e]
    while acc.shape[1] > 1:
        acc = acc[:, ::2] + acc[:, 1::2]
    return acc[:, 0]


def _column_sums(t: torch.Tensor, per_slice: int, bf16: bool = False) -> torch.Tensor:
    """Column sums of t (rows, C) as the two stages add them: a float32 chain down each slice of
    per_slice rows (bf16: rounded after every addition), then 32 strided chains over the slices'
    partial rows and a tree of the 32."""
    rows, c = t.shape
    parts = []
    for first in range(0, rows, per_slice):
        acc = torch.zeros(c, dtype=torch.float32)
        for r in range(first, min(rows, first + per_slice)):
            acc = acc + t[r]
            if bf16:
                acc = acc.to(torch.bfloat16).float()
        parts.append(acc)
    p = torch.stack(parts)
    chains = torch.zeros(32, c, dtype=torch.float32)
    for b in range(p.shape[0]):
        chains[b % 32] = chains[b % 32] + p[b]
    while chains.shape[0] > 1:
        chains = chains[::2] + chains[1::2]
    return chains[0]


def nb_kernel_form(
    v: dict[str, Any],
    norm: str,
    dt: str,
    per_slice: int = 0,
    bf16_sums: bool = False,
    drop: str = "",
) -> dict[str, torch.Tensor]:
    """The outputs as the kernel computes them in float32 (the reference's team and slice sizes for
    the GPU of 132 SMs unless per_slice says otherwise; per_slice = rows: one chain per column);
    `drop` forgets one term: "mean", "xhat", "weight" or "saved mean"."""
    rows, c = v["rows"], v["C"]
    x, dy, w = v[f"x_{dt}"].float(), v[f"dy_{dt}"].float(), v[f"weight_{dt}"].float()
    if drop == "weight":
        w = torch.ones_like(w)
    if norm == "layernorm":
        mean = torch.zeros(rows) if drop == "saved mean" else v[f"mean_{dt}"]
        rstd = v[f"rstd_{dt}"]
        xhat = (x - mean[:, None]) * rstd[:, None]
    else:
        rstd = v[f"rms_rstd_{dt}"]
        xhat = x * rstd[:, None]
    g = dy * w
    width = 16 // (4 if dt == "f32" else 2) if c % (4 if dt == "f32" else 8) == 0 else 1
    lanes = 32 if c <= 768 else (256 if c <= 4096 else 1024)
    inv_c = torch.tensor(1.0 / c, dtype=torch.float32)
    a = _chains(g, lanes, width) * inv_c
    b = _chains(g * xhat, lanes, width) * inv_c
    if norm == "rmsnorm" or drop == "mean":
        a = torch.zeros_like(a)
    if drop == "xhat":
        b = torch.zeros_like(b)
    dx = rstd[:, None] * ((g - a[:, None]) - xhat * b[:, None])
    wave = 3 * 132 if c <= 768 else (4 * 132 if c <= 4096 else 132)
    per_slice = per_slice or -(-rows // min(NB.MAX_PARTIALS, wave))
    out = {
        f"dx_{dt}": dx.to(torch.float32 if dt == "f32" else torch.bfloat16),
        "dweight": _column_sums(dy * xhat, per_slice, bf16_sums),
    }
    if norm == "layernorm":
        out["dbias"] = _column_sums(dy, per_slice, bf16_sums)
    return out


def nb_worst(v: dict[str, Any], norm: str, dt: str, got: dict[str, torch.Tensor]) -> float:
    """The largest |got - ref| / (atol + rtol |ref|) over the outputs: <= 1 passes."""
    want = NB.entry_reference(norm, dt)(v)
    worst = 0.0
    for name, g in got.items():
        atol, rtol = NB.TOLERANCE[dt] if name.startswith("dx") else NB.TOLERANCE["f32"]
        r = want[name].double()
        ratio = ((g.double() - r).abs() / (atol + rtol * r.abs())).max()
        worst = max(worst, float(ratio))
    return worst


@pytest.mark.parametrize("norm", NB.NORMS)
def test_the_norm_formula_is_autograds_gradient(norm: str) -> None:
    """With the exact statistics, the spec's formula is the gradient of F.layer_norm / F.rms_norm."""
    v = _nb_inputs(7, 100)
    x = v["x_f32"].double().requires_grad_(True)
    w = v["weight_f32"].double().requires_grad_(True)
    b = torch.zeros(100, dtype=torch.float64, requires_grad=True)
    dy = v["dy_f32"].double()
    with torch.enable_grad():
        if norm == "layernorm":
            y = torch.nn.functional.layer_norm(x, (100,), w, b, eps=NB.EPS)
        else:
            y = torch.nn.functional.rms_norm(x, (100,), w, eps=NB.EPS)
        grads = torch.autograd.grad(y, (x, w, b) if norm == "layernorm" else (x, w), dy)
    xd = x.detach()
    mean = xd.mean(1)
    rstd = ((xd - mean[:, None]).square().mean(1) + NB.EPS).rsqrt()
    if norm == "rmsnorm":
        rstd = (xd.square().mean(1) + NB.EPS).rsqrt()
    got = NB.reference(norm, dy, xd, w.detach(), mean, rstd)
    torch.testing.assert_close(got["dx"], grads[0], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(got["dweight"], grads[1], rtol=1e-9, atol=1e-9)
    if norm == "layernorm":
        torch.testing.assert_close(got["dbias"], grads[2], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("dt", NB.DTYPES)
@pytest.mark.parametrize("norm", NB.NORMS)
@pytest.mark.parametrize("shape", [*NB_SMALL, (1000, 100), (3, 8195), (1, NB.MAX_C)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_norm_kernels_float32_form_passes_with_a_margin(shape: tuple[int, int], norm: str, dt: str) -> None:
    v = _nb_inputs(*shape)
    assert nb_worst(v, norm, dt, nb_kernel_form(v, norm, dt)) <= 0.5


@pytest.mark.parametrize("norm", NB.NORMS)
def test_long_column_sums_pass_in_any_float32_order(norm: str) -> None:
    """16411 rows: the reference's slices and one chain per column over every row both pass."""
    v = _nb_inputs(*NB.MANY_ROWS)
    assert nb_worst(v, norm, "f32", nb_kernel_form(v, norm, "f32")) <= 0.2
    assert nb_worst(v, norm, "f32", nb_kernel_form(v, norm, "f32", per_slice=NB.MANY_ROWS[0])) <= 0.5


@pytest.mark.parametrize("norm", NB.NORMS)
def test_column_sums_kept_in_bf16_fail(norm: str) -> None:
    v = _nb_inputs(600, 64)
    assert nb_worst(v, norm, "bf16", nb_kernel_form(v, norm, "bf16", bf16_sums=True)) > 10.0


@pytest.mark.parametrize("drop", ["mean", "xhat", "weight", "saved mean"])
@pytest.mark.parametrize("dt", NB.DTYPES)
def test_each_forgotten_term_fails(drop: str, dt: str) -> None:
    v = _nb_inputs(16, 768)
    assert nb_worst(v, "layernorm", dt, nb_kernel_form(v, "layernorm", dt, drop=drop)) > 1.0


# --- task 03: matmul backward through cuBLASLt's epilogues -------------------------------------
#
# The spec (lab7/tests/test_03_matmul_backward.py) judges every bf16 output within 1e-3 + 8e-3·|ref|
# against float64 products of the same bf16 inputs. Here, with its own inputs and references: the
# float32 form of what cuBLASLt computes (products and sums in float32, GELU's derivative in float32,
# one rounding to bf16) passes, with the CPU's blocked sums and with one float32 chain per sum; the
# erf GELU's derivative, a bias gradient summed in bf16, dh without GELU's backward and gelu' taken at
# the GELU's output all fail.

MB_SPEC = Path(__file__).resolve().parents[1] / "lab7" / "tests" / "test_03_matmul_backward.py"


MB = _load("lab7_matmul_backward_spec", MB_SPEC)
MB_SMALL = [s for s in MB.SHAPES if s[0] * s[1] * s[2] <= 1 << 21]  # the calibration's cases
MB_SHAPES = [*MB_SMALL, (5, 3072, 768)]


def _mb_inputs(n: int, k: int, m: int) -> dict[str, Any]:
    return MB.make_inputs({"N": n, "K": k, "M": m}, Rng(7, "cpu"))


def _chain(terms: torch.Tensor) -> torch.Tensor:
    """Σ over dim 0 as one float32 chain, in row order: the longest a sum of N rows can be."""
    return terms.float().cumsum(0, dtype=torch.float32)[-1]


def mb_kernel_form(
    v: dict[str, Any],
    chain: bool = False,
    erf: bool = False,
    bf16_db: bool = False,
    no_gelu: bool = False,
    gelu_at_output: bool = False,
    rounded_dh_summed: bool = True,
) -> dict[str, torch.Tensor]:
    """Both entries' outputs as cuBLASLt forms them, in float32, each rounded once to bf16; dbh the
    sum of dh as rounded to bf16 (what DGELU_BGRAD does on an H200)."""
    x, a, h, w, dy = (v[name].float() for name in ("x", "a", "h", "W", "dy"))
    g = dy @ w
    at = a if gelu_at_output else h
    if erf:
        grad = 0.5 * (1.0 + torch.erf(at / 2**0.5)) + at * torch.exp(-0.5 * at * at) / (2 * torch.pi) ** 0.5
    else:
        grad = MB.gelu_tanh_grad(at)
    dh = g if no_gelu else grad * g
    summed = dh.to(torch.bfloat16).float() if rounded_dh_summed else dh
    if chain:
        dw_x, dw_a = _chain(dy[:, :, None] * x[:, None, :]), _chain(dy[:, :, None] * a[:, None, :])
        db, dbh = _chain(dy), _chain(summed)
    else:
        dw_x, dw_a, db, dbh = dy.T @ x, dy.T @ a, dy.sum(0), summed.sum(0)
    if bf16_db:
        s = torch.zeros(dy.shape[1], dtype=torch.bfloat16)
        for row in v["dy"]:
            s = s + row
        db = s.float()
    bf = torch.bfloat16
    return {
        "dx": g.to(bf),
        "dW_x": dw_x.to(bf),
        "db": db.to(bf),
        "dh": dh.to(bf),
        "dW_a": dw_a.to(bf),
        "dbh": dbh.to(bf),
    }


def _mb_failures(v: dict[str, Any], got: dict[str, torch.Tensor]) -> list[str]:
    plain, gelu = MB.reference_plain(v), MB.reference_gelu(v)
    want = {"dx": plain["dx"], "dW_x": plain["dW"], "db": plain["db"], "dh": gelu["dh"], "dW_a": gelu["dW"]}
    want["dbh"] = gelu["dbh"]
    atol, rtol = MB.TOLERANCE["bf16"]
    return [r for name, w in want.items() if (r := judge(name, got[name], w, atol, rtol, None))]


def test_03_the_reference_is_torchs_tanh_gelu() -> None:
    """gelu_tanh and its derivative are torch's gelu(approximate="tanh") and autograd's gradient of it."""
    h = torch.linspace(-12, 12, 20001, dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.gelu(h, approximate="tanh")
    (g,) = torch.autograd.grad(y.sum(), h)
    assert torch.allclose(MB.gelu_tanh(h.detach()), y.detach(), rtol=0, atol=1e-14)
    assert torch.allclose(MB.gelu_tanh_grad(h.detach()), g, rtol=0, atol=1e-13)


@pytest.mark.parametrize("shape", MB_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_03_the_float32_form_passes(shape: tuple[int, int, int]) -> None:
    v = _mb_inputs(*shape)
    assert _mb_failures(v, mb_kernel_form(v)) == []


@pytest.mark.parametrize("shape", MB_SMALL, ids=lambda s: "x".join(map(str, s)))
def test_03_one_float32_chain_per_sum_passes(shape: tuple[int, int, int]) -> None:
    """The weight and bias gradients each summed over the rows in one float32 chain, in order."""
    v = _mb_inputs(*shape)
    assert _mb_failures(v, mb_kernel_form(v, chain=True)) == []


def test_03_the_erf_gelu_fails() -> None:
    """A reference (or an epilogue) of the erf GELU is 1% off gelu' near h = -2: past one bf16 unit."""
    v = _mb_inputs(130, 136, 72)
    assert any("`dh`" in r for r in _mb_failures(v, mb_kernel_form(v, erf=True)))


@pytest.mark.parametrize("shape", [(33, 64, 200), (130, 136, 72)], ids=lambda s: "x".join(map(str, s)))
def test_03_a_bias_gradient_summed_in_bf16_fails(shape: tuple[int, int, int]) -> None:
    v = _mb_inputs(*shape)
    assert any("`db`" in r for r in _mb_failures(v, mb_kernel_form(v, bf16_db=True)))


@pytest.mark.parametrize("shape", MB_SMALL, ids=lambda s: "x".join(map(str, s)))
def test_03_dh_without_gelus_backward_or_at_its_output_fails(shape: tuple[int, int, int]) -> None:
    v = _mb_inputs(*shape)
    assert any("`dh`" in r for r in _mb_failures(v, mb_kernel_form(v, no_gelu=True)))
    assert any("`dh`" in r for r in _mb_failures(v, mb_kernel_form(v, gelu_at_output=True)))


@pytest.mark.parametrize("shape", [(33, 64, 200), (130, 136, 72)], ids=lambda s: "x".join(map(str, s)))
def test_03_dbh_from_the_unrounded_dh_passes_from_33_rows(shape: tuple[int, int, int]) -> None:
    """A dbh summed from dh before its rounding to bf16 (the other honest order) stays within the
    tolerance where dbh is of order N in every column, by the spec's W."""
    v = _mb_inputs(*shape)
    assert _mb_failures(v, mb_kernel_form(v, rounded_dh_summed=False)) == []


# --- task 05: the multi-tensor AdamW ----------------------------------------------------------------
#
# Its spec (lab7/tests/test_05_adamw.py) judges float32 outputs within 1e-7 + 2e-6·|ref| and the bf16
# weights within 1e-7 + 4e-3·|ref|, against the contract's formulas in float64. Here: those formulas
# are torch.optim.AdamW's; a float32 kernel written two honest ways passes with a margin; each
# mistake the spec names for the arithmetic fails.

ADAMW = Path(__file__).resolve().parents[1] / "lab7" / "tests" / "test_05_adamw.py"


A = _load("lab7_adamw_spec", ADAMW)
ADAMW_SMALL = [c for c in A.CASES if A.layout(c[0])[2] <= 1 << 16]


def _adamw_inputs(name: str, step: int, lr: float, wd: float) -> dict[str, Any]:
    return A.make_inputs({"layout": name, "step": step, "lr": lr, "wd": wd}, Rng(11, "cpu"))


def adamw_kernel_form(
    x: dict[str, Any],
    bf16: bool = False,
    lerp: bool = False,
    eps_inside: bool = False,
    no_correction: bool = False,
    step_shift: int = 0,
    l2: bool = False,
    decay_twice: bool = False,
    decay_after: bool = False,
    bf16_state: bool = False,
    bf16_master: bool = False,
) -> dict[str, torch.Tensor]:
    """One step in float32 as a kernel computes it (bias corrections in double on the host, as the
    reference solution; `lerp`: m and v in torch's own form m + (1 - b1)(g - m)), or with one of the
    spec's mistakes. The gaps come back unchanged."""
    f = torch.float32
    lr, b1, b2, eps, wd = (A.f32(v) for v in A._hyper(x)[:5])
    step = x["step"] + step_shift
    g = (x["grads_bf16"] if bf16 else x["grads"]).to(f)
    p = (x["master"] if bf16 else x["params"]).clone()
    if bf16_master:
        p = p.to(torch.bfloat16).to(f)
    m, v = x["exp_avg"].clone(), x["exp_avg_sq"].clone()
    if l2:
        g = g + torch.tensor(wd, dtype=f) * p
    c1, c2 = torch.tensor(1.0 - b1, dtype=f), torch.tensor(1.0 - b2, dtype=f)
    if lerp:
        m1 = m + c1 * (g - m)
        v1 = v + c2 * (g * g - v)
    else:
        m1 = torch.tensor(b1, dtype=f) * m + c1 * g
        v1 = torch.tensor(b2, dtype=f) * v + c2 * (g * g)
    if bf16_state:
        m1, v1 = m1.to(torch.bfloat16).to(f), v1.to(torch.bfloat16).to(f)
    bc1 = 1.0 if no_correction else 1.0 - b1**step
    bc2 = 1.0 if no_correction else 1.0 - b2**step
    step_size = torch.tensor(lr / bc1 if bc1 else float("inf"), dtype=f)
    inv_sqrt_bc2 = torch.tensor(1.0 / bc2**0.5 if bc2 else float("inf"), dtype=f)
    decay = torch.tensor(1.0 - lr * wd, dtype=f)
    if eps_inside:
        denom = torch.sqrt(v1 * inv_sqrt_bc2 * inv_sqrt_bc2 + torch.tensor(eps, dtype=f))
    else:
        denom = torch.sqrt(v1) * inv_sqrt_bc2 + torch.tensor(eps, dtype=f)
    update = step_size * m1 / denom
    if decay_after:
        p1 = (p - update) * decay
    else:
        p1 = p * decay
        if decay_twice:
            p1 = p1 * decay
        p1 = p1 - update
    keep = A._mask(x)
    out = {
        "params": torch.where(keep, p1, p),
        "exp_avg": torch.where(keep, m1, m),
        "exp_avg_sq": torch.where(keep, v1, v),
    }
    if bf16:
        out["master"] = out.pop("params")
        out["weights"] = torch.where(keep, p1, torch.nan).to(torch.bfloat16)
    return out


def _adamw_failures(x: dict[str, Any], got: dict[str, torch.Tensor], bf16: bool = False) -> list[str]:
    want = A.entry_reference("adamw_bf16_master" if bf16 else "adamw_f32")(x)
    out = []
    for name, w in want.items():
        report = judge(name, got[name], w, *A.TOLERANCE["bf16" if name == "weights" else "f32"], None)
        if report:
            out.append(report)
    return out


@pytest.mark.parametrize("case", ADAMW_SMALL, ids=lambda c: A.case_label(*c))
def test_the_adamw_reference_is_torchs(case: tuple) -> None:
    """torch.optim.AdamW(foreach=False) in float64, its state set to the case's, gives the spec's
    reference: decay before the step, eps outside the root, corrections with the step."""
    x = _adamw_inputs(*case)
    tensors = [(o, s) for o, s in zip(x["offsets"].tolist(), x["sizes"].tolist(), strict=True) if s]
    p64, g64 = x["params"].double(), x["grads"].double()
    params = A.torch_parameters(p64, g64, x)
    opt = torch.optim.AdamW(
        params,
        lr=A.f32(x["lr"]),
        betas=(A.f32(A.BETA1), A.f32(A.BETA2)),
        eps=A.f32(A.EPS),
        weight_decay=A.f32(x["weight_decay"]),
        foreach=False,
    )
    for q, (o, s) in zip(params, tensors, strict=True):
        opt.state[q] = {
            "step": torch.tensor(float(x["step"] - 1)),
            "exp_avg": x["exp_avg"][o : o + s].double(),
            "exp_avg_sq": x["exp_avg_sq"][o : o + s].double(),
        }
    opt.step()
    want = A.entry_reference("adamw_f32")(x)
    for q, (o, s) in zip(params, tensors, strict=True):
        torch.testing.assert_close(q.detach(), want["params"][o : o + s], rtol=1e-13, atol=0)
        torch.testing.assert_close(opt.state[q]["exp_avg"], want["exp_avg"][o : o + s], rtol=1e-13, atol=0)
        torch.testing.assert_close(opt.state[q]["exp_avg_sq"], want["exp_avg_sq"][o : o + s], rtol=1e-13, atol=0)


@pytest.mark.parametrize("bf16", [False, True], ids=["f32", "bf16_master"])
@pytest.mark.parametrize("lerp", [False, True], ids=["fma_form", "lerp_form"])
@pytest.mark.parametrize("case", ADAMW_SMALL, ids=lambda c: A.case_label(*c))
def test_the_adamw_kernels_float32_form_passes(case: tuple, lerp: bool, bf16: bool) -> None:
    x = _adamw_inputs(*case)
    assert _adamw_failures(x, adamw_kernel_form(x, bf16=bf16, lerp=lerp), bf16) == []


def test_the_adamw_tolerance_has_a_margin() -> None:
    """The float32 form's worst error, over its allowance, stays below 1/3 (the docstring's 10x
    margin, less what the cancellations eat)."""
    worst = 0.0
    for case in ADAMW_SMALL:
        x = _adamw_inputs(*case)
        got = adamw_kernel_form(x)
        want = A.entry_reference("adamw_f32")(x)
        atol, rtol = A.TOLERANCE["f32"]
        for name, w in want.items():
            worst = max(worst, float(((got[name].double() - w).abs() / (atol + rtol * w.abs())).max()))
    assert 0.0 < worst < 1 / 3, worst


ADAMW_MISTAKES = {
    "eps inside the root": ({"eps_inside": True}, ("tails", 1, 1e-3, 0.1)),
    "no bias correction": ({"no_correction": True}, ("tails", 1000, 6e-4, 0.0)),
    "step off by one": ({"step_shift": -1}, ("tails", 3, 3e-2, 0.3)),
    "L2 decay": ({"l2": True}, ("tails", 1, 1e-3, 0.1)),
    "decay twice": ({"decay_twice": True}, ("tiny x300", 10, 1e-3, 0.1)),
    "decay after the update": ({"decay_after": True}, ("tails", 3, 3e-2, 0.3)),
    "bf16 state": ({"bf16_state": True}, ("tails", 1000, 6e-4, 0.0)),
}


@pytest.mark.parametrize("mistake", ADAMW_MISTAKES)
def test_each_adamw_mistake_fails(mistake: str) -> None:
    kwargs, case = ADAMW_MISTAKES[mistake]
    x = _adamw_inputs(*case)
    assert _adamw_failures(x, adamw_kernel_form(x, **kwargs))


def test_a_master_rounded_to_bf16_fails() -> None:
    x = _adamw_inputs("tails", 1, 1e-3, 0.1)
    assert _adamw_failures(x, adamw_kernel_form(x, bf16=True, bf16_master=True), bf16=True)


def test_decay_after_the_update_hides_in_rounding_where_lr_wd_is_small() -> None:
    """Why the spec needs its lr = 3e-2, wd = 0.3 case: at lr = 1e-3, wd = 0.1 the difference the
    mistake makes (lr^2 wd |u| <= 1e-7) is no larger than the tolerance's absolute term, so whether
    the judge sees it depends on the roundings of the day (one element in 35180 crossed it with
    torch 2.14, none with 2.13): the mistake would go unseen or be seen by chance."""
    x = _adamw_inputs("tails", 1, 1e-3, 0.1)
    right, wrong = adamw_kernel_form(x), adamw_kernel_form(x, decay_after=True)
    atol, rtol = A.TOLERANCE["f32"]
    gap = (wrong["params"] - right["params"]).abs() / (atol + rtol * right["params"].abs())
    assert 0 < gap.max().item() <= 1.5, f"the mistake moves a parameter by {gap.max().item():.3g} tolerances"


# --- task 04: flash attention backward ---------------------------------------------------------------
#
# Its spec (lab7/tests/test_04_attention_backward.py) judges every output within 6u + 2u·|ref| (u =
# 2^-11 for float16, 2^-8 for bfloat16) against the contract's maths in float64 on the inputs as
# given. Here, with its own inputs and references on the CPU: that maths is autograd's gradient of
# softmax attention; the kernel's form (S in float32, P = exp2(S c - LSE log2 e) in float32, P and dS
# rounded to the type as mma operands, float32 products, outputs rounded once) passes with a margin
# of 2; each mistake the spec names for the arithmetic fails; 16-bit running sums fail on long causal
# rows; a bfloat16 path through float16 passes at the usual scale and overflows at dO times 2^17
# (the reason for the check past_fp16_range).

FA_SPEC = Path(__file__).resolve().parents[1] / "lab7" / "tests" / "test_04_attention_backward.py"


FA = _load("lab7_attention_backward_spec", FA_SPEC)
FA_CASES = [c.params for c in FA.CASES if c.params["T"] <= 1024]
LOG2E32 = torch.tensor(1.4426950408889634, dtype=torch.float32)


def _fa_id(p: dict[str, Any]) -> str:
    return FA.label(p["BH"], p["T"], p["D"], p["causal"], p.get("large", False))


def _fa_inputs(p: dict[str, Any]) -> dict[str, Any]:
    return FA.make_inputs(p, Rng(7, "cpu"))


def fa_kernel_form(v: dict[str, Any], dt: str, mistake: str = "") -> dict[str, torch.Tensor]:
    """The entry's outputs as the reference kernel computes them, in float32 on the CPU, or with one
    of the spec's mistakes."""
    x = FA.HALF[dt]
    e = torch.float16 if dt == "f16" else torch.bfloat16
    q, k, val, o, do = (v[f"{n}{x}"].float() for n in ("Q", "K", "V", "O", "dO"))
    t, d = q.shape[1], q.shape[2]
    scale = torch.tensor(1.0 / d**0.5, dtype=torch.float32)
    s = q @ k.transpose(1, 2)
    if mistake == "exp then divide":
        p = torch.exp2(s * (scale * LOG2E32)) / torch.exp2(v[f"LSE{x}"] * LOG2E32)[..., None]
    else:
        lse2 = v[f"LSE{x}"] if mistake == "LSE in log2 units" else v[f"LSE{x}"] * LOG2E32
        p = torch.exp2(s * (scale * LOG2E32) - lse2[..., None])
    if v["causal"]:
        p = p.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(2 if mistake == "mask off by one" else 1), 0.0)
        if mistake == "causal skip":  # blocks of 128 keys start at the tile of 64 queries that holds their last key
            for k0 in range(0, t, 128):
                first = (k0 + 127) // 64 * 64
                p[:, :first, k0 : k0 + 128] = 0.0
    delta = (do * o).sum(-1)
    if mistake == "Delta missing":
        delta = torch.zeros_like(delta)

    def rounded(a: torch.Tensor) -> torch.Tensor:
        if mistake == "bf16 through fp16" and e == torch.bfloat16:
            a = a.half().float()
        return a.to(e).float()

    if mistake == "16-bit sums":  # dV's running sum rounded to the type after every 16 queries
        dv = torch.zeros(q.shape[0], t, d)
        for i in range(0, t, 16):
            dv = rounded(dv + rounded(p[:, i : i + 16]).transpose(1, 2) @ do[:, i : i + 16])
    else:
        dv = rounded(p).transpose(1, 2) @ do
    ds = rounded(p * (do @ val.transpose(1, 2) - delta[..., None]))
    dq32 = scale * (ds @ k)
    dk = (1.0 if mistake == "dK unscaled" else scale) * (ds.transpose(1, 2) @ q)
    out = {f"dQ{x}": rounded(dq32), f"dK{x}": rounded(dk), f"dV{x}": rounded(dv), "dQ32": dq32, "Delta": delta}
    if mistake == "dQ and dK swapped":
        out[f"dQ{x}"], out[f"dK{x}"] = out[f"dK{x}"], out[f"dQ{x}"]
    if mistake == "zeros":
        out = {name: torch.zeros_like(a) for name, a in out.items()}
    return out


def fa_worst(v: dict[str, Any], dt: str, got: dict[str, torch.Tensor], mul: float = 1.0) -> float:
    """The largest |got - ref| / (atol + rtol |ref|) over the entry's outputs (inf for a NaN or inf)."""
    atol, rtol = FA.TOLERANCE[dt]
    worst = 0.0
    for name, want in FA.entry_reference(dt)(v).items():
        w = want.double() * mul
        err = (got[name].double() - w).abs() / (atol * mul + rtol * w.abs())
        worst = max(worst, float(err.nan_to_num(nan=float("inf")).max()))
    return worst


@pytest.mark.parametrize("causal", [0, 1])
def test_04_the_reference_is_autograds_gradient(causal: int) -> None:
    """The spec's maths (P from LSE, Delta from O) with the exact LSE and O is autograd's gradient."""
    g = torch.Generator().manual_seed(3)
    q, k, v, do = (torch.randn(2, 37, 64, generator=g, dtype=torch.float64) for _ in range(4))
    leaves = [a.clone().requires_grad_(True) for a in (q, k, v)]
    s = leaves[0] @ leaves[1].transpose(1, 2) / 8.0
    if causal:
        s = s.masked_fill(torch.ones(37, 37, dtype=torch.bool).triu(1), float("-inf"))
    o = torch.softmax(s, -1) @ leaves[2]
    o.backward(do)
    got = FA.gradients(q, k, v, o.detach(), do, torch.logsumexp(s.detach(), -1), causal)
    for name, leaf in zip(("dQ", "dK", "dV"), leaves, strict=True):
        assert torch.allclose(got[name].double(), leaf.grad, atol=1e-6, rtol=1e-6), name


@pytest.mark.parametrize("dt", ["f16", "bf16"])
@pytest.mark.parametrize("p", FA_CASES, ids=_fa_id)
def test_04_the_kernels_form_passes_with_a_margin(p: dict[str, Any], dt: str) -> None:
    v = _fa_inputs(p)
    assert fa_worst(v, dt, fa_kernel_form(v, dt)) < 0.5


FA_MISTAKES = {
    "zeros": {"BH": 2, "T": 17, "D": 64, "causal": 1},
    "dQ and dK swapped": {"BH": 2, "T": 17, "D": 128, "causal": 0},
    "dK unscaled": {"BH": 2, "T": 17, "D": 64, "causal": 1},
    "LSE in log2 units": {"BH": 2, "T": 17, "D": 128, "causal": 0},
    "Delta missing": {"BH": 1, "T": 1, "D": 64, "causal": 0},
    "mask off by one": {"BH": 2, "T": 17, "D": 64, "causal": 1},
    "causal skip": {"BH": 2, "T": 200, "D": 64, "causal": 1},
    "exp then divide": {"BH": 4, "T": 1024, "D": 64, "causal": 0, "large": True},
}


@pytest.mark.parametrize("dt", ["f16", "bf16"])
@pytest.mark.parametrize("mistake", FA_MISTAKES)
def test_04_each_mistake_fails(mistake: str, dt: str) -> None:
    v = _fa_inputs(FA_MISTAKES[mistake])
    assert fa_worst(v, dt, fa_kernel_form(v, dt, mistake)) > 2.0


@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_04_16_bit_sums_fail_on_long_causal_rows(dt: str) -> None:
    v = _fa_inputs({"BH": 1, "T": 1000, "D": 128, "causal": 1})
    assert fa_worst(v, dt, fa_kernel_form(v, dt, "16-bit sums")) > 1.0


def test_04_a_bf16_path_through_fp16_passes_until_past_fp16_range() -> None:
    p = {"BH": 2, "T": 200, "D": 64, "causal": 1}
    v = _fa_inputs(p)
    assert fa_worst(v, "bf16", fa_kernel_form(v, "bf16", "bf16 through fp16")) < 0.5
    big = {**v, "dOb": v["dOb"] * FA.PAST_FP16}
    assert fa_worst(v, "bf16", fa_kernel_form(big, "bf16"), FA.PAST_FP16) < 0.5  # an honest kernel scales
    assert fa_worst(v, "bf16", fa_kernel_form(big, "bf16", "bf16 through fp16"), FA.PAST_FP16) == float("inf")


# --- task 06: the training step's loss curve against PyTorch's, within 1% ----------------------------
#
# The spec (lab7/tests/test_06_gpt_step.py) asks every step's loss of 300 to be within 1% of a plain
# PyTorch run of the same model from the same bf16 weights on the same batches. The two runs differ
# only in rounding: the order of the matmuls' sums, where the attention backwards round P and dS,
# the optimizers' float32 arithmetic. The claim is that such differences do not grow into 1% over
# 300 steps. A CPU twin of the model (GPT-2-shaped: learned positions, pre-LN blocks, tanh GELU,
# tied output layer, AdamW with decay on the 2-D weights, the task's schedule), small enough to
# train twice in seconds, rounds every operation's result and every gradient to bf16; one run
# computes in float32, the other in float64, so that hundreds of thousands of bf16 roundings a step
# land differently. On lab 5's stories (bytes as tokens) the loss falls from 4.84 to 2.64, and the
# curves stay within 0.05% of each other (0.13% with batch 8 of context 32, which takes minutes):
# the check asks for 0.25%, a quarter of the spec's tolerance.
#
# Then the model's shapes against the kernels' contracts, from lab7/gpt (given code): the default
# model meets tasks 02-05's rules, every tensor of the arena starts on the 16-byte grid, and a
# model that breaks a rule is refused before anything runs.

LAB7 = Path(__file__).resolve().parents[1] / "lab7"
TWIN = {"layers": 2, "C": 32, "heads": 2, "T": 16, "B": 8, "V": 128, "steps": 300}


class _Bf16(torch.autograd.Function):
    """bf16 storage: the value rounded on the way forward, its gradient on the way back."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        return x.to(torch.bfloat16).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, g: Any) -> Any:
        return g.to(torch.bfloat16).to(g.dtype)


def _twin_losses(dtype: Any) -> list[float]:
    """The twin's 300 losses, every operation computed in `dtype` and rounded to bf16."""
    import math
    import sys

    import torch.nn.functional as F  # noqa: N812 - torch's own spelling

    sys.path.insert(0, str(LAB7.parent / "lab5"))
    from tiny.corpus import corpus

    L, C, H, T, B, V = (TWIN[k] for k in ("layers", "C", "heads", "T", "B", "V"))  # noqa: N806 - nanoGPT's names
    steps, warmup, lr = TWIN["steps"], 20, 1e-3
    data = torch.tensor(list(corpus(400, 0).encode("ascii", "replace")), dtype=torch.int64)
    gen = torch.Generator().manual_seed(0)
    shapes: dict[str, tuple[int, ...]] = {"wte": (V, C), "wpe": (T, C)}
    for i in range(L):
        shapes |= {f"{i}.ln1.w": (C,), f"{i}.ln1.b": (C,), f"{i}.attn.w": (3 * C, C), f"{i}.attn.b": (3 * C,)}
        shapes |= {f"{i}.proj.w": (C, C), f"{i}.proj.b": (C,), f"{i}.ln2.w": (C,), f"{i}.ln2.b": (C,)}
        shapes |= {f"{i}.fc.w": (4 * C, C), f"{i}.fc.b": (4 * C,), f"{i}.out.w": (C, 4 * C), f"{i}.out.b": (C,)}
    shapes |= {"lnf.w": (C,), "lnf.b": (C,)}
    master = {}
    for n, s in shapes.items():
        if len(s) == 1:
            master[n] = torch.ones(s) if ".ln" in f".{n}" and n.endswith(".w") else torch.zeros(s)
        else:
            std = 0.02 / math.sqrt(2 * L) if n.endswith(("proj.w", "out.w")) else 0.02
            master[n] = torch.randn(s, generator=gen) * std
    groups = [
        {"params": [t for t in master.values() if t.dim() >= 2], "weight_decay": 0.1},
        {"params": [t for t in master.values() if t.dim() < 2], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    r = _Bf16.apply
    losses = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # hundreds of tiny ops a step: one thread is the fastest here
    try:
        for step in range(1, steps + 1):
            starts = torch.randint(0, data.numel() - T - 1, (B,), generator=torch.Generator().manual_seed(step))
            rows = data[starts[:, None] + torch.arange(T + 1)]
            x, y = rows[:, :-1], rows[:, 1:]
            w = {n: r(t.to(dtype)).requires_grad_() for n, t in master.items()}  # the bf16 weights
            h = r(F.embedding(x, w["wte"]) + w["wpe"])
            for i in range(L):
                a = r(F.layer_norm(h, (C,), w[f"{i}.ln1.w"], w[f"{i}.ln1.b"]))
                qkv = r(F.linear(a, w[f"{i}.attn.w"], w[f"{i}.attn.b"]))
                q, k, v = qkv.view(B, T, 3, H, C // H).permute(2, 0, 3, 1, 4)
                o = r(F.scaled_dot_product_attention(q, k, v, is_causal=True)).transpose(1, 2).reshape(B, T, C)
                h = r(h + r(F.linear(o, w[f"{i}.proj.w"], w[f"{i}.proj.b"])))
                a = r(F.layer_norm(h, (C,), w[f"{i}.ln2.w"], w[f"{i}.ln2.b"]))
                u = r(F.gelu(r(F.linear(a, w[f"{i}.fc.w"], w[f"{i}.fc.b"])), approximate="tanh"))
                h = r(h + r(F.linear(u, w[f"{i}.out.w"], w[f"{i}.out.b"])))
            logits = r(F.linear(r(F.layer_norm(h, (C,), w["lnf.w"], w["lnf.b"])), w["wte"]))
            loss = F.cross_entropy(logits.view(B * T, V), y.reshape(-1))
            loss.backward()
            progress = (step - warmup) / (steps - warmup)
            rate = lr * step / warmup if step <= warmup else lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))
            for group in opt.param_groups:
                group["lr"] = rate
            for n, t in master.items():
                t.grad = w[n].grad.to(torch.bfloat16).float()  # bf16 gradients, float32 master
            opt.step()
            losses.append(loss.item())
    finally:
        torch.set_num_threads(threads)
    return losses


def test_06_two_runs_that_differ_in_rounding_stay_within_a_quarter_of_the_tolerance() -> None:
    a, b = _twin_losses(torch.float32), _twin_losses(torch.float64)
    worst = max(abs(p - q) / q for p, q in zip(a, b, strict=True))
    assert b[-1] < 0.7 * b[0], f"the twin did not learn: {b[0]:.3f} -> {b[-1]:.3f}"
    assert a != b, "the two runs rounded alike: the twin tests nothing"
    assert worst <= 0.25e-2, f"the curves drift {100 * worst:.3f}% apart, past a quarter of the spec's 1%"


def _gpt() -> tuple[Any, Any]:
    import sys

    if str(LAB7) not in sys.path:
        sys.path.insert(0, str(LAB7))
    from gpt import model, train

    return model, train


def test_06_the_model_meets_the_kernels_contracts() -> None:
    model, train = _gpt()
    cfg = model.GPTConfig()
    cfg.check_shapes()
    assert cfg.head_dim == 64 and cfg.vocab_size % 8 == 0 and cfg.d_model % 8 == 0
    slots, n = train.layout(model.parameter_shapes(cfg))
    assert all(s.offset % 8 == 0 for s in slots), "a bf16 tensor off the 16-byte grid (task 03 refuses it)"
    assert all(a.offset + a.size <= b.offset for a, b in itertools.pairwise(slots)), "overlapping slots"
    assert len(slots) <= 4096 and slots[-1].offset + slots[-1].size <= n  # task 05's MAX_TENSORS
    assert 3_000_000 < n < 4_000_000, f"{n} parameters: the chapter says 3.4M"
    need = train.memory_needed(cfg, train.TrainConfig())
    assert need < 2 << 30, f"the default run is estimated at {need / 2**30:.1f} GiB"
    assert train.memory_needed(cfg, train.TrainConfig(batch=1 << 20)) > 1 << 40  # the spec's refused run


@pytest.mark.parametrize(
    ("change", "words"),
    [({"d_model": 256, "n_head": 8}, "head dimension 32"), ({"vocab_size": 500}, "vocab_size 500"),
     ({"d_model": 32768, "n_head": 256}, "16384")],
)  # fmt: skip
def test_06_a_model_that_breaks_a_contract_is_refused(change: dict[str, int], words: str) -> None:
    model, _ = _gpt()
    with pytest.raises(ValueError, match=words):
        model.GPTConfig(**change).check_shapes()
