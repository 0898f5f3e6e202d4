"""Legal pointers that are not 256-byte aligned, for the checks of lab 3's CUDA tasks.

torch's caching allocator starts every block on a 512-byte boundary, so every tensor the cases
make is as aligned as cuBLAS(Lt), CUTLASS and float4 loads like it best. A view that starts a few
elements into its storage (`t[1:]`, a row of a larger matrix) is an equally legal float pointer,
and the contracts that take any float pointer are held to it here: each pointer argument is a copy
at an element offset of 1, 2 or 3 (4 to 12 bytes past a 16-byte boundary), and each output is
fenced by a poison on both sides. A kernel that loads 16 bytes at a time from such a pointer
faults with "misaligned address"; a library told nothing about the alignment may pick a kernel
that does, or refuse the call.

Not a spec: the checks of lab3/tests/test_02, 03 and 05 import it when they run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from grader.tasks.spec import Buffer, torch_dtype

if TYPE_CHECKING:
    import torch

    from grader.child.context import RunContext

OFFSETS = (1, 3, 2)  # elements past an aligned address, one per pointer argument in turn
FENCE = 64  # poisoned elements after each output
POISON_INT = -7


def shifted(t: torch.Tensor, offset: int) -> torch.Tensor:
    """A contiguous copy of `t` that starts `offset` elements into its own allocation."""
    import torch

    flat = torch.empty(t.numel() + offset, dtype=t.dtype, device=t.device)
    view = flat[offset:].view(t.shape)
    view.copy_(t)
    return view


def _poisoned(shape: tuple[int, ...], dtype: torch.dtype, offset: int, device: str) -> torch.Tensor:
    """A flat buffer of poison with room for `shape` at `offset` and FENCE elements after it."""
    import torch

    n = 1
    for s in shape:
        n *= s
    fill = float("nan") if dtype.is_floating_point else POISON_INT
    return torch.full((offset + n + FENCE,), fill, dtype=dtype, device=device)


def _untouched(t: torch.Tensor) -> bool:
    import torch

    return bool(torch.isnan(t).all()) if t.is_floating_point() else bool((t == POISON_INT).all())


def call_unaligned(
    ctx: RunContext,
    symbol: str,
    values: Mapping[str, Any],
    expected: Mapping[str, torch.Tensor],
    atol: float,
    where: str,
    offsets: tuple[int, ...] = OFFSETS,
) -> None:
    """Calls the entry point `symbol` with every device pointer argument at an element offset
    (`offsets`, in turn), then fails the check when an output differs from `expected` by more than
    `atol` (integers exactly), was not written, or when anything around an output was written."""
    import torch

    args: dict[str, Any] = dict(values)
    outs: dict[str, tuple[torch.Tensor, int, torch.Tensor]] = {}  # name -> (flat buffer, offset, view)
    buffers = [a for a in ctx.task.entry(symbol).args if isinstance(a, Buffer) and not a.host]
    for i, arg in enumerate(buffers):
        offset = offsets[i % len(offsets)]
        if arg.role == "in":
            args[arg.name] = shifted(values[arg.name], offset)
            continue
        shape = tuple(expected[arg.name].shape)
        flat = _poisoned(shape, torch_dtype(arg.dtype), offset, "cuda")
        view = flat[offset : offset + expected[arg.name].numel()].view(shape)
        if arg.role == "inout":
            view.copy_(values[arg.name].reshape(shape))
        args[arg.name] = view
        outs[arg.name] = (flat, offset, view)
    ctx.check_rc(symbol, ctx.entry(symbol)(args), where)
    torch.cuda.synchronize()
    for name, (flat, offset, view) in outs.items():
        n = view.numel()
        if not (_untouched(flat[:offset]) and _untouched(flat[offset + n :])):
            ctx.fail(f"{symbol}, {where}: wrote out of bounds, just before or after `{name}`")
        want = expected[name].to(view.device)
        if view.is_floating_point():
            bad = ~((view.double() - want.double()).abs() <= atol)  # NaN (never written) counts as bad
        else:
            bad = view != want
        if bool(bad.any()):
            i = int(bad.flatten().nonzero()[0])
            ctx.fail(
                f"{symbol}, {where}: {int(bad.sum())} of {n} elements of `{name}` wrong (first at flat index {i}: "
                f"{view.flatten()[i].item()!r}, expected {want.flatten()[i].item()!r}"
                + (f" within {atol:g}" if view.is_floating_point() else "")
                + "). Every pointer was 4 to 12 bytes past a 16-byte boundary, as a torch view may be: the contract "
                "takes any float pointer"
            )
