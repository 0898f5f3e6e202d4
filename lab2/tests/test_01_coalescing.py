"""Checks for lab2/01_coalescing.cu: an int64 vector add whose warps read and write neighbouring
elements, timed against the copy bandwidth; add_strided, given in the file, is checked and timed
beside it for the comparison (it earns no performance points).

Inputs are int64 in (-2^40, 2^40), so a sum never overflows. Besides the cases, a check passes
views that start one element (8 bytes) into their buffers, alone or together, so a kernel with
16-byte loads must handle pointers that are not 16-byte aligned. `make grade` adds n = 2^31 + 17:
a, b, c and the reference then take 16 GiB each on the GPU.

misaligned_views also catches a kernel that picks its 16-byte path from some of the pointers only
(c alone one element in); n = 2^20 + 3 and 2^26 lie past one wave of the resident-blocks grid, so a
kernel without its grid-stride loop leaves their ends unwritten.
"""

from grader.child.context import RunContext
from grader.tasks import NO_LIBRARIES, Case, CudaTask, Entry, In, Out, PerfTarget, Size, Verdict
from grader.tasks.seeds import seed_for
from grader.tasks.spec import Rng

ARGS = [In("a", "i64"), In("b", "i64"), Out("c", "i64"), Size("n")]
LIMIT = 1 << 40  # |a|, |b| < 2^40: no overflow
SIZES = [1, 2, 31, 33, 1000, 4097, (1 << 20) + 3]
TIMING = 1 << 26
HUGE = (1 << 31) + 17  # past 2^31 elements a 32-bit index wraps around (make grade; 64 GB with the reference)


def make_inputs(p, rng):
    n = p["n"]
    return {
        "a": rng.integers(-LIMIT, LIMIT, n, dtype="i64"),
        "b": rng.integers(-LIMIT, LIMIT, n, dtype="i64"),
        "n": n,
    }


def reference(v):
    return {"c": v["a"] + v["b"]}


def torch_add(v, o):
    import torch

    torch.add(v["a"], v["b"], out=o["c"])


def bytes_moved(v):
    return 24 * v["n"]  # two int64 read and one written per element


def entry(symbol):
    return Entry(symbol, ARGS, reference=reference, baseline=torch_add, bytes_moved=bytes_moved)


def misaligned_views(ctx: RunContext) -> None:
    """add_coalesced on views one element into their buffers: each of a, b, c alone and all three,
    so the pointers are 8 bytes past a 16-byte boundary in every combination. Elements outside the
    view of c must stay untouched."""
    import torch

    add = ctx.entry("add_coalesced")
    rng = Rng(seed_for(ctx.task, "misaligned"), "cuda")
    for n in (1, 2, 4097):
        for offsets in ((1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 1)):
            oa, ob, oc = offsets
            a = rng.integers(-LIMIT, LIMIT, n + 1, dtype="i64")
            b = rng.integers(-LIMIT, LIMIT, n + 1, dtype="i64")
            c = torch.full((n + 2,), -7, dtype=torch.int64, device="cuda")
            av, bv, cv = a[oa : oa + n], b[ob : ob + n], c[oc : oc + n]
            where = f"n={n} with a, b, c starting {oa}, {ob}, {oc} elements into their buffers"
            ctx.check_rc("add_coalesced", add({"a": av, "b": bv, "c": cv, "n": n}), where)
            torch.cuda.synchronize()
            if not torch.equal(cv, av + bv):
                bad = int((cv != av + bv).nonzero()[0, 0])
                ctx.fail(
                    f"add_coalesced is wrong for {where}: c[{bad}] = {int(cv[bad])}, expected "
                    f"{int(av[bad] + bv[bad])}: the pointers are 8-byte aligned, not always 16-byte aligned",
                    Verdict.WRONG,
                )
            outside = torch.cat([c[:oc], c[oc + n :]])
            if not (outside == -7).all():
                ctx.fail(f"add_coalesced wrote outside c for {where}", Verdict.WRONG)


# The mistakes these checks are designed to catch, each with the input or check that exposes it
# (lab2/solutions/broken.py has a variant of each).
MISTAKES = {
    "tail": "odd n (1, 31, 33, 4097, 2^20 + 3): the last element after the last whole pair",
    "unaligned pointer": "misaligned_views: a, b and c one element into their buffers, alone and together",
    "no grid-stride loop": "n = 2^20 + 3 and 2^26, past one wave of the resident-blocks grid",
}

TASK = CudaTask(
    lab="lab2",
    number="01",
    title="coalescing (int64 vector add)",
    mistakes=MISTAKES,
    sources=["01_coalescing.cu"],
    entries=[entry("add_coalesced"), entry("add_strided")],
    cases=[Case(f"n={n}", n=n) for n in SIZES] + [Case("n=2^26", n=TIMING), Case("n=2^31+17", huge=True, n=HUGE)],
    make_inputs=make_inputs,
    output_shapes=lambda v: {"c": (v["n"],)},
    timing_case="n=2^26",
    rules=[NO_LIBRARIES],
    checks=[misaligned_views],
    perf=[PerfTarget("add_coalesced", "share_of_copy", 0.8, 2, gate=True)],
)


def test_coalescing(grade):
    grade(TASK)
