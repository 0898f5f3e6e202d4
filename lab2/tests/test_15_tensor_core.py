"""Checks for lab2/15_tensor_core.cu: a small tensor-core ladder, C = A @ B with A and B in float16
and C in float32 (FP32 accumulation). Through the WMMA API: one warp per 16 x 16 tile of C with its
fragments loaded from global memory, then 128 x 128 block tiles staged in shared memory; then
through PTX (sm_80 and later): mma.sync m16n8k16 on ldmatrix fragments from XOR-swizzled shared
memory, filled by a 4-stage cp.async pipeline; then Hopper's (sm_90a): TMA copies into a 4-stage
pipeline handed over through mbarriers, wgmma.mma_async from shared memory in two consumer
warpgroups, clusters of 2 CTAs that share B's tile by multicast, a persistent grid. Timed against
cuBLAS's half GEMM (through torch).

The inputs. A (M, K) and B (K, N) are standard normal divided by 4, rounded to float16: |a| < 2 in
practice, far from float16's overflow (65504), and the rounding happens before anything is
compared, so the float16 values are the inputs. The contract asks for M, N and K to be multiples
of 16 (the WMMA tile), so every case is. The shapes are written M x K x N. 16x16x16 is one fragment
and one step of K; 16x4096x16 one fragment and 256 steps; 48x48x80 and 144x80x208 have no
dimension that is a multiple of a block's tile (32 or 128), and K = 48 and 80 end in half a step of
rungs 2 and 3's BK = 32; 32x16x2064 is one row of 17 tiles of 128 columns; 1008x1024x992 has
partial tiles on both sides at a size where caches no longer hide mistakes. For rung 3's pipeline
(4 stages of BK = 32): 32x1104x112 has 35 tiles of K, the last one half, so each stage is filled
8 or 9 times and the loop ends in the middle of a round (K is not a multiple of BK x STAGES = 128),
with the prologue, the steady state and the empty commit groups at the end all exercised;
16x4096x16 has 128 tiles. 304x48x464 has a last row and column of blocks that are partly inside C
(48 of 128 rows: one warp's 64 rows only three of its four m16 tiles, the other warp row none;
80 of 128 columns: one warp's 32 columns half inside), on a grid of 3 x 4 blocks.

Rung 4 (128 x 256 tiles, steps of BK = 64, 4 stages, pairs of tile rows per cluster). Every case
with M up to 128 has a second tile of its pair wholly below C (it copies and multiplies, and must
store nothing), and every K that is not a multiple of 64 ends in a part of a step that TMA fills
with zeros (16x16x16 is a quarter of one step). 1040x1296x2112 has partial tiles on all sides: 16
of 128 rows in the last tile row, 64 of 256 columns in the last tile column (whose other three
64-column boxes of B lie wholly right of C), an odd number of tile rows (9: the last pair's second
tile below C) and 20 steps and a quarter of K. 16x4096x16 takes 64 steps through the 4 stages, a
stage refilled 16 times; 384x6160x768 takes 97 per tile, on 6 pairs with their last tile rows
below C. 2320x336x4112 has 170 pairs of tiles, more than an H100 runs clusters at once (one CTA
per SM, at most 66 clusters), so a cluster walks several, and its 6 steps per tile carry the stage
count across tiles in the middle of a round (as 4096x4096x4096 does, with 64 steps).

The tolerance. The reference is the float64 product of the float16 values: every product of two
halves is exact in float64 (22 significant bits) and so is, to 1e-16, their sum, so what is left
is the error of the kernel's own additions. A tensor core multiplies halves exactly, but it does
not add the way a chain of FMAs does: per instruction it aligns the products and the accumulator
to the largest exponent among them, drops the bits that fall below the float32 frame and
normalises the sum by truncation (Fasi, Higham, Mikaitis and Pranesh, "Numerical behavior of
NVIDIA tensor cores", PeerJ CS 2021, measured V100, T4 and A100; Khattak and Mikaitis, "Accurate
models of NVIDIA tensor cores", 2025, model H100 and B200). The classical worst case,
K * u * sum_k |a_k b_k| with u = 2^-23 for truncation, is 0.08 at K = 4096 for these inputs
(sum_k |a_k b_k| ~ K * 2 / (16 pi)): too loose to tell a right kernel from one that loses a term.
The errors are far smaller in practice: a float64 emulation of such an accumulation (align and
truncate with 0 or 3 extra bits, in blocks of 8 or 16 products, normalise toward zero) over 65536
dot products of K = 4096 gave a median error of 4e-6 to 1.5e-5 and a maximum of 7.5e-5 to 9.7e-5
(2e-5 at K = 1024); exact blocks rounded to nearest give at most 1e-5. atol = 1e-3 leaves a factor
of 10 over those for the 2^24 outputs of each timed 4096^3 call (the maximum grows about as K does:
some 1.5e-4 for rung 4's case of K = 6160, on 3e5 outputs), and no rtol is needed (the
reference rounded to float32 is within 2^-24 |C| of the float64 product, under 1e-6).

What it rejects: a lost step of K drops 16 products of standard deviation 1/16 each, an error of
0.25 rms (median 0.16), past atol for 99.7% of the elements (all of 16x16x16 become 0); a single
lost product is off by |a_k b_k|, above 1e-3 for about 95% of the elements; a fragment of A read
as column-major (the transpose of each 16 x 16 block) is off by about as much as C itself;
accumulating in half instead of float rounds the running sum 256 times to 11 bits at K = 4096, a
median error of 5e-3 (87% of the elements past atol); and a half copy of the right answer is off
by up to 2^-11 |C|, past 1e-3 for about a sixth of the elements of 16x4096x16 (those with
|C| > 4; |C| has a standard deviation of sqrt(K) / 16 = 4 there).

Rung 2's shared tiles are padded (rows of 40 and 136 halves): fragments loaded with the unpadded
row length misread 15 of their 16 rows from 16x16x16 on.

Rung 3. Its swizzle is checked by behaviour only: a swizzle applied on one side (the cp.async
writes or the ldmatrix reads) but not the other, or two different ones, puts chunks where the
reads do not look, wrong from 16x16x16 on; a different swizzle used consistently, or none, gives
right values and only bank conflicts, a matter of speed that no check here judges. B's fragments
need ldmatrix's .trans (mma's .col operand holds pairs of consecutive k for one n, B's rows are
k): without it each 8 x 8 block of B is used transposed, wrong from 16x16x16 on. Waiting for
STAGES - 1 groups instead of STAGES - 2 lets a tile be read before its copies have landed; tile 0
always is (the wait returns at once with the prologue's 3 groups in flight), so every case is
wrong. Chunks past K must be zeros in both tiles: the tail of K adds products of A's and B's
chunks there, and a chunk copied from elsewhere (src_bytes 16 where 0 belongs) makes them real
products, wrong in every case whose K is not a multiple of 32 (the first, 16x16x16, among them);
one operand zero-filled is enough for the values, so a kernel that forgets it on one side only
passes them, and only memcheck shows its reads past the matrix. A stage refilled before the
barrier that ends every warp's reads of its previous tile is a race whose copies land hundreds of
cycles after they are issued, mostly after the slow warp's last read: only racecheck finds it,
on the build whose cp_async_16 copies at once (COURSE_SYNC_COPIES: racecheck counts an
asynchronous write at its wait; 16x4096x16 and 32x1104x112 are small cases that refill stages). Below compute
capability 8.0 the build of rung 3 is an empty kernel (and hgemm_3 returns cudaErrorNotSupported):
the rules find no HMMA and no mma.sync in it, and their message says that rung 3 needs sm_80. Rung 3
does not say so in its Entry, so there the whole task is a rule violation.

Rung 4 runs on compute capability 9.0 alone: the task is built for the architecture-specific target
sm_90a (arch_specific; sm_90a's PTX and SASS run on no other card), and hgemm_4's Entry says
min_cc = max_cc = (9, 0). On any other card the grader skips it, with the reason, leaving rungs 1 to
3 to be graded: none of its cases, timings or ladder rows, no rule on its code (on a build for
another target its kernel is empty) and no performance points. Its mistakes, each with a broken
variant: a consumer that waits for the other parity of a full barrier reads every stage before its
copies land (a fresh barrier passes a wait for parity 1 at once), wrong from 16x16x16 on; a wgmma
told that B's tile is K-major (TRANS_B 0) reads each 8 x 8 core matrix of it transposed, wrong from
16x16x16 on; an epilogue that stores all of its 64 x 256 accumulators writes rows below C into the
grader's fence from 16x16x16 on; k_tiles = K / BK forgets the last part of a step, and 16x16x16
then has none at all; a full barrier told only of the bytes of this CTA's own copies (A's tile and
its half of B) completes before the partner's half of B has landed, so a stage is read early (wrong)
or, once the bytes that land after its completion have pushed a later phase's count below zero, a
phase never completes and the kernel hangs (the grader's timeout). Waiting for the previous step's
wgmmas (wgmma_wait<1>) before releasing its stage matters as much, but a stage released early is
refilled hundreds of cycles later, after the wgmmas have read it: the values almost never show that
race, no check here is designed to find it (racecheck's view of wgmma's and TMA's asynchronous
accesses is untested here), and it has no variant.
"""

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

ARGS = [In("A", "f16"), In("B", "f16"), Out("C"), Int("M"), Int("N"), Int("K")]
TIMING = "4096x4096x4096"


def shape(m, k, n):
    """A case of shape M x K x N. The racecheck runs the small cases only: those up to 2^22
    multiply-adds, which include rung 2 reloading its shared tiles (144x80x208: 3 steps of K) and
    rung 3 refilling its stages (16x4096x16 and 32x1104x112: 128 and 35 tiles of K in 4 stages)."""
    return Case(f"{m}x{k}x{n}", small=m * k * n <= 1 << 22, M=m, K=k, N=n)


def make_inputs(p, rng):
    m, k, n = p["M"], p["K"], p["N"]
    a = (rng.randn(m, k) / 4).half()
    b = (rng.randn(k, n) / 4).half()
    return {"A": a, "B": b, "M": m, "N": n, "K": k}


def reference(v):
    import torch

    return {"C": (v["A"].double() @ v["B"].double()).to(torch.float32)}


# The baseline's own half output (cuBLAS writes C in the inputs' dtype), kept from call to call so
# that no timed call pays for an allocation. One at a time: a new size replaces the last one.
_C16 = {}


def cublas(v, o):
    import torch

    # FP32 accumulation all the way, as the rungs do: no split-K partial sums added in half
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    a, b = v["A"], v["B"]
    c = _C16.get("C")
    if c is None or c.shape != (a.shape[0], b.shape[1]) or c.device != a.device:
        c = _C16["C"] = torch.empty(a.shape[0], b.shape[1], dtype=torch.float16, device=a.device)
    torch.matmul(a, b, out=c)


def flops(v):
    return 2.0 * v["M"] * v["N"] * v["K"]  # one multiply and one add per term of every dot product


def entry(symbol, **only):
    return Entry(symbol, ARGS, reference=reference, baseline=cublas, flops=flops, flop_peak="tensor", **only)


RUNGS = ["hgemm_1", "hgemm_2", "hgemm_3", "hgemm_4"]
# rung 4 is built for sm_90a (the task's arch_specific), whose code runs on compute capability 9.0 alone
HOPPER = {"min_cc": (9, 0), "max_cc": (9, 0), "needs": "Hopper: wgmma, TMA; built for sm_90a"}

# The mistakes these checks are designed to catch, each with the input or check that exposes it
# (lab2/solutions/broken.py has a variant of each).
MISTAKES = {
    "K tail": "16x16x16 (one step; a quarter of one of rung 4's steps of 64), 16x4096x16 and 1040x1296x2112 (rung 4: "
    "20 steps and a quarter)",
    "missing barrier": "the sanitizer (racecheck) on 144x80x208, three steps of K",
    "layout": "16x16x16: a fragment declared col_major reads its block transposed",
    "tile overhang": "16x16x16 and 48x48x80: fragments outside C, behind the grader's fence (rung 4: the rows of its "
    "128 x 256 tile and of its pair's second tile, wholly below C)",
    "leading dimension": "16x16x16 and every case of rung 2: fragments loaded with the unpadded row length",
    "pipeline wait count": "every case from 16x16x16 on: cp_async_wait<STAGES - 1> returns with tile 0's copies "
    "still in flight, and its fragments are loaded from stale shared memory",
    "zero fill": "16x16x16 and every case whose K ends in half a tile of 32: chunks past K copied instead of zeroed "
    "(src_bytes 16) add products of real values; reads past the matrix show under memcheck",
    "trans": "16x16x16: B's fragments loaded without ldmatrix's .trans use each 8 x 8 block of B transposed",
    "stage overwrite": "the sanitizer (racecheck) on 16x4096x16 and 32x1104x112: a stage refilled before the barrier "
    "that ends every warp's reads of its previous tile",
    "barrier phase": "16x16x16 (rung 4): a consumer that waits for the other parity of a stage's full barrier passes "
    "a fresh barrier at once and reads the stage before its copies land",
    "wgmma transpose": "16x16x16 (rung 4): B's tile is n-major; a wgmma told it is K-major (TRANS_B 0) reads it "
    "transposed",
    "expect_tx": "16x4096x16 and the larger cases (rung 4): a full barrier told of this CTA's own copies only, not "
    "the half of B its partner multicasts, completes early (wrong values) or, its count pushed below zero, never "
    "(a hang, the grader's timeout)",
}

TASK = CudaTask(
    lab="lab2",
    number="15",
    title="tensor-core GEMM (WMMA, mma.sync, wgmma)",
    mistakes=MISTAKES,
    sources=["15_tensor_core.cu"],
    entries=[entry("hgemm_1"), entry("hgemm_2"), entry("hgemm_3"), entry("hgemm_4", **HOPPER)],
    arch_specific=True,  # sm_90a on a 9.0 card (rung 4's wgmma, setmaxnreg, multicast); the plain target elsewhere
    cases=[
        shape(16, 16, 16),
        shape(16, 4096, 16),
        shape(48, 48, 80),
        shape(144, 80, 208),
        shape(32, 16, 2064),
        shape(256, 256, 256),
        shape(1008, 1024, 992),
        shape(32, 1104, 112),
        shape(304, 48, 464),
        shape(1040, 1296, 2112),
        shape(384, 6160, 768),
        shape(2320, 336, 4112),
        shape(4096, 4096, 4096),
    ],
    make_inputs=make_inputs,
    tolerance={"f32": (1e-3, 0.0)},
    timing_case=TIMING,
    # every timed call gets a fresh draw and its own float64 reference (a 4096^3 DGEMM, a few ms)
    timeout=120,
    rules=[
        NO_LIBRARIES,
        # the SASS of the kernels each rung reaches (and, on a GPU, launched) holds HMMA instructions
        uses_tensor_cores("every rung multiplies on the tensor cores (wmma::mma_sync; rung 3's mma.sync needs sm_80+)"),
        uses_shared_memory(
            "rungs 2 and 3 stage the tiles of A and B in shared memory", r"hgemm_smem_kernel|hgemm_mma_kernel"
        ),
        uses_syncthreads(
            "a shared tile must be complete before a warp loads fragments from it, and read by every warp "
            "before it is replaced",
            r"hgemm_smem_kernel|hgemm_mma_kernel",
        ),
        # rung 3's lesson is the PTX itself: the instructions, in asm statements of the kernel it launches
        uses_inline_ptx(
            r"mma\.sync\.aligned\.m16n8k16", "rung 3 multiplies with mma.sync m16n8k16 (sm_80+)", "hgemm_3"
        ),
        uses_inline_ptx(r"ldmatrix\.sync\.aligned", "rung 3 loads its fragments with ldmatrix", "hgemm_3"),
        uses_inline_ptx(r"cp\.async\.c[ag]\.shared\.global", "rung 3 fills its stages with cp.async", "hgemm_3"),
        # rung 4's: judged only where it runs (a 9.0 card, the sm_90a build); elsewhere its kernel is empty
        uses_inline_ptx(r"wgmma\.mma_async", "rung 4 multiplies with wgmma.mma_async (sm_90a)", "hgemm_4"),
        uses_inline_ptx(r"cp\.async\.bulk\.tensor", "rung 4 copies its tiles with TMA", "hgemm_4"),
        uses_inline_ptx(r"mbarrier\.try_wait", "rung 4 hands its stages over through mbarriers", "hgemm_4"),
    ],
    # Not gates: no reference timing yet (see the chapter); the lead sets them from an H100 run.
    perf=[
        PerfTarget("hgemm_2", "speedup", 0.25, 2, gate=False),
        PerfTarget("hgemm_3", "speedup", 0.45, 2, gate=False),
        PerfTarget("hgemm_4", "speedup", 0.9, 2, gate=True),
    ],
    ladder=Ladder(
        name="hgemm",
        rungs=RUNGS,
        sweep=[Case(f"{n}³", M=n, K=n, N=n) for n in (1024, 2048, 4096)],
        baselines={"cuBLAS": cublas},
        metric="gflops",
        labels={
            "hgemm_1": "1 WMMA, fragments from global memory",
            "hgemm_2": "2 WMMA, 128 × 128 tiles in padded shared memory",
            "hgemm_3": "3 mma.sync + ldmatrix, swizzled shared memory, 4-stage cp.async",
            "hgemm_4": "4 TMA + wgmma, warp-specialised, clusters of 2 (sm_90a)",
        },
    ),
)


def test_tensor_core(grade):
    grade(TASK)
