"""Checks for lab4/kiln/kernels/layout.cu: kiln_strided_copy (permute and slice as one strided copy)
and kiln_slice_update (a value written into a buffer at offsets the kernel reads from device memory).

The inputs. Every case runs both entry points, each on its own inputs. kiln_strided_copy reads a
standard-normal source of shape S through a view: S permuted, then sliced (per-dimension
[start, end)), and make_inputs passes that view's shape, strides and storage offset as meta, as
kiln's executor will: transposes, rank 3 and 4 permutations, slices that start inside the
source, both at once, size-1 dimensions, a plain copy, and random ones drawn anew for every draw.
kiln_slice_update writes a value of shape V into a target of shape T at offsets placed at the
first position (all 0), at the last (T - V), at random places in between, partly past the end,
wholly past the end, and below 0 (partly before the start), including a KV-cache step (one new
position along the sequence axis). The output is all of target: what the value does not cover must
keep its old contents, and whatever falls outside target is skipped (the contract), so the fences
around target catch a write past it. The cases past 2^31 elements (`make grade`) catch 32-bit
indices: a permutation of 2^31 + 65536 elements, and an update at the far end of such a target.

The tolerance is exact: both only move floats.

The offsets. A CUDA graph replays its kernels with the arguments they were captured with, so an
offset passed by value would stay at its first value forever; kiln's KV cache moves one position
per generated token. `offsets_are_read_at_run_time` calls slice_update twice on the same buffers
and meta with new offsets written into the same device array in between; `replays_in_a_cuda_graph`
captures a call of each entry point into a CUDA graph (on torch's capture stream) and replays it
with new offsets and new data: the writes must land where the offsets say at each replay. A launch
on another stream, a synchronization or an allocation makes the capture fail.

No timing case: the grader times an entry point with a host argument (meta) by the host's clock
and counts its wrong outputs on the host, while these outputs are on the device.

TASK.mistakes names the class of mistake each case is there to catch; lab4/solutions/broken.py
has a broken variant for each (graded on a GPU).
"""

from grader.child.context import RunContext
from grader.tasks import NO_LIBRARIES, Case, CudaTask, Entry, HostIn, In, InOut, Out
from grader.tasks.spec import Rng, Scalar

STREAM = Scalar("stream", "u64")
COPY_ARGS = [Out("out"), In("src"), HostIn("copy_meta", "i64"), STREAM]
UPDATE_ARGS = [InOut("target"), In("value"), In("offsets", "i64"), HostIn("update_meta", "i64"), STREAM]

Shape = tuple[int, ...]
Slices = tuple[tuple[int, int], ...]

# strided copies: (source shape, permutation, per-dimension [start, end) of the permuted view;
# () keeps it whole)
COPIES: list[tuple[Shape, Shape, Slices]] = [
    ((1,), (0,), ()),
    ((33,), (0,), ()),
    ((5,), (0,), ((1, 3),)),
    ((2, 3), (1, 0), ()),
    ((31, 33), (1, 0), ()),
    ((4, 5, 6), (2, 0, 1), ()),
    ((2, 3, 4, 5), (3, 1, 0, 2), ()),
    ((3, 4, 5, 6), (0, 1, 2, 3), ((1, 3), (0, 4), (2, 5), (5, 6))),
    ((8, 9, 10), (1, 2, 0), ((2, 9), (0, 10), (3, 4))),
    ((1, 7, 1, 5), (2, 3, 0, 1), ()),
    ((2, 16, 8, 64), (0, 2, 1, 3), ((0, 2), (0, 8), (3, 11), (0, 64))),
    ((257, 513), (1, 0), ((1, 500), (2, 257))),
    ((64, 1024, 1024), (0, 2, 1), ()),
    ((64, 1024, 1030), (0, 1, 2), ((0, 64), (0, 1024), (3, 1027))),
]
# slice updates: (target shape, value shape, where the offsets go)
UPDATES: list[tuple[Shape, Shape, str]] = [
    ((1,), (1,), "first"),
    ((33,), (31,), "last"),
    ((33,), (5,), "random"),
    ((7, 9), (3, 4), "first"),
    ((7, 9), (3, 4), "last"),
    ((2, 16, 8), (2, 1, 8), "random"),  # a KV cache (heads, positions, head dim): one new position
    ((2, 16, 8), (2, 1, 8), "last"),
    ((4, 5, 6, 7), (2, 3, 4, 5), "past"),
    ((4, 5, 6, 7), (2, 3, 4, 5), "beyond"),
    ((4, 5, 6, 7), (4, 5, 6, 7), "first"),
    ((31, 33), (9, 10), "negative"),
    ((1, 3, 1, 33), (1, 2, 1, 31), "past"),
    ((1024, 4096), (1000, 4000), "random"),
    ((64, 1024, 1024), (64, 1000, 1024), "last"),
]
RANDOM = [1, 2, 3, 4, 4]  # ranks of copies and updates drawn by make_inputs
HUGE_SHAPE = (2, 32768, 32769)  # 2^31 + 65536 elements


def numel(shape: Shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def pad(values: Shape, fill: int) -> list[int]:
    return [fill] * (4 - len(values)) + list(values)


def random_copy(rank: int, rng: Rng) -> tuple[Shape, Shape, Slices]:
    import torch

    shape = tuple(int(d) for d in rng.integers(1, 10, rank).tolist())
    perm = tuple(int(d) for d in torch.randperm(rank, generator=rng.gen, device=rng.device).tolist())
    view = [shape[d] for d in perm]
    slices = []
    for size in view:
        start = int(rng.integers(0, size, 1).item())
        slices.append((start, int(rng.integers(start + 1, size + 1, 1).item())))
    return shape, perm, tuple(slices)


def random_update(rank: int, rng: Rng) -> tuple[Shape, Shape, str]:
    target = tuple(int(d) for d in rng.integers(1, 10, rank).tolist())
    value = tuple(int(rng.integers(1, t + 1, 1).item()) for t in target)
    return target, value, "random"


def offsets_for(target: Shape, value: Shape, where: str, rng: Rng) -> list[int]:
    """Offsets (as many as target's dims) placing value at `where` in target."""
    last = [t - v for t, v in zip(target, value, strict=True)]
    if where == "first":
        return [0] * len(target)
    if where == "last":
        return last
    if where == "random":
        return [int(rng.integers(0, x + 1, 1).item()) for x in last]
    if where == "past":  # every dim sticks out by about half of value: most elements are skipped
        return [x + (v + 1) // 2 for x, v in zip(last, value, strict=True)]
    if where == "beyond":  # one dim starts at the end: nothing at all lands in target
        return [0] * (len(target) - 1) + [target[-1]]
    if where == "negative":  # starts before 0 along every dim: only value's far corner lands
        return [-(v // 2) - 1 for v in value]
    raise ValueError(where)


def view_of(shape: Shape, perm: Shape, slices: Slices):
    """(out shape, strides, storage offset) of source.permute(perm)[slices], for a contiguous source."""
    import torch

    v = torch.empty(shape, device="meta").permute(perm)
    if slices:
        v = v[tuple(slice(s, e) for s, e in slices)]
    return tuple(v.shape), tuple(v.stride()), v.storage_offset()


def copy_label(shape: Shape, perm: Shape, slices: Slices) -> str:
    text = f"{shape}.permute{perm}" if perm != tuple(range(len(shape))) else str(shape)
    return text + ("[" + ", ".join(f"{s}:{e}" for s, e in slices) + "]" if slices else "")


def case(copy: tuple[Shape, Shape, Slices], update: tuple[Shape, Shape, str], huge: bool = False) -> Case:
    target, value, where = update
    big = max(numel(copy[0]), numel(target))
    return Case(
        f"copy {copy_label(*copy)}; update {target} <- {value} at {where}",
        small=big <= 1 << 16,
        huge=huge,
        copy=copy,
        update=update,
        elements=big,
    )


def random_case(i: int, rank: int) -> Case:
    return Case(f"random rank {rank} #{i}", rank=rank)


def make_inputs(p, rng):
    import torch

    if "rank" in p:
        copy, update = random_copy(p["rank"], rng), random_update(p["rank"], rng)
    else:
        copy, update = p["copy"], p["update"]
    shape, strides, offset = view_of(*copy)
    target, value, where = update
    offsets = offsets_for(target, value, where, rng)
    return {
        "src": rng.randn(numel(copy[0])),
        "copy_meta": torch.tensor(pad(shape, 1) + pad(strides, 0) + [offset], dtype=torch.int64),
        "target": rng.randn(numel(target)),
        "value": rng.randn(numel(value)),
        "offsets": torch.tensor(pad(tuple(offsets), 0), dtype=torch.int64, device=rng.device),
        "update_meta": torch.tensor(pad(target, 1) + pad(value, 1), dtype=torch.int64),
        "stream": rng.stream(),
    }


def copy_reference(v):
    import torch

    meta = v["copy_meta"].tolist()
    return {"out": torch.as_strided(v["src"], meta[0:4], meta[4:8], meta[8]).contiguous().flatten()}


def updated(target, value, offsets: list[int], tshape: Shape, vshape: Shape):
    """target (a new tensor) with value written at offsets, the parts outside target left out."""
    out = target.clone().view(tshape)
    value = value.view(vshape)
    dst, src = [], []
    for o, t, v in zip(offsets, tshape, vshape, strict=True):
        lo, hi = max(0, -o), min(v, t - o)  # the part of value, along this dim, that lands in target
        if lo >= hi:
            return out.flatten()
        dst.append(slice(o + lo, o + hi))
        src.append(slice(lo, hi))
    out[tuple(dst)] = value[tuple(src)]
    return out.flatten()


def update_reference(v):
    meta = v["update_meta"].tolist()
    offsets = v["offsets"].tolist()
    return {"target": updated(v["target"], v["value"], offsets, tuple(meta[0:4]), tuple(meta[4:8]))}


def offsets_are_read_at_run_time(ctx: RunContext) -> None:
    """Two calls on the same buffers and the same meta; between them, new offsets are written into
    the same device array. The second value must land at the new offsets."""
    import numpy as np
    import torch

    from grader.child.compare import judge

    tshape, vshape = (1, 2, 16, 8), (1, 2, 1, 8)  # a KV cache (heads, positions, head dim), one new position
    target = torch.zeros(numel(tshape), device="cuda")
    value = torch.randn(numel(vshape), device="cuda")
    offsets = torch.tensor([0, 0, 3, 0], dtype=torch.int64, device="cuda")
    meta = np.array(tshape + vshape, dtype=np.int64)
    fn = ctx.entry("kiln_slice_update")
    values = {"target": target, "value": value, "offsets": offsets, "update_meta": meta}
    want = target.clone()
    for call, position in enumerate((3, 11, 15)):
        offsets[2] = position  # in the device array: the pointer and the meta stay the same
        want = updated(want, value, offsets.tolist(), tshape, vshape)
        rc = fn({**values, "stream": torch.cuda.current_stream().cuda_stream})
        ctx.check_rc("kiln_slice_update", rc, f"position {position} of a (1, 2, 16, 8) cache")
        torch.cuda.synchronize()
        report = judge("target", target, want, 0.0, 0.0, None)
        if report:
            ctx.fail(
                f"kiln_slice_update into a (1, 2, 16, 8) cache at offsets [0, 0, {position}, 0], call {call + 1} on "
                f"the same buffers and meta (only the device array of offsets changes between calls): {report}. "
                f"The kernel must read the offsets from device memory when it runs"
            )


def replays_in_a_cuda_graph(ctx: RunContext) -> None:
    """A call of each entry point captured into a CUDA graph on torch's capture stream, then
    replayed with new data and new offsets in the same buffers: the writes must follow them."""
    import numpy as np
    import torch

    from grader.child.compare import judge

    src = torch.randn(4 * 5 * 6, device="cuda")
    shape, strides, offset = view_of((4, 5, 6), (2, 0, 1), ((1, 5), (0, 4), (2, 5)))
    out = torch.empty(numel(shape), device="cuda")
    copy_meta = np.array(pad(shape, 1) + pad(strides, 0) + [offset], dtype=np.int64)
    tshape, vshape = (1, 3, 9, 7), (1, 3, 2, 7)
    target, value = torch.randn(numel(tshape), device="cuda"), torch.randn(numel(vshape), device="cuda")
    offsets = torch.tensor([0, 0, 0, 0], dtype=torch.int64, device="cuda")
    update_meta = np.array(tshape + vshape, dtype=np.int64)
    calls = [
        ("kiln_strided_copy", {"out": out, "src": src, "copy_meta": copy_meta}),
        ("kiln_slice_update", {"target": target, "value": value, "offsets": offsets, "update_meta": update_meta}),
    ]
    graph = ctx.captured(calls)
    for position in (5, 7, 8):  # the last one sticks out of target by one position: half is skipped
        src.copy_(torch.randn_like(src))
        value.copy_(torch.randn_like(value))
        start = torch.randn_like(target)
        target.copy_(start)
        offsets.copy_(torch.tensor([0, 0, position, 0]))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want_copy = torch.as_strided(src, shape, strides, offset).flatten()
        report = judge("out", out, want_copy, 0.0, 0.0, None)
        if report:
            ctx.fail(f"kiln_strided_copy, replayed from a captured CUDA graph on a new source: {report}")
        want = updated(start, value, [0, 0, position, 0], tshape, vshape)
        report = judge("target", target, want, 0.0, 0.0, None)
        if report:
            ctx.fail(
                f"kiln_slice_update, replayed from a captured CUDA graph with new offsets [0, 0, {position}, 0]"
                f"{' (one row past the end of target: skipped)' if position == 8 else ''}: {report}. A graph keeps "
                f"the arguments it captured, so the kernel must read the offsets from device memory when it runs; "
                f"and what falls outside target is skipped"
            )
    del graph


TASK = CudaTask(
    lab="lab4",
    number="05",
    title="kiln: strided copy and slice update",
    sources=["kiln/kernels/layout.cu"],
    entries=[
        Entry("kiln_strided_copy", COPY_ARGS, reference=copy_reference),
        Entry("kiln_slice_update", UPDATE_ARGS, reference=update_reference),
    ],
    cases=[case(c, u) for c, u in zip(COPIES, UPDATES, strict=True)]
    + [random_case(i, r) for i, r in enumerate(RANDOM)]
    + [
        case((HUGE_SHAPE, (2, 0, 1), ()), ((7, 9), (3, 4), "random"), huge=True),
        case(((2, 3), (1, 0), ()), (HUGE_SHAPE, (2, 7, 9), "last"), huge=True),
    ],
    make_inputs=make_inputs,
    tolerance={"f32": (0.0, 0.0)},
    checks=[offsets_are_read_at_run_time, replays_in_a_cuda_graph],
    timeout=120,
    rules=[NO_LIBRARIES],
    mistakes={
        "run-time offsets": "offsets_are_read_at_run_time: new offsets in the same device array between calls",
        "out-of-range update": "updates partly and wholly past the end of target: what falls outside is skipped",
        "offsets below 0": "an update that starts before 0 on every axis: only value's far corner lands",
        "synchronizes under capture": "replays_in_a_cuda_graph captures a call of each entry point: no"
        " synchronization, allocation or other stream in a launch",
    },
)


def test_layout(grade):
    grade(TASK)
