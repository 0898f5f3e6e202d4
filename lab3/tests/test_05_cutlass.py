"""Checks for lab3/05_cutlass.cu: y = relu(x · wᵀ + b) as one CUTLASS 2.x GEMM whose epilogue adds
the bias (read as a C matrix of leading dimension 0) and applies the ReLU, in exact float32 on the
CUDA cores (linear_relu_cutlass_simt) and in TF32 on the tensor cores (linear_relu_cutlass_tf32),
timed against torch (cuBLAS underneath) in the same run.

The inputs. x (B, in) is standard normal, w (out, in) standard normal over sqrt(in) (so that every
y has a standard deviation near 1, as in a trained layer), b (out,) standard normal. The shapes are
the MLP's two layers (784 -> 1000, 1000 -> 10), one odd size (33 -> 17: no dimension a multiple of
4 or of a tile) and a square one (256 -> 256, where w read without its transpose has the right
shape and only its values betray it), each at B = 1, 7, 64 and 4096. 784 -> 1000 and 256 -> 256
take the TF32 kernel that loads 4 floats at a time; 1000 -> 10 and 33 -> 17 the one that loads one.

The tolerance of the SIMT entry (float32, no TF32) is task 03's, for the same reason: each y is a
float32 dot product of length K = in plus the bias; round-to-nearest errors behave like
independent zero-mean variables (Higham and Mary, 2019), about 2^-24 · sqrt(K / 6) = 8e-7 rms at
K = 1000 and under 5e-6 over the 4 million outputs of a 4096 x 1000 case, even summed in one chain
per thread as a SIMT GEMM does. atol = 5e-5 leaves a factor of 10; no rtol is needed (|y| < 8,
where a float32 ulp is 5e-7). It rejects zeros and a missing bias (off by |y| and |b|, about 1), a
missing ReLU (off by |y| on the negative half), a transposed w (off by about as much as y), and
TF32 used where exact float32 was asked for (4e-4 rms).

The tolerance of the TF32 entry is derived from TF32's 10 mantissa bits and K. Rounding x and w to
TF32 changes each by at most 2^-10 relatively (2^-11 when rounded to nearest, as CUTLASS does on
sm_90), each exact product of two TF32 values by at most 2^-9 + 2^-20, and the float32 sum adds
gamma_K. So |y - y_exact| <= (2^-9 + (K + 4) 2^-23) · sum_k |x_k||w_k| + 2^-22 (|y| + |b|) for every
element, whatever the rounding and the order of the sum (task 03's bound). sum_k |x_k||w_k| is about
0.64 sqrt(K), 24 at most over the outputs of a K = 1000 case, which makes the bound 0.048: atol =
5e-2 holds for every element of every case. The custom check `tf32_within_its_bound` applies the
bound element by element, where it is 0.007 at K = 33. Zeros, a missing ReLU, a missing bias
(|b| < 0.05 for 4% of the b) and a transposed w still fail by far. The observed error is much
smaller (about 3e-4 rms, 2e-3 at most, for round-to-nearest), and must be larger than float32's:
at 64 x 784 -> 1000, a TF32 result with every element within the SIMT tolerance was not computed
in TF32 (`tf32_within_its_bound` fails it).

Unaligned pointers (the custom check `unaligned_pointers`). Every case's tensor starts on a 512-byte
boundary, so the TF32 entry's choice of the 4-floats-per-access kernel is only ever tested on
aligned pointers there. The contract takes any float pointer: both entries run once at
64 x 784 -> 1000 (in and out multiples of 4, where the wide kernel is the fast choice) with x, w,
b and y at element offsets 1, 3, 2 and 1 (4 to 12 bytes past a 16-byte boundary, as a torch view
may start; lab3/tests/unaligned.py), under their own tolerances. A kernel chosen by the widths
alone is refused by can_implement (kErrorMisalignedOperand: `crash`).

Timing, gated below the reference's H100 measurement (the targets at the end of this file): both entries at B = 4096,
784 -> 1000 against torch.addmm + relu, float32 for the SIMT entry and TF32 for the TF32 entry
(each baseline sets torch.backends.cuda.matmul.allow_tf32 for its call and restores it), the TF32
entry against the SIMT one, and in the check `speed_at_4096_cubed` both entries and both torch
settings at 4096 x 4096 -> 4096.
"""

from grader.child.compare import past_tf32_bound
from grader.child.context import RunContext
from grader.tasks import Case, CudaTask, Entry, In, Int, Out, PerfTarget
from grader.tasks.rules import launches, launches_kernel, uses_cuda_cores, uses_tensor_cores
from grader.tasks.seeds import seed_for
from grader.tasks.spec import Rng

ARGS = [In("x"), In("w"), In("b"), Out("y"), Int("B"), Int("in"), Int("out")]
SIMT = "linear_relu_cutlass_simt"
TF32 = "linear_relu_cutlass_tf32"
BATCHES = [1, 7, 64, 4096]
LAYERS = [(784, 1000), (1000, 10), (33, 17), (256, 256)]
TIMING = "4096x784->1000"
SWEEP = [1, 4, 16, 64, 256, 1024, 4096]  # batch sizes of the throughput plot (make bench-lab3)
F32_ATOL = 5e-5  # float32 against the float64 result (module docstring)
TF32_ATOL = 5e-2  # the TF32 bound at K = 1000, the largest K of the cases (module docstring)
# the element-wise TF32 bound on each kind of shape; the second is the "was it TF32" shape
TF32_SHAPES = [(1, 33, 17), (64, 784, 1000), (7, 1000, 10), (64, 256, 256)]
PRECISION_SHAPE = (64, 784, 1000)
BIG = (4096, 4096, 4096)  # B, in, out of the speed note


def case(batch, n_in, n_out):
    # "in" is a Python keyword: the parameters go in as a dict
    return Case(f"{batch}x{n_in}->{n_out}", **{"B": batch, "in": n_in, "out": n_out})


def make_inputs(p, rng):
    batch, n_in, n_out = p["B"], p["in"], p["out"]
    return {
        "x": rng.randn(batch, n_in),
        "w": rng.randn(n_out, n_in) / n_in**0.5,
        "b": rng.randn(n_out),
        "B": batch,
        "in": n_in,
        "out": n_out,
    }


def exact(v):
    """x · wᵀ + b in float64: every product and sum of float32 values is exact to 1e-16 there."""
    return v["x"].double() @ v["w"].double().T + v["b"].double()


def reference(v):
    import torch

    return {"y": torch.relu(exact(v)).to(torch.float32)}


def _addmm_relu(v, o, tf32: bool) -> None:
    import torch

    # the flag is global: set for this call only, so the other baseline keeps its own setting
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        torch.relu_(torch.addmm(v["b"], v["x"], v["w"].T, out=o["y"]))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def torch_f32(v, o):
    _addmm_relu(v, o, tf32=False)


def torch_tf32(v, o):
    _addmm_relu(v, o, tf32=True)


def flops(v):
    return 2.0 * v["B"] * v["in"] * v["out"]  # one multiply and one add per term; the bias is nothing next to it


def _call(ctx: RunContext, symbol: str, v, where: str):
    import torch

    y = torch.full((v["B"], v["out"]), float("nan"), device="cuda")
    ctx.check_rc(symbol, ctx.entry(symbol)({**v, "y": y}), where)
    torch.cuda.synchronize()
    return y


def tf32_within_its_bound(ctx: RunContext) -> None:
    """The TF32 entry: every element within the TF32 bound of the module docstring, and at
    64 x 784 -> 1000 not everywhere as close as float32 is."""
    import torch

    for shape in TF32_SHAPES:
        batch, n_in, n_out = shape
        where = f"{TF32} at {batch}x{n_in}->{n_out}"
        v = make_inputs({"B": batch, "in": n_in, "out": n_out}, Rng(seed_for(ctx.task, f"tf32 {shape}"), "cuda"))
        y = _call(ctx, TF32, v, where)
        pre = exact(v)
        ref = torch.relu(pre)
        err = (y.double() - ref).abs()
        past = past_tf32_bound(y, ref, v["x"], v["w"], pre, v["b"])
        if past:
            ctx.fail(f"{where}: {past}")
        if shape == PRECISION_SHAPE:
            y32 = _call(ctx, SIMT, v, where.replace(TF32, SIMT))
            err32 = (y32.double() - ref).abs()
            if float(err.max()) <= F32_ATOL:
                ctx.fail(
                    f"{where}: every element is within {F32_ATOL:g} of the exact result (largest error "
                    f"{float(err.max()):.2e}), as only float32 can be: the TF32 entry must run on the tensor cores "
                    f"(OpClassTensorOp, x and w rounded to TF32)"
                )
            ctx.note(
                f"largest error at {batch}x{n_in}->{n_out}: TF32 {float(err.max()):.2e} "
                f"(rms {float(err.pow(2).mean().sqrt()):.1e}), SIMT float32 {float(err32.max()):.2e}"
            )


def unaligned_pointers(ctx: RunContext) -> None:
    """Both entries on pointers that are legal but not 16-byte aligned (module docstring)."""
    from lab3.tests.unaligned import call_unaligned

    batch, n_in, n_out = PRECISION_SHAPE
    v = make_inputs({"B": batch, "in": n_in, "out": n_out}, Rng(seed_for(ctx.task, "unaligned"), "cuda"))
    where = f"{batch}x{n_in}->{n_out} with x, w, b and y at element offsets 1, 3, 2 and 1 (unaligned)"
    for symbol, atol in ((SIMT, F32_ATOL), (TF32, TF32_ATOL)):
        call_unaligned(ctx, symbol, v, reference(v), atol, where, (1, 3, 2, 1))


def speed_at_4096_cubed(ctx: RunContext) -> None:
    """Reported, not judged: both entries and torch (float32 and TF32) at 4096 x 4096 -> 4096."""
    import torch

    from grader.child.timing import median_ms

    batch, n_in, n_out = BIG
    v = make_inputs({"B": batch, "in": n_in, "out": n_out}, Rng(seed_for(ctx.task, "speed"), "cuda"))
    o = {"y": torch.empty(batch, n_out, device="cuda")}
    ms = {}
    for symbol in (SIMT, TF32):
        fn = ctx.entry(symbol)
        args = fn.marshal({**v, **o})
        ms[symbol] = median_ms(lambda fn=fn, args=args: fn.call_raw(args))
    ms["torch float32"] = median_ms(lambda: torch_f32(v, o))
    ms["torch TF32"] = median_ms(lambda: torch_tf32(v, o))
    torch.cuda.synchronize()
    gflop = flops(v) / 1e9
    ctx.note(
        f"at {batch}x{n_in}->{n_out}: "
        + ", ".join(f"{k} {t:.3f} ms ({gflop / t:.0f} TFLOP/s)" for k, t in ms.items())
        + f"; CUTLASS SIMT / cuBLAS float32 {ms['torch float32'] / ms[SIMT]:.2f}x, "
        f"CUTLASS TF32 / cuBLAS TF32 {ms['torch TF32'] / ms[TF32]:.2f}x"
    )


TASK = CudaTask(
    lab="lab3",
    number="05",
    title="CUTLASS (a GEMM with a fused bias + ReLU epilogue, SIMT and TF32)",
    sources=["05_cutlass.cu"],
    entries=[
        Entry(SIMT, ARGS, reference=reference, baseline=torch_f32, flops=flops),
        Entry(
            TF32,
            ARGS,
            reference=reference,
            baseline=torch_tf32,
            flops=flops,
            flop_peak="tensor",
            tolerance={"f32": (TF32_ATOL, 0.0)},
            reduced_precision=True,
        ),
    ],
    cases=[case(batch, n_in, n_out) for n_in, n_out in LAYERS for batch in BATCHES],
    make_inputs=make_inputs,
    tolerance={"f32": (F32_ATOL, 0.0)},
    timing_case=TIMING,
    sweep=[case(b, 784, 1000) for b in SWEEP],
    checks=[tf32_within_its_bound, unaligned_pointers, speed_at_4096_cubed],
    include_packages=["nvidia-cutlass"],
    # CUTLASS's own headers call constexpr host functions from host-device code (its examples build
    # with this flag too)
    nvcc_flags=["--expt-relaxed-constexpr"],
    timeout=120,
    rules=[
        # the kernels each entry point reaches (their names carry CUTLASS's template arguments) and
        # their SASS; on a GPU, the kernels one call of each launched. Whether the epilogue applies
        # the ReLU is the values' business (a LinearCombination epilogue is wrong, not a rule break).
        launches_kernel(r"cutlass::gemm::kernel::Gemm\w*<", "the GEMMs are CUTLASS device-level Gemm types"),
        launches(
            1, "the bias and the ReLU are done in the GEMM's epilogue (LinearCombinationRelu), not by another kernel"
        ),
        uses_tensor_cores("the TF32 entry runs on the tensor cores (OpClassTensorOp)", TF32),
        uses_cuda_cores("the float32 entry runs on the CUDA cores (OpClassSimt)", SIMT),
    ],
    # From the reference on an H100 (B = 4096, 784 -> 1000, against torch's cuBLAS in the same run):
    # SIMT 0.70x float32, TF32 0.96x TF32, TF32 4.87x SIMT; the gates sit below, for run-to-run noise.
    perf=[
        PerfTarget(SIMT, "speedup", 0.6, 1, gate=True),
        PerfTarget(TF32, "speedup", 0.8, 1, gate=True),
        PerfTarget(TF32, f"speedup_over:{SIMT}", 2.0, 1, gate=True),
    ],
    mistakes={
        "missing ReLU": "every call of the SIMT entry (first the check unaligned_pointers): the negative half of y",
        "transpose mix-up": "the TF32 bound at 1x33->17 and 64x256->256, where x·w has the right shape",
        "widths not a multiple of 4": "the TF32 check at 1x33->17: the wide kernel refuses lda = 33, ldd = 17",
        "unaligned pointers": "the check unaligned_pointers: x, w, b and y 4 to 12 bytes past a 16-byte boundary",
    },
)


def test_cutlass(grade):
    grade(TASK)
