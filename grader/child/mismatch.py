"""Mismatch reports: how many elements are wrong, where, by how much, and the pattern.

A pattern names the usual bug: a grid that misses the tail, a guard on the wrong dimension, a
stride error, an output that was never written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SHOW = 5  # how many wrong elements are listed


def describe(
    name: str,
    got: torch.Tensor,
    ref: torch.Tensor,
    bad: torch.Tensor,
    never_written: torch.Tensor | None,
    atol: float,
    rtol: float,
) -> str:
    total = bad.numel()
    n_bad = int(bad.sum())
    lines = [f"`{name}`: {n_bad} of {total} elements wrong (tolerance {atol:g} + {rtol:g}·|expected|)"]
    unwritten = never_written & bad if never_written is not None else None
    n_unwritten = int(unwritten.sum()) if unwritten is not None else 0
    if n_unwritten == total:
        lines.append("pattern: output never written (it still holds the NaN/sentinel the grader filled it with)")
        return "\n".join(lines)
    if n_unwritten:
        lines.append(f"{n_unwritten} of them were never written (still the grader's fill value)")
    if total > BIG:  # past 2^26 elements: list the first wrong ones chunk by chunk, no pattern search
        return "\n".join(lines + _first_and_worst_in_chunks(got, ref, bad))
    pat = pattern(bad)
    if pat:
        lines.append(f"pattern: {pat}")
    idx = bad.nonzero()[:SHOW].tolist()
    g_flat, r_flat = got.reshape(got.shape), ref.reshape(got.shape)
    for i in idx:
        where = "[" + ", ".join(str(v) for v in i) + "]"
        lines.append(f"  at {where}: got {_fmt(g_flat[tuple(i)])}, expected {_fmt(r_flat[tuple(i)])}")
    if got.dtype.is_floating_point:
        err = (got.double() - ref.double()).abs()
        finite = bad & ~err.isnan()
        if bool(finite.any()):
            worst = float(err[finite].max())
            rel = float((err[finite] / ref.double().abs()[finite].clamp_min(1e-30)).max())
            lines.append(f"max abs error {worst:.3g}, max rel error {rel:.3g}")
    return "\n".join(lines)


BIG = 1 << 26


def _first_and_worst_in_chunks(got: torch.Tensor, ref: torch.Tensor, bad: torch.Tensor) -> list[str]:
    """The first wrong elements (flat indices) and the largest absolute error, without float64
    copies of a whole multi-GB output."""
    lines: list[str] = []
    g, r, b = got.reshape(-1), ref.reshape(-1), bad.reshape(-1)
    worst = 0.0
    for i in range(0, b.numel(), BIG):
        chunk = b[i : i + BIG]
        if not bool(chunk.any()):
            continue
        if len(lines) < SHOW:
            for j in chunk.nonzero().flatten()[: SHOW - len(lines)].tolist():
                lines.append(f"  at flat index {i + j}: got {_fmt(g[i + j])}, expected {_fmt(r[i + j])}")
        if got.dtype.is_floating_point:
            err = (g[i : i + BIG].double() - r[i : i + BIG].double()).abs()[chunk]
            err = err[~err.isnan()]
            if err.numel():
                worst = max(worst, float(err.max()))
    if worst:
        lines.append(f"max abs error {worst:.3g}")
    return lines


def _fmt(v: torch.Tensor) -> str:
    x = v.item()
    return f"{x:.7g}" if isinstance(x, float) else str(x)


def pattern(bad: torch.Tensor) -> str | None:
    """A one-line guess at the bug's shape, or None when the errors look scattered."""
    if bad.dim() == 1 or (bad.dim() == 2 and bad.shape[0] == 1):
        return _pattern_1d(bad.flatten())
    if bad.dim() == 2:
        return _pattern_2d(bad)
    return _pattern_1d(bad.flatten())


def _largest_block(i: int) -> int:
    """The largest power of two up to 1024 that divides i: a guess at the block size."""
    b = 1024
    while b > 1 and i % b:
        b //= 2
    return b


def _ordinal(k: int) -> str:
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suffix}"


def _pattern_1d(bad: torch.Tensor) -> str | None:
    n = bad.numel()
    idx = bad.nonzero().flatten()
    first, last, count = int(idx[0]), int(idx[-1]), idx.numel()
    if count == 1:
        return f"a single element (index {first}) of {n}"
    if count == last - first + 1 and last == n - 1:
        if first == 0:
            return "every element is wrong"
        block = _largest_block(first)
        tail = n - first
        if block >= 32 and tail < block:
            return (
                f"all errors in the last partial block: indices {first}..{n - 1} ({tail} elements "
                f"after the last full block of {block}) — does the grid cover all n elements?"
            )
        return f"every element from index {first} on is wrong ({tail} of {n}): the tail is not covered"
    if count == last - first + 1 and first == 0:
        return f"only the first {count} elements are wrong"
    for p in (256, 128, 64, 32, 16, 8, 4, 2):  # the largest stride that explains every error
        residues = (idx % p).unique()
        if residues.numel() == 1 and count >= max(2, (n // p) // 2):
            return (
                f"every {_ordinal(p)} element (indices ≡ {int(residues[0])} mod {p}): a stride or index-scaling error"
            )
    return None


def _pattern_2d(bad: torch.Tensor) -> str | None:
    rows, cols = bad.shape
    bad_rows = bad.any(dim=1).nonzero().flatten()
    bad_cols = bad.any(dim=0).nonzero().flatten()
    if bad.all():
        return "every element is wrong"
    r0, c0 = int(bad_rows[0]), int(bad_cols[0])
    if bool(bad[r0:, :].all()) and int(bad_rows[-1]) == rows - 1 and bad_rows.numel() == rows - r0:
        return f"only rows ≥ {r0} (of {rows}) are wrong, entirely: rows past a multiple of the block height are missed"
    if bool(bad[:, c0:].all()) and int(bad_cols[-1]) == cols - 1 and bad_cols.numel() == cols - c0:
        return f"only columns ≥ {c0} (of {cols}) are wrong, entirely: columns past a block-width multiple are missed"
    import torch

    r = torch.arange(rows, device=bad.device).unsqueeze(1)
    c = torch.arange(cols, device=bad.device).unsqueeze(0)
    border = (r >= rows - 3) | (c >= cols - 3)
    if not bool((bad & ~border).any()):
        return "errors only along the bottom/right border: check how windows are clipped at the edges"
    tile_edge = (r % 16 >= 13) | (c % 16 >= 13)
    if not bool((bad & ~tile_edge).any()):
        return "errors only near the right/bottom edge of each 16×16 tile: the halo is missing or loaded wrong"
    if bad_rows.numel() == rows and bad_cols.numel() < cols:
        return f"errors in columns {int(bad_cols[0])}..{int(bad_cols[-1])} only"
    if bad_cols.numel() == cols and bad_rows.numel() < rows:
        return f"errors in rows {int(bad_rows[0])}..{int(bad_rows[-1])} only"
    return _pattern_1d(bad.flatten())
