"""Checks for lab3/04_cudnn.cpp and 04_cudnn.cu: y = relu(x · wᵀ + b) as one cuDNN graph (matmul, bias add, ReLU)
whose wᵀ is described by strides over w's (out, in) memory, built once per shape and cached; the
CNN's convolution + bias + ReLU as a conv_fprop graph; and the student's own direct convolution
kernel for the same layer, timed against it and against torch.

The inputs. Linear: x (B, in) standard normal, w (out, in) standard normal over sqrt(in) (so every
y has a standard deviation near 1.4 with the bias, as in a trained layer), b (out,) standard
normal; the shapes are the MLP's first layer (784 -> 1000) at B = 1 and 64, its second
(1000 -> 10), an odd one (33 -> 17) and a square one (256 -> 256), where w read with the strides of
(in, out) (the wrong one) has the right shape and only its values betray it. Convolution: x
(N, C, H, W) standard normal, w (K, C, R, S) standard normal over sqrt(C·R·S), b (K,) standard
normal; the CNN's conv1 (C = 1 -> K = 16, 28 x 28) and conv2 (16 -> 32, 14 x 14), 5 x 5 with
padding 2, each at N = 1 and 8, and an odd one (N = 3, C = 3, 9 x 7, K = 5, R = 3, S = 5, pad 1)
whose R != S and H != W catch a swapped pair of dimensions. Every case runs every entry point.

Which precision. A cuDNN graph says the data is float32 and the products accumulate in float32;
whether the engine rounds the inputs to TF32 first (tensor cores) is the engine's numerical note,
and the heuristics may pick one that does, as torch lets cuDNN do by default
(torch.backends.cudnn.allow_tf32 is True). So the cuDNN entries are held to the TF32 bound, and the
custom check `plans_compute_in_float32_or_tf32` notes which of the two the chosen plans computed in.
The direct kernel is plain float32 and is held to the float32 bound.

The bounds. A dot product of K products, plus a bias, with inputs rounded to TF32 (10 mantissa
bits: each product off by at most 2^-9 + 2^-20 relatively) and summed in float32 in any order, is
off by at most (2^-9 + (K + 4)·2^-23)·sum_k |x_k||w_k| + 2^-22·(|y| + |b|) (as in task 03). For
these inputs sum_k |x_k||w_k| is about 0.64·sqrt(K): measured on the cases' draws at most 22.2 for
the linear layers (K <= 1000) and 17.1 for the convolutions (K = C·R·S <= 400). With 24 and 18:
  linear_relu_cudnn:       atol = 0.05  (the bound is 0.0498 at K = 1000)
  conv2d_bias_relu_cudnn:  atol = 0.04  (0.0369 at K = 400)
  conv2d_bias_relu_direct: atol = 1e-3  (float32 alone: gamma_(K+1)·(18 + |b| < 5) = 5.5e-4)
no rtol (|y| < 10: the bound does not grow with y, and a sum that cancels has the same error). The
ReLU is exact on whatever it is given. What they reject: zeros, a missing bias (|b| ~ 1, over 0.05
for 96% of the outputs), a missing ReLU (half the outputs are negative, 97% of those below -0.05),
w read with the wrong strides (every output a different dot product, off by about 1.4), a swapped
R and S or a wrong padding (other taps, off by about 1).

Custom checks, run before the cases. `trained_conv1_matches_torch` runs the trained CNN's conv1
(lab3.network.load_cnn) on the test images through both convolution entries and compares every
output with torch's float64 convolution, element by element, within the bound above computed with
the actual |x| and |w| (TF32 for cuDNN, float32 for the direct kernel). `linear_graph_is_cached`
calls linear_relu_cudnn at a shape it has not seen, then 20 times more: the first call builds the
graph (validate, heuristics, plan compilation: milliseconds), the next ones only execute it, so
their median must be under a quarter of the first call (a graph rebuilt on every call is not).

Timing, reported and not gated (the reference measured 1.18x torch for the cuDNN convolution and
1.11x for linear_relu_cudnn on an H100: the speed is cuDNN's kernels', and the one way a submission
makes it slow, a graph rebuilt on every call, is the check above): both convolutions on the CNN's
conv2 at N = 4096 (16 -> 32 channels, 14 x 14, 5 x 5) against torch's relu(conv2d(x, w, b)) (cuDNN,
TF32 allowed as torch's default), the cuDNN one over the direct one, and linear_relu_cudnn at
4096 x 784 -> 1000 against torch's relu(addmm) with TF32 allowed too (the precision of the plan).
"""

from grader.child.context import RunContext
from grader.tasks import Case, CudaTask, Entry, In, Int, Out, PerfTarget
from grader.tasks.rules import calls, library_does_the_product, no_library
from grader.tasks.seeds import seed_for
from grader.tasks.spec import Rng

TF32 = 2.0**-9 + 2.0**-20  # the largest relative error of a product of two TF32-rounded float32 values
LINEAR_ATOL = 0.05
CONV_CUDNN_ATOL = 0.04
CONV_DIRECT_ATOL = 1e-3

LINEAR_ARGS = [In("x"), In("w"), In("b"), Out("y"), Int("B"), Int("in"), Int("out")]
CONV_ARGS = [
    In("image"),
    In("filters"),
    In("fbias"),
    Out("fmap"),
    Int("N"),
    Int("C"),
    Int("H"),
    Int("W"),
    Int("K"),
    Int("R"),
    Int("S"),
    Int("pad"),
]

CONV1 = {"C": 1, "H": 28, "W": 28, "K": 16, "R": 5, "S": 5, "pad": 2}
CONV2 = {"C": 16, "H": 14, "W": 14, "K": 32, "R": 5, "S": 5, "pad": 2}
ODD = {"C": 3, "H": 9, "W": 7, "K": 5, "R": 3, "S": 5, "pad": 1}

# (B, in, out), (N, conv shape, its name), sanitized (cheap)
CASES = [
    ((1, 784, 1000), (1, CONV1, "conv1"), True),
    ((7, 33, 17), (3, ODD, "odd"), True),
    ((64, 784, 1000), (8, CONV1, "conv1"), False),
    ((3, 256, 256), (1, CONV2, "conv2"), False),
    ((64, 1000, 10), (8, CONV2, "conv2"), False),
]
TIMING = ((4096, 784, 1000), (4096, CONV2, "conv2"))


def label(linear, conv) -> str:
    (batch, n_in, n_out), (n, shape, name) = linear, conv
    return f"B={batch} {n_in}->{n_out}, {name} N={n} {shape['C']}->{shape['K']} {shape['H']}x{shape['W']}"


def case(linear, conv, small: bool) -> Case:
    (batch, n_in, n_out), (n, shape, _) = linear, conv
    return Case(label(linear, conv), small=small, **{"B": batch, "in": n_in, "out": n_out, "N": n, **shape})


def out_size(v) -> tuple[int, int]:
    return v["H"] + 2 * v["pad"] - v["R"] + 1, v["W"] + 2 * v["pad"] - v["S"] + 1


def make_inputs(p, rng):
    batch, n_in, n_out = p["B"], p["in"], p["out"]
    n, c, h, w, k, r, s = (p[key] for key in ("N", "C", "H", "W", "K", "R", "S"))
    return {
        "x": rng.randn(batch, n_in),
        "w": rng.randn(n_out, n_in) / n_in**0.5,
        "b": rng.randn(n_out),
        "image": rng.randn(n, c, h, w),
        "filters": rng.randn(k, c, r, s) / (c * r * s) ** 0.5,
        "fbias": rng.randn(k),
        **{key: p[key] for key in ("B", "in", "out", "N", "C", "H", "W", "K", "R", "S", "pad")},
    }


def reference_linear_relu(v):
    import torch

    exact = v["x"].double() @ v["w"].double().T + v["b"].double()  # float64: exact to 1e-16 here
    return {"y": torch.relu(exact).to(torch.float32)}


def conv_exact(image, filters, fbias, pad):
    """relu(conv2d + b) in float64, and sum |x|·|w| per output (what the rounding bound scales with)."""
    import torch
    import torch.nn.functional as F  # noqa: N812 - torch's own spelling

    x, w = image.double(), filters.double()
    y = torch.relu(F.conv2d(x, w, fbias.double(), padding=pad))
    size = F.conv2d(x.abs(), w.abs(), padding=pad)
    return y, size


def reference_conv(v):
    import torch

    y, _ = conv_exact(v["image"], v["filters"], v["fbias"], v["pad"])
    return {"fmap": y.to(torch.float32)}


def torch_linear_relu(v, o):
    import torch

    # at the precision of the plan it is timed against: cuDNN's linear plans on Hopper round to TF32,
    # and torch's float32 default (TF32 off for matmuls) would hand the plan a 2-4x head start
    matmul = torch.backends.cuda.matmul
    before, matmul.allow_tf32 = matmul.allow_tf32, True
    try:
        torch.relu_(torch.addmm(v["b"], v["x"], v["w"].T, out=o["y"]))
    finally:
        matmul.allow_tf32 = before


def torch_conv(v, o):
    import torch
    import torch.nn.functional as F  # noqa: N812

    torch.clamp_min(F.conv2d(v["image"], v["filters"], v["fbias"], padding=v["pad"]), 0.0, out=o["fmap"])


def flops_linear(v):
    return 2.0 * v["B"] * v["in"] * v["out"]


def flops_conv(v):
    p, q = out_size(v)
    return 2.0 * v["N"] * v["K"] * p * q * v["C"] * v["R"] * v["S"]


def _bound(size, ref, bias, k: int, tf32: bool):
    """Per element: the largest error of a correct evaluation (module docstring)."""
    product = TF32 if tf32 else 0.0
    return (product + (k + 4) * 2.0**-23) * size + 2.0**-22 * (ref.abs() + bias.abs())


def trained_conv1_matches_torch(ctx: RunContext) -> None:
    """The trained CNN's conv1 on the test images: both entries within the bound of every element."""
    import torch

    from lab3.network import load_cnn, load_testset

    net, test = load_cnn(), load_testset()
    w = net["conv1.weight"].to("cuda", torch.float32).contiguous()
    b = net["conv1.bias"].to("cuda", torch.float32).contiguous()
    x = test["x"].to("cuda", torch.float32).contiguous()
    n = min(x.shape[0], 2048)  # conv1's output for 2048 images is 100 MB; enough to see every filter
    x = x[:n].contiguous()
    k, c, r, s = w.shape
    pad = r // 2
    ref, size = conv_exact(x, w, b, pad)
    bias = b.double().view(1, -1, 1, 1)
    values = {"image": x, "filters": w, "fbias": b, "N": n, "C": c, "H": x.shape[2], "W": x.shape[3]}
    values |= {"K": k, "R": r, "S": s, "pad": pad}
    for symbol, tf32 in (("conv2d_bias_relu_cudnn", True), ("conv2d_bias_relu_direct", False)):
        where = f"{symbol} on the trained CNN's conv1 ({c}->{k}, {r}x{s}, pad {pad}) over {n} test images"
        y = torch.full(tuple(ref.shape), float("nan"), device="cuda")
        ctx.check_rc(symbol, ctx.entry(symbol)({**values, "fmap": y}), where)
        torch.cuda.synchronize()
        err = (y.double() - ref).abs()
        bound = _bound(size, ref, bias, c * r * s, tf32)
        bad = ~(err <= bound)  # NaN (never written) counts as bad
        if bool(bad.any()):
            i = int(bad.flatten().nonzero()[0])
            at = torch.unravel_index(torch.tensor(i), ref.shape)
            at = tuple(int(t) for t in at)
            ctx.fail(
                f"{where}: {int(bad.sum())} of {bad.numel()} outputs are past the {'TF32' if tf32 else 'float32'} "
                f"bound; the first, y{list(at)} = {float(y[at])!r}, expected {float(ref[at]):.6f} within "
                f"{float(bound[at]):.2e}"
            )
        ctx.note(f"{where}: largest error {float(err.max()):.2e}")


def plans_compute_in_float32_or_tf32(ctx: RunContext) -> None:
    """Reported, not judged (the cases judge): whether the plans cuDNN chose round to TF32."""
    import torch

    rng = Rng(seed_for(ctx.task, "precision"), "cuda")
    v = make_inputs({"B": 64, "in": 784, "out": 1000, "N": 8, **CONV2}, rng)
    for symbol, out, ref, k in (  # k: the length of each dot product
        ("linear_relu_cudnn", "y", lambda: reference_linear_relu(v)["y"], 784),
        ("conv2d_bias_relu_cudnn", "fmap", lambda: reference_conv(v)["fmap"], CONV2["C"] * 25),
    ):
        expected = ref().double()
        got = torch.full(tuple(expected.shape), float("nan"), device="cuda")
        ctx.check_rc(symbol, ctx.entry(symbol)({**v, out: got}), "the precision probe")
        torch.cuda.synchronize()
        err = float((got.double() - expected).abs().max())
        # a float32 sum of these terms stays near 1e-5; inputs rounded to TF32 move y by about 3e-4 rms
        kind = "float32" if err <= 1e-4 else "TF32 (inputs rounded to 10 mantissa bits)"
        ctx.note(f"{symbol}: largest error {err:.2e} at K = {k}: the chosen plan computes in {kind}")


def linear_graph_is_cached(ctx: RunContext) -> None:
    """A call at a shape already built must not build again: its time is a fraction of the first."""
    import statistics
    import time

    import torch

    shape = {"B": 5, "in": 45, "out": 19, "N": 1, **ODD}  # a shape no case uses: its first call builds
    v = make_inputs(shape, Rng(seed_for(ctx.task, "cache"), "cuda"))
    v["y"] = torch.empty(5, 19, device="cuda")
    fn = ctx.entry("linear_relu_cudnn")
    args = fn.marshal(v)
    times = []
    for _ in range(21):
        start = time.perf_counter()
        rc = fn.call_raw(args)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        ctx.check_rc("linear_relu_cudnn", rc, "5x45->19 (the plan-cache check)")
    first, cached = times[0], statistics.median(times[1:])
    ctx.note(f"linear_relu_cudnn at 5x45->19: first call {first * 1e3:.2f} ms, then {cached * 1e6:.0f} µs per call")
    if cached > first / 4:
        ctx.fail(
            f"linear_relu_cudnn at 5x45->19: a call at a shape already built takes {cached * 1e3:.2f} ms, the "
            f"first one {first * 1e3:.2f} ms: the graph is built again on every call; keep it (and its plan) in a "
            f"map keyed by (B, in, out)"
        )


TASK = CudaTask(
    lab="lab3",
    number="04",
    title="cuDNN graphs (linear + ReLU, conv + bias + ReLU) and your own convolution",
    sources=["04_cudnn.cpp", "04_cudnn.cu"],
    entries=[
        Entry(
            "linear_relu_cudnn",
            LINEAR_ARGS,
            reference=reference_linear_relu,
            baseline=torch_linear_relu,
            flops=flops_linear,
            flop_peak="tensor",  # a TF32 plan runs on the tensor cores
            tolerance={"f32": (LINEAR_ATOL, 0.0)},
            reduced_precision=True,  # the H100's chosen plan rounds to TF32 (the probe's note says which)
        ),
        Entry(
            "conv2d_bias_relu_cudnn",
            CONV_ARGS,
            reference=reference_conv,
            baseline=torch_conv,
            flops=flops_conv,
            flop_peak="tensor",
            tolerance={"f32": (CONV_CUDNN_ATOL, 0.0)},
            reduced_precision=True,
        ),
        Entry(
            "conv2d_bias_relu_direct",
            CONV_ARGS,
            reference=reference_conv,
            baseline=torch_conv,
            flops=flops_conv,
            tolerance={"f32": (CONV_DIRECT_ATOL, 0.0)},
        ),
    ],
    cases=[case(lin, conv, small) for lin, conv, small in CASES] + [case(*TIMING, small=False)],
    make_inputs=make_inputs,
    timing_case=label(*TIMING),
    checks=[trained_conv1_matches_torch, plans_compute_in_float32_or_tf32, linear_graph_is_cached],
    prepare="lab3.network:ensure_trained",
    libraries=["cudnn", "nvrtc"],
    include_packages=["nvidia-cudnn-frontend"],
    timeout=240,
    rules=[
        # what the cuDNN entry points' compiled code calls, the libraries the build reads and links,
        # and, on a GPU, the kernels one call of each launched: cuDNN's only, the ReLU and the bias
        # being nodes of its graph rather than a kernel of yours
        calls(
            "cudnnBackendExecute",
            "the cuDNN entry points run a cuDNN graph (Graph::execute)",
            ["linear_relu_cudnn", "conv2d_bias_relu_cudnn"],
        ),
        library_does_the_product(
            "the product, the bias and the ReLU are nodes of one cuDNN graph (Graph::matmul or Graph::conv_fprop, "
            "then PointwiseMode_t::ADD and RELU_FWD), run by cuDNN's kernels alone",
            ["linear_relu_cudnn", "conv2d_bias_relu_cudnn"],
            only=True,
        ),
        no_library(r"cublas\w*", "the product is cuDNN's here (cuBLAS was task 03)"),
    ],
    # Not gates: cuDNN's kernels set the speed; a graph built per call is the check's, not timing's.
    perf=[
        PerfTarget("conv2d_bias_relu_cudnn", "speedup", 1.0, 1, gate=False),
        PerfTarget("conv2d_bias_relu_cudnn", "speedup_over:conv2d_bias_relu_direct", 1.0, 1, gate=False),
        PerfTarget("linear_relu_cudnn", "speedup", 1.0, 1, gate=False),
    ],
    mistakes={
        "missing ReLU": "linear_relu_cudnn's first case, 1x784->1000: the negative half of y, off by more than 0.05",
        "wrong strides": "linear_relu_cudnn at 1x784->1000 and the square 3x256->256: wᵀ read as (in, out)",
        "graph rebuilt every call": (
            "the check linear_graph_is_cached: a call at a built shape must take under a quarter of the first"
        ),
        "filter taps transposed": (
            "the trained conv1 check (5x5 filters that are not symmetric) and the odd case's R = 3, S = 5"
        ),
    },
)


def test_cudnn(grade):
    grade(TASK)
