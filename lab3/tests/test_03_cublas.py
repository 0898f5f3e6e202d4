"""Checks for lab3/03_cublas.cu: a linear layer y = x · wᵀ + b through cublasGemmEx (the row-major
arrays read by a column-major library), and y = relu(x · wᵀ + b) in one cublasLtMatmul with the
RELU_BIAS epilogue, timed against torch (addmm, then relu).

The inputs. x (B, in) is standard normal, w (out, in) standard normal over sqrt(in) (so that every
y has a standard deviation near 1, as in a trained layer), b (out,) standard normal. The shapes are
the MLP's two layers (784 -> 1000, 1000 -> 10), one odd size (33 -> 17) and a square one (256 ->
256), where a transposed w has the right shape and only its values betray it, each at B = 1, 7,
64 and 4096.

The tolerance with TF32 off (every case). Each y is a dot product of length K = in accumulated in
float32, plus the bias. The worst case, gamma_K * sum_k |x_k w_k| (Higham, §3.1), is 1.2e-3 at
K = 1000 for these inputs: too loose to see a lost term. Round-to-nearest errors behave like
independent zero-mean variables (Higham and Mary, 2019) and the partial sums grow like
sqrt(k / K), so the error is about 2^-24 * sqrt(K / 6), 8e-7 rms at K = 1000, and under 5e-6 over
the 4 million outputs of a 4096 x 1000 case; cuBLAS's blocked and split sums have shorter chains
and smaller errors. atol = 5e-5 leaves a factor of 10 over that; no rtol is needed (|y| < 8, where
a float32 ulp is 5e-7). What it rejects: zeros and a missing bias are off by |y| and |b|, about 1;
a transposed w (the column-major mix-up) by about as much as y itself; one lost term by
|x_k w_k|, above 5e-5 for 99% of the elements; TF32 used where it was not asked for by about
4e-4 rms (inputs rounded to 11 significant bits), past atol for nearly every element.

The tolerance with TF32 on (a custom check, since a case carries one tolerance). TF32 keeps 10
mantissa bits: rounding x and w to it changes each by at most 2^-10 relatively (2^-11 if rounded
to nearest), each exact float32 product of two TF32 values by at most 2^-9 + 2^-20, and the
float32 sum adds gamma_K. So |y - y_exact| <= (2^-9 + (K + 4) 2^-23) * sum_k |x_k||w_k| +
2^-22 (|y| + |b|) holds for every element, whatever the rounding mode and the order of the sum;
it is checked element by element. It is about 2^-9 * 0.64 sqrt(K): 0.04 at K = 1000 and 0.08 at
K = 4096, so zeros, a missing bias (|b| ~ 1) and a transposed w still fail. At 4096 x 4096 x 4096
the TF32 result must also differ from the float32 one (if it is bit for bit the same, the compute
type asked for was not TF32).

Unaligned pointers (the custom check `unaligned_pointers`). Every case's tensor starts on a
512-byte boundary, where cuBLASLt's heuristic, which assumes 256-byte alignment unless told
otherwise (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES), is right. The contract takes any float
pointer, as a torch view gives: both entries run with x, w, b and y at element offsets 1, 3, 2
(then 4, a 16-byte-aligned bias) and 1 (4 to 12 bytes past a 16-byte boundary;
lab3/tests/unaligned.py) at 64 x 256 -> 256 and
7 x 784 -> 1000, widths that are multiples of 4 so that kernels loading 16 bytes at a time are
candidates, under the float32 tolerance above. An algorithm chosen for 256-byte alignment then
faults or is refused (`crash`), or reads the wrong elements (`wrong`).

Timing, reported and not gated: linear_gemmex with TF32 on against off at 4096 x 4096 x 4096, and
the time per call at B = 1 (where a handle created per call would show); linear_relu_lt against
torch at B = 4096, 784 -> 1000.
"""

from grader.child.compare import past_tf32_bound
from grader.child.context import RunContext
from grader.tasks import Case, CudaTask, Entry, In, Int, Out, PerfTarget
from grader.tasks.rules import calls, library_does_the_product
from grader.tasks.seeds import seed_for
from grader.tasks.spec import Rng

ARGS_LT = [In("x"), In("w"), In("b"), Out("y"), Int("B"), Int("in"), Int("out")]
ARGS_GEMMEX = [*ARGS_LT, Int("tf32")]
BATCHES = [1, 7, 64, 4096]
LAYERS = [(784, 1000), (1000, 10), (33, 17), (256, 256)]
TIMING = "4096x784->1000"
SWEEP = [1, 4, 16, 64, 256, 1024, 4096]  # batch sizes of the throughput plot (make bench-lab3)
BIG = (4096, 4096, 4096)  # B, in, out of the TF32 comparison
# the cases of the TF32 bound: odd, square (the mix-up fits) and one of each layer
TF32_SHAPES = [(1, 33, 17), (7, 1000, 10), (64, 256, 256), (64, 784, 1000), BIG]


def case(batch, n_in, n_out):
    # "in" is a Python keyword: the parameters go in as a dict
    return Case(f"{batch}x{n_in}->{n_out}", **{"B": batch, "in": n_in, "out": n_out, "tf32": 0})


def make_inputs(p, rng):
    batch, n_in, n_out = p["B"], p["in"], p["out"]
    return {
        "x": rng.randn(batch, n_in),
        "w": rng.randn(n_out, n_in) / n_in**0.5,
        "b": rng.randn(n_out),
        "B": batch,
        "in": n_in,
        "out": n_out,
        "tf32": p.get("tf32", 0),
    }


def exact(v):
    """x · wᵀ + b in float64: every product and sum of float32 values is exact to 1e-16 there."""
    return v["x"].double() @ v["w"].double().T + v["b"].double()


def reference_linear(v):
    import torch

    return {"y": exact(v).to(torch.float32)}


def reference_linear_relu(v):
    import torch

    return {"y": torch.relu(exact(v)).to(torch.float32)}


def _float32_matmul():
    import torch

    # TF32 would round x and w to 10-bit mantissas: float32 against float32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def torch_linear(v, o):
    import torch

    _float32_matmul()
    torch.addmm(v["b"], v["x"], v["w"].T, out=o["y"])


def torch_linear_relu(v, o):
    import torch

    _float32_matmul()
    torch.relu_(torch.addmm(v["b"], v["x"], v["w"].T, out=o["y"]))


def flops(v):
    return 2.0 * v["B"] * v["in"] * v["out"]  # one multiply and one add per term; the bias is nothing next to it


def _call(ctx, values, tf32, where):
    import torch

    y = torch.full((values["B"], values["out"]), float("nan"), device="cuda")
    ctx.check_rc("linear_gemmex", ctx.entry("linear_gemmex")({**values, "y": y, "tf32": tf32}), where)
    torch.cuda.synchronize()
    return y


def tf32_within_its_bound(ctx: RunContext) -> None:
    """linear_gemmex with tf32 = 1: every element within the TF32 bound of the module docstring;
    at 4096³ not bit for bit the float32 result."""
    import torch

    for shape in TF32_SHAPES:
        batch, n_in, n_out = shape
        where = f"linear_gemmex with tf32=1 at {batch}x{n_in}->{n_out}"
        rng = Rng(seed_for(ctx.task, f"tf32 {shape}"), "cuda")
        v = make_inputs({"B": batch, "in": n_in, "out": n_out}, rng)
        y = _call(ctx, v, 1, where)
        ref = exact(v)
        err = (y.double() - ref).abs()
        past = past_tf32_bound(y, ref, v["x"], v["w"], ref, v["b"])
        if past:
            ctx.fail(f"{where}: {past}")
        if shape == BIG and torch.cuda.get_device_capability() >= (8, 0):
            y32 = _call(ctx, v, 0, where.replace("tf32=1", "tf32=0"))
            if torch.equal(y, y32):
                ctx.fail(
                    f"{where}: the result is bit for bit the one of tf32=0, so one of the two does not use the "
                    f"compute type it asks for: CUBLAS_COMPUTE_32F_FAST_TF32 when tf32 != 0, CUBLAS_COMPUTE_32F "
                    f"when tf32 == 0"
                )
            ctx.note(
                f"largest error at {batch}x{n_in}->{n_out}: TF32 {float(err.max()):.2e}, "
                f"float32 {float((y32.double() - ref).abs().max()):.2e}"
            )


def unaligned_pointers(ctx: RunContext) -> None:
    """Both entries on pointers that are legal but not 16-byte aligned (module docstring)."""
    from lab3.tests.unaligned import call_unaligned

    for batch, n_in, n_out in ((64, 256, 256), (7, 784, 1000)):
        v = make_inputs({"B": batch, "in": n_in, "out": n_out}, Rng(seed_for(ctx.task, f"unaligned {n_in}"), "cuda"))
        # b 8 bytes past a 16-byte boundary, then on one (an epilogue may load the bias 16 bytes at a time)
        for offsets in ((1, 3, 2, 1), (1, 3, 4, 1)):
            where = f"{batch}x{n_in}->{n_out} with x, w, b and y at element offsets {offsets} (unaligned)"
            call_unaligned(ctx, "linear_gemmex", {**v, "tf32": 0}, reference_linear(v), 5e-5, where, offsets)
            call_unaligned(ctx, "linear_relu_lt", v, reference_linear_relu(v), 5e-5, where, offsets)


def tf32_speed(ctx: RunContext) -> None:
    """Reported, not judged: TF32 on against off at 4096³, and the time of one small call."""
    import torch

    from grader.child.timing import median_ms

    fn = ctx.entry("linear_gemmex")
    for batch, n_in, n_out in (BIG, (1, 33, 17)):
        rng = Rng(seed_for(ctx.task, f"speed {batch}x{n_in}->{n_out}"), "cuda")
        v = make_inputs({"B": batch, "in": n_in, "out": n_out}, rng)
        v["y"] = torch.empty(batch, n_out, device="cuda")
        ms = {}
        for tf32 in (0, 1):
            args = fn.marshal({**v, "tf32": tf32})
            ms[tf32] = median_ms(lambda args=args: fn.call_raw(args))
        torch.cuda.synchronize()
        label = f"{batch}x{n_in}->{n_out}"
        if batch == BIG[0]:
            tflops = flops(v) / 1e9
            ctx.note(
                f"linear_gemmex at {label}: float32 {ms[0]:.3f} ms ({tflops / ms[0]:.1f} TFLOP/s), "
                f"TF32 {ms[1]:.3f} ms ({tflops / ms[1]:.1f} TFLOP/s): TF32 is {ms[0] / ms[1]:.2f}x faster"
            )
        else:
            ctx.note(f"linear_gemmex at {label}: {ms[0] * 1e3:.1f} µs per call (bias kernel + GEMM)")


TASK = CudaTask(
    lab="lab3",
    number="03",
    title="cuBLAS (GemmEx, cuBLASLt epilogue, TF32)",
    sources=["03_cublas.cu"],
    entries=[
        Entry("linear_gemmex", ARGS_GEMMEX, reference=reference_linear, baseline=torch_linear, flops=flops),
        Entry("linear_relu_lt", ARGS_LT, reference=reference_linear_relu, baseline=torch_linear_relu, flops=flops),
    ],
    cases=[case(batch, n_in, n_out) for n_in, n_out in LAYERS for batch in BATCHES],
    make_inputs=make_inputs,
    tolerance={"f32": (5e-5, 0.0)},
    timing_case=TIMING,
    sweep=[case(b, 784, 1000) for b in SWEEP],
    checks=[tf32_within_its_bound, unaligned_pointers, tf32_speed],
    libraries=["cublas", "cublasLt"],
    timeout=120,
    rules=[
        # what each entry point's compiled code calls (a helper it never calls does not count) and,
        # on a GPU, which library's kernels one call of it launched
        calls("cublasGemmEx", "linear_gemmex multiplies with cublasGemmEx", "linear_gemmex"),
        calls("cublasLtMatmul", "linear_relu_lt multiplies with cublasLtMatmul", "linear_relu_lt"),
        library_does_the_product("the product runs in cuBLAS's kernels, not in a kernel of yours"),
    ],
    # Not gates: no reference timing yet; the lead sets them from an H100 run.
    perf=[
        PerfTarget("linear_relu_lt", "speedup", 1.0, 2, gate=False),
        PerfTarget("linear_relu_lt", "speedup_over:linear_gemmex", 1.0, 1, gate=False),
    ],
    mistakes={
        "transpose mix-up": "the TF32 bound at 1x33->17 and the square 64x256->256, where x·w has the right shape",
        "missing ReLU": "every call of linear_relu_lt (first the check unaligned_pointers): the negative half of y",
        "missing bias": "every case: b ~ N(0, 1) against atol 5e-5",
        "TF32 flag ignored": "tf32=1 at 4096x4096x4096 must differ from tf32=0, bit for bit",
        "TF32 where float32 was asked": "linear_relu_lt in unaligned_pointers and the cases: TF32 is 3e-4 off",
        # unaligned_pointers holds a solution to the contract (any float address), but no class stands
        # on it: cuBLASLt on an H200 multiplied unaligned operands right even when told they were
        # 256-byte aligned, so that mistake is not one a student can be caught making here
    },
)


def test_cublas(grade):
    grade(TASK)
