"""Judging one output against its reference: |got - ref| <= atol + rtol * |ref|, elementwise."""

from __future__ import annotations

from typing import TYPE_CHECKING

from grader.child.mismatch import describe

if TYPE_CHECKING:
    import torch


def bad_mask(got: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> torch.Tensor:
    """True where got is wrong. NaN and Inf are right only where the reference has them too."""
    import torch

    if not got.dtype.is_floating_point:
        return got != ref.to(got.dtype)
    g = got.double()
    r = ref.double()
    close = (g - r).abs() <= atol + rtol * r.abs()
    same_special = (torch.isnan(g) & torch.isnan(r)) | (torch.isinf(r) & (g == r))
    return ~(close | same_special)


def judge(
    name: str, got: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float, never_written: torch.Tensor | None
) -> str | None:
    """None when the output is right, else a report for the student."""
    if tuple(ref.shape) != tuple(got.shape):
        ref = ref.reshape(got.shape)
    bad = bad_mask(got, ref, atol, rtol)
    if not bool(bad.any()):
        return None
    return describe(name, got, ref, bad, never_written, atol, rtol)
