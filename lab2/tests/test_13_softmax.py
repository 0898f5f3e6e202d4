"""Checks for lab2/13_softmax.cu: the softmax ladder, four kernels that normalise every row of a
matrix (naive, shared-memory trees, warp shuffles with the row in registers, online softmax),
timed against torch.softmax; and layer norm, an entry point of the same task outside the ladder,
timed against torch.nn.functional.layer_norm.

The inputs. x is standard normal times 3, so a row's outputs span many orders of magnitude and
are far from uniform: the largest output of a row of 4096 is 0.05 to 0.3, hundreds of times
1/4096, and 72% of the outputs are above atol (below).
The case "large inputs" is 100 x + 50 (values up to about 1500): exp(x) overflows float32 past
88.7, so a softmax that does not subtract the row's max, or an online softmax that does not
rescale its sum, returns inf or NaN there. Layer norm's weight is 1 + 0.1 randn and its bias
0.1 randn, as trained layer norms look; ignoring either changes y by about 0.1.

The tolerances, against a float64 reference: |y - ref| <= 1e-12 + 1e-5 |ref| for softmax (each
rung declares its own) and 5e-7 + 1e-5 |ref| for layer norm (the task's).
- Softmax: y_i = exp(x_i - m) / d. In float32, x_i - m is exact for x_i >= m/2 (Sterbenz) and
  otherwise off by at most half an ulp of |x_i - m|, which turns into a relative error of
  u |x_i - m| in y_i (u = 2^-24): about 1e-6 for every output above atol (those have
  |x_i - m| < 16 + ln d). expf is within 2 ulp (2.4e-7), 1/d and the product add u each, and d,
  a sum of positive terms, is off by at most gamma_L = L u / (1 - L u) for a chain of L
  additions. Rungs 2 to 4 chain at most 256 terms per thread plus a tree: an emulation in float32
  of their exact order gives at most 1.3e-6 over all outputs of 64 x 65536, 1024 x 4096 and the
  large inputs. So rtol = 1e-5 holds with a margin of 4 over the worst case, and rejects an fp16
  round trip (2^-11 = 4.9e-4), zeros, and a uniform 1/cols (wrong by a factor of hundreds on each
  row's largest outputs). Rung 1 adds 65536 terms in one chain: in float32 that chain drops every
  term under half an ulp of the running sum and ends up to 2e-4 low, so rung 1 sums in double.
- Layer norm: y = (x - mean) rstd w + b. The relative error of mean, M2 (Welford, then Chan's
  merge) and rsqrtf (2 ulp) is a few 1e-7; it reaches y as an absolute error of about
  |(x - mean) rstd w| times that, which rtol covers except where b cancels the first term and y
  is near 0: there |(x - mean) rstd w| <= |b| + |y| stays under about 0.5, and an emulation of
  the reference kernel over 64M outputs needs atol 5.4e-8 (1.5e-7 with rsqrtf's worst case).
  atol = 5e-7 keeps a margin of 3; an unbiased variance (M2 / (cols - 1)) is wrong by 1.5% at
  1 x 33 and NaN at cols = 1.
- Softmax's atol of 1e-12 only spares the outputs that underflow or go subnormal in float32
  (exp(x_i - m) below about 1e-38 on the large inputs, where float64 still has a value):
  every output a model could notice is judged by rtol alone, to its relative error
  u |x_i - m| (at most about 5e-6 at the edge of float32's normal range).

Rows longer than a block. Rung 2's 256 threads stride four times over a row of 7x1000; rungs 3, 4
and layer norm keep at most 16 floats per thread in registers, so 3x20001 (scalar loads) and
64x65536 (float4 loads) make 1024 threads stream the row, several vectors each: a kernel that
covers only one block's worth of a row, or strides wrongly past it, fails there.

Layer norm on a large mean. The check `layernorm_large_mean` runs before the cases: layer norm on
rows of mean 1e4 and standard deviation 1 (8x33: one warp, scalar loads; 4x1000: 64 threads with
float4s, cached; 2x20001: 1024 threads streaming), against the float64 reference, within 2e-2
absolute. No float32 kernel meets the cases' tolerance there: the mean is rounded to float32's
spacing near 1e4, 2^-10, half of it per rounding, and every y inherits that error times rstd (1).
An emulation of the reference kernel's float32 order (Welford per thread, Chan's merges over the
butterfly, FMAs where nvcc contracts them) over 40 draws of each shape was within 1.9e-3, a
two-pass variance within 1.7e-3: 2e-2 keeps a margin of 10. A one-pass variance, E[x²] − E[x]²,
subtracts two float32s near 1e8, whose spacing is 8: the variance comes out as rounding noise of
several units, or negative (NaN), and y is off by 1 or more in every row of the emulation. An
unbiased variance is off by 1.5% of y at 33 columns, up to about 5e-2: it fails the check too.
"""

from grader.child.context import RunContext
from grader.tasks import NO_LIBRARIES, Case, CudaTask, Entry, Float, In, Int, Out, PerfTarget, uses_shared_memory
from grader.tasks.ladder import Ladder
from grader.tasks.rules import executes
from grader.tasks.seeds import seed_for
from grader.tasks.spec import Rng

SOFTMAX_ARGS = [In("x"), Out("y"), Int("rows"), Int("cols")]
LAYERNORM_ARGS = [In("x"), In("weight"), In("bias"), Out("y"), Int("rows"), Int("cols"), Float("eps")]
# 1x33, 33x1 and 3x20001 have rows that are not a multiple of 4 floats (scalar loads, the last
# one streamed); 7x1000 is a block of 2 warps; 64x65536 does not fit in registers
SHAPES = [(1, 1), (1, 33), (33, 1), (7, 1000), (3, 20001), (1000, 1000), (64, 65536)]
TIMING = (4096, 4096)


def label(shape):
    return "x".join(str(s) for s in shape)


def make_inputs(p, rng):
    rows, cols = p["rows"], p["cols"]
    x = rng.randn(rows, cols) * 3.0
    if p.get("large"):
        x = x * 100.0 + 50.0
    return {
        "x": x,
        "weight": 1.0 + 0.1 * rng.randn(cols),
        "bias": 0.1 * rng.randn(cols),
        "eps": 1e-5,
        "rows": rows,
        "cols": cols,
    }


def softmax_reference(v):
    import torch

    return {"y": torch.softmax(v["x"].double(), dim=1)}


def layernorm_reference(v):
    import torch

    x, w, b = v["x"].double(), v["weight"].double(), v["bias"].double()
    return {"y": torch.nn.functional.layer_norm(x, (v["cols"],), w, b, v["eps"])}


def torch_softmax(v, o):
    import torch

    torch.softmax(v["x"], dim=1)  # its output comes from torch's caching allocator: no GPU time


def torch_layernorm(v, o):
    import torch

    torch.nn.functional.layer_norm(v["x"], (v["cols"],), v["weight"], v["bias"], v["eps"])


def softmax_bytes(v):
    return 8 * v["rows"] * v["cols"]  # x read once, y written once


def layernorm_bytes(v):
    return 8 * v["rows"] * v["cols"] + 8 * v["cols"]  # and weight and bias once


# Layer norm on rows whose mean is large against their spread (see the docstring): one warp with
# scalar loads, a cached block of 64 threads with float4s, and 1024 threads streaming the row.
LARGE_MEAN = 1e4
LARGE_MEAN_SHAPES = [(8, 33), (4, 1000), (2, 20001)]
LARGE_MEAN_ATOL = 2e-2


def layernorm_large_mean(ctx: RunContext) -> None:
    """layernorm on x = 1e4 + randn: right within LARGE_MEAN_ATOL, which any variance computed from
    deviations from the mean meets and E[x^2] - E[x]^2 in float32 misses by far."""
    import torch

    fn = ctx.entry("layernorm")
    rng = Rng(seed_for(ctx.task, "layernorm large mean"), "cuda")
    for rows, cols in LARGE_MEAN_SHAPES:
        v = {
            "x": rng.randn(rows, cols) + LARGE_MEAN,
            "weight": 1.0 + 0.1 * rng.randn(cols),
            "bias": 0.1 * rng.randn(cols),
            "rows": rows,
            "cols": cols,
            "eps": 1e-5,
        }
        expected = layernorm_reference(v)["y"]
        y = torch.full((rows, cols), float("nan"), device="cuda")
        where = f"layernorm on {rows}x{cols} rows of mean {LARGE_MEAN:g} and standard deviation 1"
        ctx.check_rc("layernorm", fn({**v, "y": y}), where)
        torch.cuda.synchronize()
        err = (y.double() - expected).abs()
        bad = ~(err <= LARGE_MEAN_ATOL)  # NaN counts as wrong
        if bool(bad.any()):
            i = int(bad.flatten().nonzero()[0, 0])
            r, c = divmod(i, cols)
            ctx.fail(
                f"{where} is wrong: {int(bad.sum())} of {rows * cols} elements off by more than {LARGE_MEAN_ATOL:g},"
                f" the first y[{r}][{c}] = {float(y[r, c])!r} instead of {float(expected[r, c]):.6f}. Near 1e4 a"
                f" float32's spacing is 2^-10, and near its square, 1e8, it is 8: a variance taken as E[x²] − E[x]²"
                f" subtracts two numbers that differ by about 1 and are each rounded by several units. Accumulate"
                f" deviations from the mean instead (Welford's algorithm, or a second pass over x - mean)"
            )


def softmax_entry(symbol):
    return Entry(
        symbol,
        SOFTMAX_ARGS,
        reference=softmax_reference,
        baseline=torch_softmax,
        bytes_moved=softmax_bytes,
        tolerance={"f32": (1e-12, 1e-5)},
    )


RUNGS = ["softmax_1", "softmax_2", "softmax_3", "softmax_4"]

# The mistakes these checks are designed to catch, each with the input or check that exposes it
# (lab2/solutions/broken.py has a variant of each).
MISTAKES = {
    "overflow": "64x4096 large inputs: 100 x + 50 reaches 1500, past exp's range",
    "multi-warp block": "7x1000 and larger: a row's block holds several warps",
    "long rows": "7x1000, 3x20001, 64x65536: rows past a block's worth, streamed with scalar and float4 loads",
    "unbiased variance": "1x33 and the large-mean check: M2 / (cols - 1) is 3% off at 33 columns",
    "large mean": "layernorm_large_mean: rows of mean 1e4 and std 1, where E[x^2] - E[x]^2 is all rounding",
}

TASK = CudaTask(
    lab="lab2",
    number="13",
    title="softmax ladder and layer norm",
    mistakes=MISTAKES,
    sources=["13_softmax.cu"],
    entries=[softmax_entry(s) for s in RUNGS]
    + [
        Entry(
            "layernorm",
            LAYERNORM_ARGS,
            reference=layernorm_reference,
            baseline=torch_layernorm,
            bytes_moved=layernorm_bytes,
        )
    ],
    cases=[Case(label(s), rows=s[0], cols=s[1]) for s in [*SHAPES, TIMING]]
    + [Case("64x4096 large inputs", rows=64, cols=4096, large=True)],
    make_inputs=make_inputs,
    tolerance={"f32": (5e-7, 1e-5)},
    timing_case=label(TIMING),
    checks=[layernorm_large_mean],
    rules=[
        NO_LIBRARIES,
        uses_shared_memory("rung 2 reduces the row's max and sum through shared memory", "softmax_block_kernel"),
        # the SASS of the kernels each of these reaches, and of the one a call of it launched
        executes(
            r"SHFL\.(BFLY|DOWN)",
            "rungs 3 and 4 and layer norm reduce inside a warp with warp shuffles (__shfl_xor_sync)",
            ["softmax_3", "softmax_4", "layernorm"],
        ),
    ],
    perf=[
        PerfTarget("softmax_4", "speedup", 1.0, 2, gate=True),
        PerfTarget("layernorm", "speedup", 1.0, 2, gate=True),
    ],
    ladder=Ladder(
        name="softmax",
        rungs=RUNGS,
        sweep=[
            Case("4096x4096", rows=4096, cols=4096),
            Case("1024x16384", rows=1024, cols=16384),
            Case("64x65536", rows=64, cols=65536),
        ],
        baselines={"torch": torch_softmax},
        metric="gbps",
        labels={
            "softmax_1": "1 naive (a thread per row, 3 passes)",
            "softmax_2": "2 a block per row, shared-memory trees",
            "softmax_3": "3 warp shuffles, row in registers",
            "softmax_4": "4 online softmax, one (m, d) reduction",
        },
    ),
)


def test_softmax(grade):
    grade(TASK)
