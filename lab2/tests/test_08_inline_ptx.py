"""Checks for lab2/08_inline_ptx.cu: helpers written as inline PTX (mov.u32 from %laneid,
fma.rn.f32, bfe.u32, ld.global.cs.f32) and the two kernels that use them.

fma_lanes. a and b are standard normal. For a random half of the elements c is standard normal; for
the other half c = -fl(a*b), minus the product rounded to float32, so a single rounding returns
a*b - fl(a*b), the product's own rounding error (non-zero for almost every pair), while a product
rounded before the add returns 0: those elements fail whenever the multiply is rounded on its own.
The first two elements are crafted so that rounding twice, first to float64 and then to float32,
gives the wrong answer: (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24 lies exactly halfway between two floats,
and c = ±2^-80 decides the rounding. float64(a*b + c) drops the 2^-80 and the float32 rounding
then breaks the tie to even, so a reference that rounds a float64 FMA to float32 is wrong there.
The reference rounds the float64 sum to odd instead (its exact error from TwoSum), which makes the
float32 rounding of it exact (Boldo and Melquiond, "Emulation of FMA and correctly rounded sums:
proved algorithms using rounding to odd", IEEE TC 2008; float64 has 53 >= 24 + 2 bits). fma.rn.f32
is correctly rounded, so the tolerance is zero: every element must be bit-exact. lanes must equal
i % 32: the launch is given, with 16 x 16 blocks, so threadIdx.x % 32 is wrong for every thread
of an odd row (threadIdx.y odd).

The kernels' results cannot tell inline PTX from C++: nvcc contracts a * b + c into the same FMA
(-fmad=true by default), i % 32 is the lane, and shifts and masks give the same fields. The rules
therefore require the PTX instructions in asm statements of the source; comments do not count.

bit_fields. words are random 32-bit words; pos and len are uniform in 0..39, so len = 0,
pos >= 32 and pos + len > 32 all occur, and the first twelve elements are the edges themselves
(len 0 and 32, pos 31 and 32, pos + len = 32 and 33, 255). The reference follows the PTX ISA's
definition of bfe.u32 (pos and len taken modulo 256, bits past bit 31 read as zero). Exact.

fma_lanes runs 16 x 16 blocks: an element index that ignores threadIdx.y leaves every element past
the 16th of a block unwritten (n = 31 on).
"""

from grader.tasks import NO_LIBRARIES, Case, CudaTask, Entry, In, Int, Out, Rule
from grader.tasks.rules import uses_inline_ptx

FMA_ARGS = [In("a"), In("b"), In("c"), Out("out"), Out("lanes", "u32"), Int("n")]
BFE_ARGS = [In("words", "u32"), In("pos", "u32"), In("len", "u32"), Out("fields", "u32"), Int("n")]
SIZES = [1, 31, 33, 1000, (1 << 20) + 3]
TIMING = 1 << 24

# (pos, len) of the first elements: a plain field first (the n = 1 case), then the edges
EDGES = [(4, 8), (0, 32), (0, 0), (31, 1), (31, 2), (32, 5), (7, 25), (7, 26), (16, 16), (0, 255), (255, 255), (200, 3)]


def label(n):
    return {(1 << 20) + 3: "n=2^20+3", 1 << 24: "n=2^24"}.get(n, f"n={n}")


def make_inputs(p, rng):
    import torch

    n = p["n"]
    a, b, c = rng.randn(n), rng.randn(n), rng.randn(n)
    cancel = rng.integers(0, 2, n).bool()
    c = torch.where(cancel, -(a * b), c)  # a * b rounded to float32, negated
    k = min(n, 2)  # two crafted elements where rounding through float64 goes wrong
    a[:k] = b[:k] = 1.0 + 2.0**-12
    c[:k] = torch.tensor([2.0**-80, -(2.0**-80)], device=c.device)[:k]
    if n > 1:
        b[1] = -b[1]
    words = rng.integers(-(1 << 31), 1 << 31, n)
    pos, length = rng.integers(0, 40, n), rng.integers(0, 40, n)
    m = min(n, len(EDGES))
    pos[:m] = torch.tensor([e[0] for e in EDGES[:m]], dtype=torch.int32, device=pos.device)
    length[:m] = torch.tensor([e[1] for e in EDGES[:m]], dtype=torch.int32, device=pos.device)
    return {"a": a, "b": b, "c": c, "words": words, "pos": pos, "len": length, "n": n}


def fma_f32(a, b, c):
    """a * b + c rounded once to float32 (round to nearest, ties to even), exactly."""
    import torch

    p = a.double() * b.double()  # exact: 24 + 24 significant bits fit in float64's 53
    c = c.double()
    s = p + c
    t = s - p
    err = (p - (s - t)) + (c - t)  # TwoSum: p + c == s + err exactly
    # round to odd: an inexact s with an even last bit moves one float64 step towards p + c
    even = (s.view(torch.int64) & 1) == 0
    towards = torch.where(err > 0, torch.inf, -torch.inf).to(s.dtype)
    s = torch.where((err != 0) & even, torch.nextafter(s, towards), s)
    return s.float()


def fma_reference(v):
    import torch

    lanes = torch.arange(v["n"], device=v["a"].device) % 32
    return {"out": fma_f32(v["a"], v["b"], v["c"]), "lanes": lanes.to(torch.int32)}


def bfe_reference(v):
    import torch

    x = v["words"].long() & 0xFFFFFFFF
    pos, length = v["pos"].long() & 0xFF, v["len"].long() & 0xFF
    shifted = torch.where(pos < 32, x >> pos.clamp(max=31), 0)
    mask = (torch.ones_like(length) << length.clamp(max=32)) - 1
    field = shifted & mask
    return {"fields": torch.where(field >= 1 << 31, field - (1 << 32), field).to(torch.int32)}


def torch_fma(v, o):
    import torch

    torch.addcmul(v["c"], v["a"], v["b"], out=o["out"])


# The mistakes these checks are designed to catch, each with the input or check that exposes it
# (lab2/solutions/broken.py has a variant of each).
MISTAKES = {
    "constraint letter": "fma_lanes' exact comparison: a float passed as an integer operand is converted",
    "lane from threadIdx": "the rule reads the PTX of the kernels fma_lanes reaches (a %laneid left in an uncalled"
    " helper is not there), and n >= 17 in the given 16 x 16 blocks has odd rows 16 lanes off",
    "rule dodged in a comment": "the rules read the compiled PTX: an asm statement in a comment is not there",
    "operand order": "bit_fields' edge fields (pos and len 0, 31, 32, past 32)",
    "2-D block index": "n = 31 and up: a 1-D index in 16 x 16 blocks leaves elements past 16 per block unwritten",
}

TASK = CudaTask(
    lab="lab2",
    number="08",
    title="inline PTX",
    mistakes=MISTAKES,
    sources=["08_inline_ptx.cu"],
    entries=[
        Entry("fma_lanes", FMA_ARGS, reference=fma_reference, baseline=torch_fma, bytes_moved=lambda v: 20 * v["n"]),
        Entry("bit_fields", BFE_ARGS, reference=bfe_reference, bytes_moved=lambda v: 16 * v["n"]),
    ],
    cases=[Case(label(n), n=n) for n in [*SIZES, TIMING]],
    make_inputs=make_inputs,
    tolerance={"f32": (0.0, 0.0)},
    timing_case=label(TIMING),
    rules=[
        NO_LIBRARIES,
        # the inline PTX of the kernels each entry point reaches (and, on a GPU, launched), as nvcc
        # compiled it: an asm statement in a comment, in a helper no kernel calls, or whose result is
        # never used (the compiler drops it) is no instruction
        uses_inline_ptx(r"fma\.rn\.f32", "fma_rn must be one fma.rn.f32 in an asm statement", "fma_lanes"),
        uses_inline_ptx(r"mov\.u32 %laneid", "lane_id must read %laneid with mov.u32 in an asm statement", "fma_lanes"),
        uses_inline_ptx(r"bfe\.u32", "bfe_u32 must be one bfe.u32 in an asm statement", "bit_fields"),
        Rule(
            "forbid",
            r"\b(?:fmaf|__fmaf_r[nzud]|__fma_r[nzud])\s*\(",
            "write the fused multiply-add as inline PTX (fma.rn.f32), not with the CUDA math functions",
        ),
    ],
)


def test_inline_ptx(grade):
    grade(TASK)
