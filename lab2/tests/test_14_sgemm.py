"""Checks for lab2/14_sgemm.cu: the SGEMM ladder, seven kernels for C = A @ B in float32, from one
thread per element with uncoalesced loads to warp tiling, timed against cuBLAS (through torch,
with TF32 off so that it does the same float32 arithmetic).

The inputs. A (M, K) and B (K, N) are standard normal. The shapes are written M x K x N. In the
cases from 33x17x65 to 127x255x129 no dimension is a multiple of a tile (32, 64, 128) or of BK (8,
16), so every rung meets partial tiles in M, N and K; 100x36x68 does so on the float4 path of rungs
6 and 7 (K and N multiples of 4); the 64x64x64 case whose A and B start one float into their
buffers has whole tiles but rows that are not 16-byte aligned (the scalar fallback); 1x1x1, 1x1x7
and 7x1x1 are a single partial tile.

The tolerance. Each element of C is a dot product of length K, and every rung adds its K products
one by one into a float32 register (rounding after each multiply-add), so the computed sum is off
by sum_k delta_k * s_k, where s_k is the partial sum after k terms and |delta_k| <= u = 2^-24. The
worst case, gamma_K * sum_k |a_ik| |b_kj| (Higham, Accuracy and Stability of Numerical Algorithms,
§3.1), is about 0.64 at K = 4096 for standard normal inputs: too loose to see a lost term. But the
rounding errors of round-to-nearest behave like independent zero-mean variables (Higham and Mary,
"A new approach to probabilistic rounding error analysis", 2019), and |s_k| grows like sqrt(k), so
the error is about u * sqrt(sum_k s_k^2 / 3) ~ u * K / sqrt(6) ~ 1e-4 at K = 4096. A float64
emulation of that float32 chain on 2^20 elements at K = 4096 measured a median error of 3.6e-5, a
99.9999th percentile of 8.1e-4 and a maximum of 8.2e-4; orders that add in a tree or in blocks
have shorter chains and smaller errors. atol = 4e-3 leaves a factor of about 5 over that for the
many 4096^2 outputs the timed calls check too, and no rtol is needed (the reference itself, rounded
to float32, is within 2e-5 of the float64 product). What it rejects: a lost term changes an
element by |a_ik b_kj|, more than 4e-3 for 98% of the elements; a lost K tail of up to 15 terms or
a lost tile is off by about sqrt(terms), hundreds of times atol; TF32 (inputs rounded to 10-bit
mantissas) is off by about 2.5e-4 * sqrt(K) rms, up to 0.016 at K = 129, where a fifth of the
elements miss atol. An fp16 copy of the right answer fails on 65x129x31, where |C| passes 16.

1x1x1, 1x1x7 and 33x17x65 have N not a multiple of 4, so rungs 6 and 7 take their scalar path, where
a row may end inside a group of four: a store guarded by the group's first column writes past the
row, and past C into the grader's fence.
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
from grader.tasks.rules import executes

ARGS = [In("A"), In("B"), Out("C"), Int("M"), Int("N"), Int("K")]
TIMING = "4096x4096x4096"
TILED = r"sgemm_(smem|reg1d|reg2d|vec4|warptile)_kernel"  # the rungs that stage tiles in shared memory


def shape(m, k, n, label=None, **extra):
    """A case of shape M x K x N. The racecheck runs the small cases only: the ones with several
    K steps are marked small so that it sees a tile being reloaded."""
    return Case(label or f"{m}x{k}x{n}", small=m * k * n <= 1 << 22, M=m, K=k, N=n, **extra)


def make_inputs(p, rng):
    m, k, n, offset = p["M"], p["K"], p["N"], p.get("offset", 0)
    # offset = 1: A and B start one float (4 bytes) past a 16-byte boundary, so no row is aligned
    a = rng.randn(m * k + offset)[offset:].view(m, k)
    b = rng.randn(k * n + offset)[offset:].view(k, n)
    return {"A": a, "B": b, "M": m, "N": n, "K": k}


def reference(v):
    import torch

    return {"C": (v["A"].double() @ v["B"].double()).to(torch.float32)}


def cublas(v, o):
    import torch

    # TF32 would round A and B to 10-bit mantissas: the comparison must be float32 against float32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.matmul(v["A"], v["B"], out=o["C"])


def flops(v):
    return 2.0 * v["M"] * v["N"] * v["K"]  # one multiply and one add per term of every dot product


def entry(symbol):
    return Entry(symbol, ARGS, reference=reference, baseline=cublas, flops=flops)


RUNGS = [f"sgemm_{i}" for i in range(1, 8)]

# The mistakes these checks are designed to catch, each with the input or check that exposes it
# (lab2/solutions/broken.py has a variant of each).
MISTAKES = {
    "K tail": "1x1x1, 33x17x65 and 127x255x129: K not a multiple of a K step",
    "missing barrier": "the sanitizer (racecheck) on the small cases with several K steps",
    "tile overhang": "1x1x1 and 33x17x65: tiles past C's last row, behind the grader's fence",
    "layout": "33x17x65: A read column-major is wrong once M and K exceed 1",
    "row end inside a float4": "1x1x1 and 33x17x65: N not a multiple of 4, so a float4 straddles a row's end",
}

TASK = CudaTask(
    lab="lab2",
    number="14",
    title="SGEMM ladder",
    mistakes=MISTAKES,
    sources=["14_sgemm.cu"],
    entries=[entry(s) for s in RUNGS],
    cases=[
        shape(1, 1, 1),
        shape(1, 1, 7),
        shape(7, 1, 1),
        shape(33, 17, 65),
        shape(65, 129, 31),
        shape(100, 36, 68),
        shape(64, 64, 64, "64x64x64 A and B one float in", offset=1),
        shape(127, 255, 129),
        shape(1000, 1000, 1000),
        shape(4096, 4096, 4096),
    ],
    make_inputs=make_inputs,
    tolerance={"f32": (4e-3, 0.0)},
    timing_case=TIMING,
    # the naive rung takes about 0.3 s per call at 4096^3 (it is bound by L1 serving 32 rows per load),
    # and the timing case calls every rung dozens of times, with a float64 reference for each draw
    timeout=180,
    rules=[
        NO_LIBRARIES,
        uses_shared_memory("rungs 3 to 7 stage tiles of A and B in shared memory", TILED),
        uses_syncthreads("a shared tile must be complete before it is read, and read before it is replaced", TILED),
        # 16-byte global loads and stores in the kernels rungs 6 and 7 reach (their scalar path for
        # a ragged N launches another instantiation, so a call's kernel is not judged)
        executes(
            r"(LDG|STG)(\.\w+)*\.128",
            "rungs 6 and 7 move four floats per load and store (float4)",
            ["sgemm_6", "sgemm_7"],
            each_call=False,
        ),
    ],
    perf=[PerfTarget("sgemm_7", "speedup", 0.8, 2, gate=True)],
    ladder=Ladder(
        name="sgemm",
        rungs=RUNGS,
        sweep=[Case(f"{n}²", M=n, K=n, N=n) for n in (1024, 2048, 4096)],
        baselines={"cuBLAS": cublas},
        metric="gflops",
        labels={
            "sgemm_1": "1 naive (`threadIdx.x` along M)",
            "sgemm_2": "2 coalesced (`threadIdx.x` along N)",
            "sgemm_3": "3 shared-memory tiles, 32 × 32",
            "sgemm_4": "4 1D register tiling, 8 results per thread",
            "sgemm_5": "5 2D register tiling, 8 × 8 per thread",
            "sgemm_6": "6 float4 loads, A transposed in shared memory",
            "sgemm_7": "7 warp tiling, next tile in flight",
        },
    ),
)


def test_sgemm(grade):
    grade(TASK)
