"""Judging one output against its reference: |got - ref| <= atol + rtol * |ref|, elementwise."""

from __future__ import annotations

from typing import TYPE_CHECKING

from grader.child.mismatch import describe

if TYPE_CHECKING:
    import torch


CHUNK = 1 << 26  # elements judged at a time: float64 temporaries of a 2^31-element output would not fit


def bad_mask(got: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> torch.Tensor:
    """True where got is wrong. NaN and Inf are right only where the reference has them too."""
    import torch

    ref = ref.to(got.device)  # a reference computed elsewhere (a host output's, on the GPU) is judged where got is
    if not got.dtype.is_floating_point:
        return got != ref.to(got.dtype)
    if got.numel() > CHUNK:
        g_flat, r_flat = got.reshape(-1), ref.reshape(-1)
        bad = torch.empty(got.numel(), dtype=torch.bool, device=got.device)
        for i in range(0, got.numel(), CHUNK):
            bad[i : i + CHUNK] = bad_mask(g_flat[i : i + CHUNK], r_flat[i : i + CHUNK], atol, rtol)
        return bad.view(got.shape)
    g = got.double()
    r = ref.double()
    close = (g - r).abs() <= atol + rtol * r.abs()
    same_special = (torch.isnan(g) & torch.isnan(r)) | (torch.isinf(r) & (g == r))
    return ~(close | same_special)


def judge(
    name: str, got: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float, never_written: torch.Tensor | None
) -> str | None:
    """None when the output is right, else a report for the student."""
    ref = ref.to(got.device)
    if tuple(ref.shape) != tuple(got.shape):
        ref = ref.reshape(got.shape)
    bad = bad_mask(got, ref, atol, rtol)
    if not bool(bad.any()):
        return None
    return describe(name, got, ref, bad, never_written, atol, rtol)


def past_tf32_bound(
    y: torch.Tensor, ref: torch.Tensor, x: torch.Tensor, w: torch.Tensor, pre: torch.Tensor, b: torch.Tensor
) -> str | None:
    """None when every element of y (B, out) is within the worst-case error of x (B, in) · wᵀ + b
    computed with TF32 inputs (10-bit mantissas, rounded either way) and float32 sums in any
    order, against ref (float64; pre is the sum before any epilogue such as a ReLU): each
    product off by 2^-9 of |x_k||w_k| at most, each of the in + 4 additions by 2^-23 of the
    running |sum|, and the final rounding of y and b. Else where the first element past it is."""
    size = x.double().abs() @ w.double().abs().T  # sum_k |x_k||w_k| per element
    n_in = x.shape[1]
    bound = (2.0**-9 + (n_in + 4) * 2.0**-23) * size + 2.0**-22 * (pre.abs() + b.double().abs())
    bad = ~((y.double() - ref).abs() <= bound)  # NaN (never written) counts as bad
    if not bool(bad.any()):
        return None
    r, c = divmod(int(bad.flatten().nonzero()[0]), y.shape[1])
    return (
        f"{int(bad.sum())} of {bad.numel()} elements are past the TF32 bound; the first, "
        f"y[{r}][{c}] = {float(y[r, c])!r}, expected {float(ref[r, c]):.6f} within {float(bound[r, c]):.2e}"
    )
