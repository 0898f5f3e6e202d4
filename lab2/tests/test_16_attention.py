"""Checks for lab2/16_attention.cu: the attention ladder, O = softmax(Q K^T / sqrt(D) + mask) V for
every head, first with the scores in global memory (three kernels), then fused with an online
softmax (flash attention's forward pass), timed against torch's scaled_dot_product_attention on the
same float32 tensors: its MATH backend (the baseline of the speed-up), and, in the ladder's table,
its EFFICIENT_ATTENTION backend (the memory-efficient kernel; torch's FLASH_ATTENTION backend takes
only fp16 and bf16, so it cannot run on these inputs).

The inputs. Q, K and V are standard normal with D = 64, so a score q.k / 8 is itself about standard
normal: the weights of a row vary by factors of ten and more between keys, far from uniform. An
output row is a weighted mean of the rows of V it sees: |O| is typically 0.02 to 0.3 at T = 2048,
and O = V exactly for the first row of a causal head (it sees one key). T = 17, 100 and 257 are not
multiples of a tile (64 rows or keys), and 257 leaves a last tile of one key. The case "Q*20"
multiplies Q by 20: scores are then N(0, 400), the largest of a row reach 60 to 110, and about one
in 10^5 passes 88.7, where exp overflows float32 (dozens of the case's 4 million scores, in every
draw): a kernel that does not subtract the row's max computes inf / inf = NaN there. In that case V
is divided by 64, for the reason below.

The tolerance, against a float64 reference: |O - ref| <= 2e-6 + 1e-5 |ref|. Each score is a chain of
64 fused multiply-adds (rung 1) or four chains of 16 added at the end (rung 2), each step off by up
to half an ulp of its partial sum (u = 2^-24 relative); expf and exp2f are within 2 ulp; the row's
sum is a chain of T additions of terms <= 1 (rung 2, rescaled as the max grows) or T/32 per lane and
a butterfly (rung 1); each output is a chain of up to T FMAs of terms p v. An error delta_j in score
j moves O by sum_j p_j (delta_j - mean delta) v_j: the weights' relative errors reach O as absolute
errors of order |delta| |V|. A float64 emulation of both rungs' exact float32 order (their FMA
chains, one rounding per operation, exp correctly rounded) on T = 17 to 2048, causal and not, found
every output within 0.34 of the tolerance (largest error 6e-7), and an emulation of the kernels' own
code on the CPU within 0.39 on the cases below: a margin of 2.5, which also covers the 2-ulp error
of the GPU's expf and exp2f that the emulations leave out. Scores near 100 are another matter: their
dot products add partial sums near 100, whose half-ulp is 3.8e-6, and with V unscaled the
emulation's errors on "Q*20" reached 3.4e-5, up to 17 times the tolerance. Every float32 kernel
makes that error (torch's too: it is the float32 rounding of the scores), so the case divides V by
64 rather than loosen the tolerance of every case (the 0.39 above is rung 1 on it), and what the
case checks is that nothing overflows.

What fails: zeros (all outputs but a handful are above atol), uniform attention (each output the
mean of the rows of V its query sees: 99% of the outputs wrong), an fp16 round trip of the right
answer (60 to 90% wrong), a dropped key of weight p (O moves by p |v - O|, about |V| / T).

Rows of keys longer than a block. Rung 1 gives each row of scores to one warp, rung 2 stages keys
in tiles of 64: T = 100, 257 and 1024 give every query more keys than a warp has lanes and than a
tile holds (non-causal, and causal from row 32 or 64 on), so a kernel that covers only the first
warp's or tile's worth of a row leaves keys out there, each worth about |V| / T, far past rtol.
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

D = 64
ARGS = [In("Q"), In("K"), In("V"), Out("O"), Int("BH"), Int("T"), Int("D"), Int("causal")]
TIMING = "BH=32,T=1024 causal"


def case(bh, t, causal, small=None):
    label = f"BH={bh},T={t}" + (" causal" if causal else "")
    return Case(label, small=small, BH=bh, T=t, D=D, causal=causal)


def make_inputs(p, rng):
    bh, t, d = p["BH"], p["T"], p["D"]
    q, k, v = rng.randn(bh, t, d), rng.randn(bh, t, d), rng.randn(bh, t, d)
    if p.get("large"):
        q, v = q * 20.0, v / 64.0  # scores past exp's range; V smaller for the tolerance (docstring)
    return {"Q": q, "K": k, "V": v, "BH": bh, "T": t, "D": d, "causal": p["causal"]}


def reference(v):
    import torch

    q, k, val = v["Q"].double(), v["K"].double(), v["V"].double()
    t = v["T"]
    s = q @ k.transpose(-2, -1) / math.sqrt(v["D"])  # (BH, T, T)
    if v["causal"]:
        hidden = torch.ones(t, t, dtype=torch.bool, device=s.device).triu(1)  # key j > query i
        s = s.masked_fill(hidden, float("-inf"))
    return {"O": (torch.softmax(s, dim=-1) @ val).to(torch.float32)}


def sdpa(v, backend):
    """torch's attention on the same tensors, with only the backend `backend` (an SDPBackend name)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    # TF32 would round Q, K and V to 10-bit mantissas in the math backend's matmuls
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    # (1, BH, T, D): the fused backends take 4-D tensors only; the default scale is 1 / sqrt(D)
    q, k, val = v["Q"].unsqueeze(0), v["K"].unsqueeze(0), v["V"].unsqueeze(0)
    with sdpa_kernel(getattr(SDPBackend, backend)):
        torch.nn.functional.scaled_dot_product_attention(q, k, val, is_causal=bool(v["causal"]))


def torch_math(v, o):
    sdpa(v, "MATH")  # scores, mask, softmax and P V as separate kernels: T x T floats in memory


def torch_efficient(v, o):
    sdpa(v, "EFFICIENT_ATTENTION")  # one fused kernel, as rung 2 (on tensor cores, in 3xTF32)


def flops(v):
    full = 4.0 * v["BH"] * v["T"] ** 2 * v["D"]  # Q K^T and P V: 2 T^2 D multiply-adds per head
    return full / 2 if v["causal"] else full  # the mask hides half the scores


def entry(symbol):
    return Entry(symbol, ARGS, reference=reference, baseline=torch_math, flops=flops)


RUNGS = ["attention_1", "attention_2"]

# The mistakes these checks are designed to catch, each with the input or check that exposes it
# (lab2/solutions/broken.py has a variant of each).
MISTAKES = {
    "no rescale": "BH=2,T=17 and larger: a row's max grows after its first chunk of keys",
    "causal mask": "the causal cases from T = 17",
    "key tail": "T = 17, 100 and 257: a last tile of keys that is partial (one key at 257)",
    "missing barrier": "the sanitizer (racecheck) on T = 257, five key tiles",
    "long rows": "T = 100, 257 and 1024: rows of keys longer than a warp's 32 lanes and a tile's 64 keys",
}

TASK = CudaTask(
    lab="lab2",
    number="16",
    title="attention ladder",
    mistakes=MISTAKES,
    sources=["16_attention.cu"],
    entries=[entry(s) for s in RUNGS],
    cases=[
        case(1, 1, 0),
        case(1, 1, 1),
        case(2, 17, 0),
        case(2, 17, 1),
        case(3, 100, 0),
        case(3, 100, 1),
        case(4, 257, 0, small=True),  # 5 key tiles, the last with one key: the sanitizer runs it
        case(4, 257, 1, small=True),
        Case("BH=4,T=1024 Q*20", BH=4, T=1024, D=D, causal=0, large=True),
        case(32, 1024, 1),
    ],
    make_inputs=make_inputs,
    tolerance={"f32": (2e-6, 1e-5)},
    timing_case=TIMING,
    rules=[
        NO_LIBRARIES,
        uses_shared_memory("rung 2 stages tiles of K and V in shared memory", "attention_fused_kernel"),
        uses_syncthreads(
            "a tile of K and V must be complete before it is read, and read before the next one replaces it",
            "attention_fused_kernel",
        ),
    ],
    perf=[PerfTarget("attention_2", "speedup", 1.8, 2, gate=True)],
    ladder=Ladder(
        name="attention",
        rungs=RUNGS,
        sweep=[case(32, t, 1) for t in (512, 1024, 2048)],
        baselines={"torch math": torch_math, "torch efficient": torch_efficient},
        metric="gflops",
        labels={
            "attention_1": "1 naive: scores in memory, 3 kernels",
            "attention_2": "2 fused: online softmax, K and V tiles in shared memory",
        },
    ),
)


def test_attention(grade):
    grade(TASK)
