"""The most common task shape in one call: an output computed element by element.

A spec then states only what is specific to it, in the style of tinygrad's `helper_test_op`:

    TASK = elementwise(
        lab="lab1", number="01", title="vector add", source="01_vector_add.cu",
        symbol="vector_add", args=[In("a"), In("b"), Out("c"), Int("n")],
        fn=lambda a, b: a + b, sizes=[1, 2, 31, 33, 1000],
    )

Inputs are standard-normal float32 (times `scale`), shaped by the size scalars (`dims`, default
`n`); any other float scalar is drawn from [0.5, 3). The reference is `fn` in float64 on clones,
the torch baseline is `fn` in float32 (or `baseline`), and bytes moved count every buffer once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from grader.tasks.spec import Arg, Buffer, Case, CudaTask, Entry, Rng, Scalar, Values


def elementwise(
    *,
    lab: str,
    number: str,
    title: str,
    source: str,
    symbol: str,
    args: Sequence[Arg],
    fn: Callable[..., Any],
    sizes: Sequence[int | tuple[int, ...]],
    dims: Sequence[str] = ("n",),
    scale: float = 1.0,
    timing_size: int | tuple[int, ...] | None = None,
    huge_sizes: Sequence[int | tuple[int, ...]] = (),
    baseline: Callable[[Values, Values], Any] | None = None,
    **task: Any,
) -> CudaTask:
    buffers = [a for a in args if isinstance(a, Buffer)]
    ins = [b.name for b in buffers if b.role == "in"]
    (out,) = [b.name for b in buffers if b.role != "in"]
    floats = [a.name for a in args if isinstance(a, Scalar) and a.ctype == "f32"]
    for d in dims:
        assert any(isinstance(a, Scalar) and a.name == d for a in args), f"{symbol}: no size argument `{d}`"

    def shape(p: dict[str, Any]) -> tuple[int, ...]:
        return tuple(p[d] for d in dims)

    def make_inputs(p: dict[str, Any], rng: Rng) -> Values:
        v: Values = {d: p[d] for d in dims}
        v |= {name: rng.scalar(0.5, 3.0) for name in floats}
        v |= {name: rng.randn(*shape(p)) * scale if scale != 1.0 else rng.randn(*shape(p)) for name in ins}
        return v

    def operands(v: Values, double: bool) -> dict[str, Any]:
        tensors = {name: v[name].double() if double else v[name] for name in ins}
        return tensors | {name: v[name] for name in floats}

    def reference(v: Values) -> Values:
        # float64 unless the case is past 2^28 elements (then float32, whose rounding of one
        # elementwise op stays far inside the tolerance, and which fits beside the inputs)
        n = 1
        for d in dims:
            n *= v[d]
        return {out: fn(**operands(v, double=n <= 1 << 28))}

    def torch_baseline(v: Values, o: Values) -> Any:
        return fn(**operands(v, double=False))

    def label(size: int | tuple[int, ...]) -> str:
        return f"{dims[0]}={size}" if isinstance(size, int) else "x".join(str(s) for s in size)

    def case(size: int | tuple[int, ...], huge: bool = False) -> Case:
        values = (size,) if isinstance(size, int) else size
        return Case(label(size), huge=huge, **dict(zip(dims, values, strict=True)))

    elems = 4 * len(buffers)  # float32: every buffer read or written once

    def bytes_moved(v: Values) -> float:
        n = 1
        for d in dims:
            n *= v[d]
        return elems * n

    return CudaTask(
        lab=lab,
        number=number,
        title=title,
        sources=[source],
        entries=[
            Entry(symbol, args, reference=reference, baseline=baseline or torch_baseline, bytes_moved=bytes_moved)
        ],
        cases=[case(s) for s in sizes] + [case(s, huge=True) for s in huge_sizes],
        make_inputs=make_inputs,
        timing_case=label(timing_size) if timing_size is not None else None,
        **task,
    )
