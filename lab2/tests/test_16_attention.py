"""Checks for lab2/16_attention.cu: the attention ladder, O = softmax(Q K^T / sqrt(D) + mask) V for
every head, first with the scores in global memory (three kernels), then fused with an online
softmax (flash attention's forward pass), then the same on the tensor cores in half precision
(FlashAttention-2's forward pass: mma.sync, ldmatrix, a cp.async pipeline). Rungs 1 and 2 are timed
against torch's scaled_dot_product_attention on the same float32 tensors: its MATH backend (their
speed-up's baseline) and, in the ladder's table, its EFFICIENT_ATTENTION backend (the
memory-efficient kernel). Rung 3 is timed against the FLASH_ATTENTION backend on the same half
tensors (its speed-up's baseline; torch's flash backend takes only fp16 and bf16) and, in the
table, the MATH backend on them.

The entry points. attention_1 and attention_2 take float32 Q, K, V and O with D = 64; attention_3
takes float16 (the buffers Qh, Kh, Vh, Oh) and attention_3_bf16 bfloat16 (Qb, Kb, Vb, Ob), with
D = 64 or 128 (the argument Dh). Every entry runs on every case: a case of Dh = 128 gives rungs 1
and 2 the same BH and T at D = 64 (their only head dimension).

The inputs. Q, K and V are standard normal (rung 3's rounded to its type), so a score q.k / sqrt(D)
is itself about standard normal: the weights of a row vary by factors of ten and more between keys,
far from uniform. An output row is a weighted mean of the rows of V it sees: |O| is typically 0.02
to 0.3 at T = 1000 to 2048, and O = V exactly for the first row of a causal head (it sees one key).
T = 17, 100, 257 and 1000 are not multiples of a tile (64 rows or keys), and 257 leaves a last tile
of one key; T = 64 is one tile, all of it on the diagonal when causal. The cases "Q*20" multiply Q
by 20: scores are then N(0, 400), the largest of a row reach 60 to 110, and about one in 10^5
passes 88.7, where exp overflows float32 (dozens of the case's 4 million scores, in every draw): a
kernel that does not subtract the row's max computes inf / inf = NaN there. In that case the
float32 V is divided by 64, for the reason below; rung 3's V is not.

The float32 tolerance (rungs 1 and 2), against a float64 reference: |O - ref| <= 2e-6 + 1e-5 |ref|.
Each score is a chain of 64 fused multiply-adds (rung 1) or four chains of 16 added at the end
(rung 2), each step off by up to half an ulp of its partial sum (u = 2^-24 relative); expf and exp2f
are within 2 ulp; the row's sum is a chain of T additions of terms <= 1 (rung 2, rescaled as the max
grows) or T/32 per lane and a butterfly (rung 1); each output is a chain of up to T FMAs of terms
p v. An error delta_j in score j moves O by sum_j p_j (delta_j - mean delta) v_j: the weights'
relative errors reach O as absolute errors of order |delta| |V|. A float64 emulation of both rungs'
exact float32 order (their FMA chains, one rounding per operation, exp correctly rounded) on T = 17
to 2048, causal and not, found every output within 0.34 of the tolerance (largest error 6e-7), and
an emulation of the kernels' own code on the CPU within 0.39 on the cases below: a margin of 2.5,
which also covers the 2-ulp error of the GPU's expf and exp2f that the emulations leave out. Scores
near 100 are another matter: their dot products add partial sums near 100, whose half-ulp is
3.8e-6, and with V unscaled the emulation's errors on "Q*20" reached 3.4e-5, up to 17 times the
tolerance. Every float32 kernel makes that error (torch's too: it is the float32 rounding of the
scores), so the case divides V by 64 rather than loosen the tolerance of every case (the 0.39 above
is rung 1 on it), and what the case checks is that nothing overflows.

Rung 3's tolerance, against the float64 attention of the same half inputs: float16 |O - ref| <= 1e-3
+ 2^-10 |ref|, bfloat16 8e-3 + 2^-7 |ref|. Two roundings dominate. O itself is rounded once to its
type, off by up to u |O| (u = 2^-11 for float16's 11 significant bits, 2^-8 for bfloat16's 8): rtol
is 2u. And the weights P are rounded to the input type before P V (they are mma's A operand), each p
by up to u relative to itself, while l sums the unrounded p: O moves by sum_j w_j delta_j v_j (w the
softmax weights, |delta_j| <= u), an absolute error that is largest where a few keys share the
weight (a causal row's first keys) and small where many do; the row's largest p is exp2(0) = 1 and
exact. The scores' own errors are far smaller: products of halves are exact in float32, and the
tensor cores add 16 of them per instruction to float32 sums. A CPU emulation of these roundings
(written for this spec: scores in float32, p against the running max of 64-key tiles in float32, p
rounded to the type, O = o / l rounded) on T = 1 to 2048, D = 64 and 128, causal and not, "Q*20"
included, put the P term at 3.3e-4 at most for float16 and 3.6e-3 for bfloat16, so every output
within 0.45 of the tolerance; honest kernels that sum in another order gave the same: tiles of 32 or
128 keys, l summed from the rounded p, P kept in float32, an exact max from a first pass. A margin
of 2 holds on the output's own rounding (rtol = 2u) and of 2.2 to 3 on the P term. Not honest in
this sense: Q (or K) multiplied by the scale and rounded to the input type before the product, which
on "Q*20" moves scores near 100 by 2^-11 of themselves, 5% of their weight (17 to 18 times the
tolerance); the scale goes on the float32 scores. What fails, from the same emulation on the cases
below (the share of the outputs wrong, float16 / bfloat16): zeros and a pass-through (most outputs
exceed atol); P not divided by l (every case with more than one key, 63 / 46% and more); a missing
rescale of the output accumulators when the max grows (every case from T = 100 on, 6 / 5% to 94%); a
causal mask that lets token i see token i + 1 (every causal case from T = 17 on, 29 / 4% to 93%); a
scale of 1/D (94 / 82% and more from T = 17) or none (64 / 48% and more); a partial last tile of
keys left unmasked, whose keys past T are zero rows of K with scores of 0 instead of -inf (every
non-causal case with T % 64 != 0, 15 / 50% and more, except bfloat16 at T = 1000, where the 24 keys
past T add only about 1% to l).

What fails the float32 rungs: zeros (all outputs but a handful are above atol), uniform attention
(each output the mean of the rows of V its query sees: 99% of the outputs wrong), an fp16 round trip
of the right answer (60 to 90% wrong), a dropped key of weight p (O moves by p |v - O|, about
|V| / T).

Rows of keys longer than a block. Rung 1 gives each row of scores to one warp, rung 2 stages keys in
tiles of 64: T = 100, 257, 1000 and 1024 give every query more keys than a warp has lanes and than a
tile holds (non-causal, and causal from row 32 or 64 on), so a kernel that covers only the first
warp's or tile's worth of a row leaves keys out there, each worth about |V| / T, far past rtol.

Rung 3's pipeline and fragments. V's fragments need ldmatrix's .trans (V's rows are keys, mma's .col
operand wants pairs of consecutive keys for one column of d): without it each 8 x 8 block of V is
used transposed, wrong from BH=1,T=1 on (of the 8 d of a block only the first is right). Its K/V
tiles come through two stages of shared memory; waiting with cp_async_wait<1> instead of <0> reads
the first tile of every block before its copies have landed (stale shared memory): in practice every
case is wrong. attention_3_bf16 is attention_3's code for bfloat16: P or O rounded with float16's
conversion are float16 bits read as bfloat16 (1.0 becomes 2^-7), wrong in every case. Below compute
capability 8.0 rung 3 is an empty kernel (and attention_3 returns cudaErrorNotSupported): the rules
find no mma.sync in it and say that it needs sm_80, and the grader, which cannot leave one entry of
a task out by compute capability, makes the whole task a rule violation there.

The timing. Rungs 1 and 2 are judged on BH=32,T=1024 causal (their speed-up over torch's math
backend); rung 3 on BH=128,T=2048 causal (batch 8 x 16 heads, D = 64), its speed-up over torch's
flash backend on the same float16 tensors.
"""

import math

from grader.tasks import (
    NO_LIBRARIES,
    Case,
    CudaTask,
    Entry,
    In,
    Int,
    Out,
    PerfTarget,
    uses_shared_memory,
    uses_syncthreads,
)
from grader.tasks.ladder import Ladder
from grader.tasks.rules import uses_inline_ptx, uses_tensor_cores

D = 64  # rungs 1 and 2's head dimension (the only one they take); rung 3's is the case's Dh
ARGS = [In("Q"), In("K"), In("V"), Out("O"), Int("BH"), Int("T"), Int("D"), Int("causal")]
# rung 3: float16 buffers Qh, Kh, Vh, Oh; bfloat16 buffers Qb, Kb, Vb, Ob; head dimension Dh
HALF = {"f16": "h", "bf16": "b"}
TIMING = "BH=32,T=1024 causal"
TIMING_3 = "BH=128,T=2048 causal"  # batch 8 x 16 heads


def args_3(dtype):
    x = HALF[dtype]
    buffers = [In(f"Q{x}", dtype), In(f"K{x}", dtype), In(f"V{x}", dtype), Out(f"O{x}", dtype)]
    return [*buffers, Int("BH"), Int("T"), Int("Dh"), Int("causal")]


def case(bh, t, causal, dh=D, small=None, large=False):
    label = (
        f"BH={bh},T={t}" + (" Q*20" if large else "") + (" causal" if causal else "") + (f" Dh={dh}" if dh != D else "")
    )
    params = {"BH": bh, "T": t, "causal": causal, "Dh": dh}
    if large:
        params["large"] = True
    return Case(label, small=small, **params)


def make_inputs(p, rng):
    bh, t, dh = p["BH"], p["T"], p["Dh"]
    q, k, v = rng.randn(bh, t, D), rng.randn(bh, t, D), rng.randn(bh, t, D)
    # rung 3's inputs: the same values rounded to its types, or a draw of their own at Dh = 128
    q3, k3, v3 = (q, k, v) if dh == D else (rng.randn(bh, t, dh), rng.randn(bh, t, dh), rng.randn(bh, t, dh))
    if p.get("large"):
        # scores past exp's range; the float32 V smaller for the float32 tolerance (docstring)
        q, v, q3 = q * 20.0, v / 64.0, q3 * 20.0
    values = {"Q": q, "K": k, "V": v, "BH": bh, "T": t, "D": D, "Dh": dh, "causal": p["causal"]}
    for x, rounded in (("h", lambda a: a.half()), ("b", lambda a: a.bfloat16())):
        values |= {f"Q{x}": rounded(q3), f"K{x}": rounded(k3), f"V{x}": rounded(v3)}
    return values


def attention64(q, k, v, causal):
    """softmax(q k^T / sqrt(D) + mask) v in float64, a few heads at a time (at most 2^26 scores, 512 MiB)."""
    import torch

    t, d = q.shape[1], q.shape[2]
    hidden = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1) if causal else None  # key j > query i
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    step = max(1, (1 << 26) // (t * t))
    for h in range(0, q.shape[0], step):
        s = q[h : h + step].double() @ k[h : h + step].double().transpose(-2, -1) / math.sqrt(d)
        if hidden is not None:
            s.masked_fill_(hidden, float("-inf"))
        out[h : h + step] = torch.softmax(s, dim=-1) @ v[h : h + step].double()
    return out


def reference(v):
    return {"O": attention64(v["Q"], v["K"], v["V"], v["causal"]).float()}


def reference_3(x):
    # the float64 answer for the half inputs as given, kept in float32: the judge compares the
    # kernel's rounded O with it, so the rounding of O is part of the measured error
    return lambda v: {f"O{x}": attention64(v[f"Q{x}"], v[f"K{x}"], v[f"V{x}"], v["causal"]).float()}


def sdpa(q, k, v, causal, backend):
    """torch's attention on (BH, T, D) tensors, with only the backend `backend` (an SDPBackend name)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    # TF32 would round Q, K and V to 10-bit mantissas in the math backend's float32 matmuls
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    # (1, BH, T, D): the fused backends take 4-D tensors only; the default scale is 1 / sqrt(D)
    with sdpa_kernel(getattr(SDPBackend, backend)):
        torch.nn.functional.scaled_dot_product_attention(
            q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), is_causal=bool(causal)
        )


def torch_math(v, o):
    sdpa(v["Q"], v["K"], v["V"], v["causal"], "MATH")  # scores, mask, softmax and P V as separate kernels


def torch_efficient(v, o):
    sdpa(v["Q"], v["K"], v["V"], v["causal"], "EFFICIENT_ATTENTION")  # one fused kernel, on tensor cores in 3xTF32


def torch_flash(x):
    """FlashAttention-2 as torch ships it, on rung 3's float16 (x = "h") or bfloat16 ("b") tensors."""
    return lambda v, o: sdpa(v[f"Q{x}"], v[f"K{x}"], v[f"V{x}"], v["causal"], "FLASH_ATTENTION")


def torch_math_fp16(v, o):
    sdpa(v["Qh"], v["Kh"], v["Vh"], v["causal"], "MATH")


def flops(v):
    full = 4.0 * v["BH"] * v["T"] ** 2 * v["D"]  # Q K^T and P V: 2 T^2 D multiply-adds per head
    return full / 2 if v["causal"] else full  # the mask hides half the scores


def flops_3(v):
    return flops({**v, "D": v["Dh"]})


def entry(symbol):
    return Entry(symbol, ARGS, reference=reference, baseline=torch_math, flops=flops)


def entry_3(symbol, dtype):
    x = HALF[dtype]
    return Entry(
        symbol, args_3(dtype), reference=reference_3(x), baseline=torch_flash(x), flops=flops_3, flop_peak="tensor"
    )


RUNGS = ["attention_1", "attention_2", "attention_3"]
RUNG_3 = ["attention_3", "attention_3_bf16"]

# The mistakes these checks are designed to catch, each with the input or check that exposes it
# (lab2/solutions/broken.py has a variant of each).
MISTAKES = {
    "no rescale": "BH=2,T=17 and larger: a row's max grows after its first chunk of 16 keys (rung 2); from T = 100 on "
    "after its first tile of 64 keys (rung 3, where the output accumulators must be rescaled)",
    "causal mask": "the causal cases from T = 17",
    "key tail": "T = 17, 100, 257 and 1000: a last tile of keys that is partial (one key at 257); rung 3's must be "
    "masked even where the tile is not on the diagonal (the non-causal cases)",
    "missing barrier": "the sanitizer (racecheck) on T = 257, five key tiles",
    "long rows": "T = 100, 257 and 1024: rows of keys longer than a warp's 32 lanes and a tile's 64 keys",
    "fragment layout": "BH=1,T=1 and every case after it: V's fragments loaded without ldmatrix's .trans use each "
    "8 x 8 block of V transposed (rung 3)",
    "pipeline wait count": "every case: cp_async_wait<1> returns with the first tile's copies still in flight, and its "
    "fragments come from stale shared memory (rung 3)",
    "scale": "every case from T = 17: scores scaled by 1/D instead of 1/sqrt(D) make every row's weights flatter "
    "(rung 3)",
    "bf16 conversion": "every case of attention_3_bf16: a value rounded with float16's conversion is float16's bits "
    "read as bfloat16",
}

TASK = CudaTask(
    lab="lab2",
    number="16",
    title="attention ladder",
    mistakes=MISTAKES,
    sources=["16_attention.cu"],
    entries=[
        entry("attention_1"),
        entry("attention_2"),
        entry_3("attention_3", "f16"),
        entry_3("attention_3_bf16", "bf16"),
    ],
    cases=[
        case(1, 1, 0),
        case(1, 1, 1),
        case(2, 17, 0),
        case(2, 17, 1),
        case(1, 64, 1),  # one tile, all of it on the diagonal
        case(3, 100, 0),
        case(3, 100, 1),
        case(4, 257, 0, small=True),  # 5 key tiles, the last with one key: the sanitizer runs it
        case(4, 257, 1, small=True),
        case(1, 1000, 1),
        case(1, 1, 0, dh=128),
        case(2, 17, 1, dh=128),
        case(2, 64, 0, dh=128),
        case(3, 100, 0, dh=128),
        case(2, 257, 1, dh=128, small=True),
        case(1, 1000, 0, dh=128),
        case(4, 1024, 0, large=True),
        case(1, 1024, 0, dh=128, large=True),
        case(32, 1024, 1),
        case(128, 2048, 1),
    ],
    make_inputs=make_inputs,
    tolerance={"f32": (2e-6, 1e-5), "f16": (1e-3, 2.0**-10), "bf16": (8e-3, 2.0**-7)},
    timing_case=TIMING,
    # the float64 references of BH=128,T=2048 (every timed call gets its own) and rung 1's 2 GiB of scores
    timeout=120,
    rules=[
        NO_LIBRARIES,
        uses_shared_memory(
            "rungs 2 and 3 stage tiles of K and V in shared memory", r"attention_fused_kernel|attention_mma_kernel"
        ),
        uses_syncthreads(
            "a tile of K and V must be complete before it is read, and read before the next one replaces it",
            r"attention_fused_kernel|attention_mma_kernel",
        ),
        uses_tensor_cores("rung 3 multiplies on the tensor cores (mma.sync, sm_80+)", RUNG_3),
        uses_inline_ptx(r"mma\.sync\.aligned\.m16n8k16", "rung 3 multiplies with mma.sync m16n8k16 (sm_80+)", RUNG_3),
        uses_inline_ptx(r"ldmatrix\.sync\.aligned", "rung 3 loads K's and V's fragments with ldmatrix", RUNG_3),
        uses_inline_ptx(r"cp\.async\.c[ag]\.shared\.global", "rung 3 fills its stages with cp.async", RUNG_3),
    ],
    perf=[
        PerfTarget("attention_2", "speedup", 1.8, 2, gate=True),
        # half of torch's flash backend; the reference reached 0.98x on an H100 (make verify, 3 blocks per SM at D = 64)
        PerfTarget("attention_3", "speedup", 0.5, 2, gate=True, case=TIMING_3),
    ],
    ladder=Ladder(
        name="attention",
        rungs=RUNGS,
        sweep=[case(32, t, 1) for t in (512, 1024, 2048)],
        baselines={
            "torch math": torch_math,
            "torch efficient": torch_efficient,
            "torch flash fp16": torch_flash("h"),
            "torch math fp16": torch_math_fp16,
        },
        metric="gflops",
        labels={
            "attention_1": "1 naive: scores in memory, 3 kernels",
            "attention_2": "2 fused: online softmax, K and V tiles in shared memory",
            "attention_3": "3 tensor cores (fp16): mma.sync, softmax on the accumulators, cp.async",
        },
    ),
)


def test_attention(grade):
    grade(TASK)
