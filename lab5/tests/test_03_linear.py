"""Checks for lab5/kiln_llm/kernels/linear.cu: kiln_linear_f32/_f16/_bf16, out (m, n) = x (m, k) @ w (n, k).T
with float32 sums and one rounding, after an epilogue: 0 none, 1 + a residual (m, n), 2 silu(x @ w.T) *
(x @ w3.T) with a second weight w3 (n, k). m <= 8 is decode (the GEMV), m > 8 prefill (the GEMM).

The inputs. Every case runs all three entry points, each on its own dtype's inputs rounded from one
float32 draw: x standard normal, w and w3 standard normal divided by sqrt(k) (an nn.Linear-like
scale), the residual standard normal. So x @ w.T is about N(0, 1) whatever k is: one absolute
tolerance fits k = 8 and k = 4096 alike (it scales the error with sqrt(k) through the inputs instead
of through the tolerance, which a task declares per dtype, not per case).

The cases, written m x n x k and the epilogue. Decode: m = 1, 2, 5, 7 and 8 (1 to 8 rows of sums
per lane; 5 and 7 leave rows of x unused in a compiled size of 8); n from 1 to 4096, mostly not a
multiple of the 4 warps of a block or of anything else (9, 33, 77, 1003); k = 8 (one packet of 8
halves per row, 31 idle lanes), 40, 264 and 1000 (a tail after the unrolled steps of 4 x 256), 4096
(no tail). Prefill: m = 9 (the smallest GEMM), 64, 129 (one row past a 128-row tile), 512, with n =
33, 200, 257, 1000 (partial 128- and 64-column tiles) and k = 8, 40 (a partial 32-wide step), 520,
1000, 4096. Each epilogue appears on both paths. Timed: 1x32000x4096 (LLaMA's output projection
at decode), 1x11008x4096 (its w1 and w3) and 512x4096x4096 (a 512-token prefill through wq).

The reference is torch in float64 on the dtype's own (rounded) inputs, rounded once to the dtype.

The tolerances. A right kernel's float32 sums differ from the float64 ones by about 2^-24 sqrt(k)
times the partial sums' size: under 1e-5 here (the tensor cores' truncating adds, lab2's task 15,
stay under 3e-5 at k = 4096 for this scale). Rounded to a 16-bit type, two such values may still
fall on the two sides of a rounding boundary: one unit in the last place, at most 2^-10 relative for
float16 (< 1e-3) and 2^-7 for bfloat16 (< 8e-3). So f16 is judged with atol = rtol = 1e-3, bf16 with
8e-3, f32 with atol 1e-4 and rtol 1e-5 (10x the accumulation error). Rejected: a lost packet of k (8
products of size 1/sqrt(k): 0.09 rms at k = 1000), a skipped residual (N(0, 1) off), swiglu with
w read twice, sums kept in half precision (about 3e-3 at k = 4096), TF32 in the f32 path (5e-4 rms),
an f16 copy of the f32 answer (5e-4 at |out| ~ 1), and any element never written (the grader's poison).

kiln_rmsnorm_linear (the GEMV with RMSNorm in front, decode only) is judged by `rmsnorm_prologue`:
every dtype at m = 1, 2, 5, 7 and 8, the three epilogues, k = 8 to 4096 (and f32 at k = 33, the
scalar path), x at three scales (1, 30 and 1e-2: the norm, not the raw x, sets the size of the
output), g normal around 1. eps is LLaMA's 1e-5, but 1e-3 for x of scale 1e-2, whose mean square
(1e-4) it then outweighs: a kernel that adds an eps of its own, or adds it outside the square root,
is off by a factor of two or more there. The reference normalizes in float64 from the dtype's values and runs
`expected` on that, so the kernel's float32 sums and single rounding meet the same tolerances as
kiln_linear. m = 9 must be refused (cudaErrorInvalidValue, out untouched): the GEMM has no prologue.

kiln_rmsnorm_linear_qkv (the three projections of a decode step as one GEMV over wq, wk and wv) is
judged by `stacked_qkv` with the same reference and tolerances, each output against its own weight:
GQA-like stacks (nk = nv < nq), sizes that put the seams between two weights inside a block of 4
warps and, from m = 4 on, inside a warp's two rows (9 | 5 | 7, 40 | 23 | 23), k = 8 to 4096, and f32
at k = 33. The three weights are views into one buffer, in the order v, q, k with NaN rows between
them: a kernel that reads wk and wv as the rows after wq (or mixes up which comes first) meets NaN.
m = 9 is refused as for kiln_rmsnorm_linear.

Beyond the cases: `odd_k_in_f32` runs the f32 entry at k = 1, 3, 33 and 4099 (rows that are not
16-byte aligned, the scalar path) for each epilogue on both paths; `k_not_multiple_of_8_refused`
expects cudaErrorInvalidValue from the 16-bit entries at k = 12; `replays_in_a_cuda_graph` captures
a decode and a prefill call and replays them on new data in the same buffers.

Performance. The GEMV reads n x k weights once: bytes_moved counts them (and x, the output and the
residual, which are noise beside them), so its share of the copy bandwidth is the share of DRAM's
speed that the weight stream reaches. The copy it is compared with moves the same bytes, half read
and half written (grader/child/timing.py, copy_bandwidth_like), and the copy's writes may still sit
in L2 (50 MB on an H100) when its end event fires, while the GEMV writes almost nothing: the
smaller the case, the faster the copy looks. At 1x11008x4096 (90 MB) up to half of the copy's
traffic can hide in L2; at 1x32000x4096 (262 MB) at most a fifth, as for lab 2's reduction
(256 MB, also judged at 85%). So the gate, 85% of the copy, is judged at 1x32000x4096 in float16;
1x11008x4096 has a target of 75% that is not a gate. The prefill target (a quarter of cuBLAS at
512x4096x4096, not a gate) is to be set from a measurement.
"""

from grader.child.context import CUDA_ERROR_INVALID_VALUE as INVALID_VALUE
from grader.child.context import RunContext
from grader.tasks import NO_LIBRARIES, Case, CudaTask, Entry, In, Int, Out, PerfTarget
from grader.tasks.rules import uses_tensor_cores
from grader.tasks.spec import Float, Rng, Scalar, torch_dtype

STREAM = Scalar("stream", "u64")
DTYPES = ("f32", "f16", "bf16")
SIZES = ("m", "n", "k")
TOLERANCE = {"f32": (1e-4, 1e-5), "f16": (1e-3, 1e-3), "bf16": (8e-3, 8e-3)}
ELEM_BYTES = {"f32": 4, "f16": 2, "bf16": 2}
TIMING = "1x32000x4096 none (timed)"
FFN_TIMING = "1x11008x4096 none (timed)"
PREFILL_TIMING = "512x4096x4096 none (timed)"
EPILOGUES = {0: "none", 1: "add", 2: "swiglu"}

# (m, n, k, epilogue)
DECODE = [
    (1, 1, 8, 0),
    (1, 9, 8, 0),
    (1, 33, 264, 0),
    (2, 100, 1000, 0),
    (5, 1003, 1000, 0),
    (7, 65, 264, 0),
    (8, 64, 40, 0),
    (1, 4096, 4096, 0),
    (1, 257, 4096, 1),
    (2, 31, 1000, 1),
    (5, 77, 264, 1),
    (8, 9, 8, 1),
    (1, 255, 4096, 2),
    (2, 130, 520, 2),
    (5, 33, 1000, 2),
    (8, 100, 40, 2),
]
PREFILL = [
    (9, 130, 8, 0),
    (64, 200, 520, 0),
    (129, 33, 40, 0),
    (129, 257, 1000, 0),
    (512, 1000, 4096, 0),
    (64, 257, 1000, 1),
    (129, 200, 40, 1),
    (9, 33, 264, 2),
    (129, 257, 1000, 2),
    (512, 200, 4096, 2),
]


def label(m: int, n: int, k: int, epilogue: int) -> str:
    return f"{m}x{n}x{k} {EPILOGUES[epilogue]}"


def case(m: int, n: int, k: int, epilogue: int, name: str = "", huge: bool = False) -> Case:
    return Case(
        name or label(m, n, k, epilogue),
        small=m * n * k <= 1 << 22,
        huge=huge,
        m=m,
        n=n,
        k=k,
        epilogue=epilogue,
    )


def args(dt: str) -> list:
    return [
        Int("epilogue"),
        Out(f"out_{dt}", dt),
        In(f"x_{dt}", dt),
        In(f"w_{dt}", dt),
        In(f"extra_{dt}", dt),
        *(Scalar(s, "i64") for s in SIZES),
        STREAM,
    ]


def draw(rng: Rng, m: int, n: int, k: int, epilogue: int) -> dict:
    """One float32 draw: x (m, k), w (n, k) and extra (the residual (m, n), w3 (n, k), or one
    unused element), the weights at nn.Linear's scale so that x @ w.T is about N(0, 1)."""
    x = rng.randn(m, k)
    w = rng.randn(n, k) / k**0.5
    extra = {0: lambda: rng.randn(1), 1: lambda: rng.randn(m, n), 2: lambda: rng.randn(n, k) / k**0.5}[epilogue]()
    return {"x": x, "w": w, "extra": extra}


def make_inputs(p, rng):
    m, n, k, epilogue = p["m"], p["n"], p["k"], p["epilogue"]
    base = draw(rng, m, n, k, epilogue)
    values = {"epilogue": epilogue, "m": m, "n": n, "k": k, "stream": rng.stream()}
    for dt in DTYPES:
        for name, t in base.items():
            values[f"{name}_{dt}"] = t.to(torch_dtype(dt))
    return values


def expected(x, w, extra, epilogue: int):
    """out in float64 from the dtype's own values, rounded once to their dtype."""
    import torch

    rows = max(1, (1 << 24) // w.shape[1])  # w in float64 a slice at a time: the huge case's is 17 GB whole
    y = torch.cat([x.double() @ w[i : i + rows].double().T for i in range(0, w.shape[0], rows)], dim=1)
    if epilogue == 1:
        y = y + extra.double()
    elif epilogue == 2:
        y = torch.nn.functional.silu(y) * (x.double() @ extra.double().T)
    return y.to(x.dtype)


def reference(dt: str):
    def ref(v):
        return {f"out_{dt}": expected(v[f"x_{dt}"], v[f"w_{dt}"], v[f"extra_{dt}"], v["epilogue"])}

    return ref


# The baseline's own output, kept from call to call so that no timed call pays for an allocation.
_OUT: dict = {}


def torch_linear(dt: str):
    """cuBLAS through torch, epilogue 0 only (the timed cases): a GEMV at m = 1, a GEMM beyond."""

    def run(v, o):
        import torch

        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.matmul(v[f"x_{dt}"], v[f"w_{dt}"].T, out=o[f"out_{dt}"])  # w.T is a view: cuBLAS reads w as stored

    return run


def bytes_moved(dt: str):
    def moved(v):
        m, n, k, epilogue = v["m"], v["n"], v["k"], v["epilogue"]
        weights = n * k * (2 if epilogue == 2 else 1)  # read once each, whatever m is
        other = m * k + m * n * (2 if epilogue == 1 else 1)  # x, the output (and the residual)
        return (weights + other) * ELEM_BYTES[dt]

    return moved


def flops(v):
    return 2.0 * v["m"] * v["n"] * v["k"] * (2 if v["epilogue"] == 2 else 1)


def entries() -> list[Entry]:
    return [
        Entry(
            f"kiln_linear_{dt}",
            args(dt),
            reference=reference(dt),
            baseline=torch_linear(dt),
            bytes_moved=bytes_moved(dt),
            flops=flops,
            flop_peak="fp32" if dt == "f32" else "tensor",
        )
        for dt in DTYPES
    ]


def call(ctx: RunContext, dt: str, epilogue: int, x, w, extra, out) -> int:
    import torch

    m, k = x.shape
    n = w.shape[0]
    values = {
        "epilogue": epilogue,
        f"out_{dt}": out,
        f"x_{dt}": x,
        f"w_{dt}": w,
        f"extra_{dt}": extra,
        "m": m,
        "n": n,
        "k": k,
        "stream": torch.cuda.current_stream().cuda_stream,
    }
    return ctx.entry(f"kiln_linear_{dt}")(values)


# (m, n, k, epilogue, scale of x) for kiln_rmsnorm_linear
PROLOGUE = [
    (1, 9, 8, 0, 1.0),
    (1, 257, 4096, 0, 30.0),
    (2, 100, 1000, 0, 1.0),
    (5, 77, 264, 1, 1e-2),
    (7, 65, 40, 2, 1.0),
    (8, 33, 1000, 0, 30.0),
    (1, 255, 4096, 2, 1.0),
    (8, 100, 264, 2, 1e-2),
]


def small_eps(scale: float) -> float:
    """The prologue's eps for x of `scale`: LLaMA's 1e-5, but 1e-3 for small x (mean square 1e-4), where
    eps then decides the result (its value, and that it sits inside the square root)."""
    return 1e-3 if scale < 1 else 1e-5


def prologue_args(dt: str) -> list:
    """kiln_rmsnorm_linear's: kiln_linear's with the norm's weight and eps after x."""
    epilogue, out, x, *rest = args(dt)
    return [epilogue, out, x, In(f"g_{dt}", dt), Float("eps"), *rest]


def normalized(x, g, eps: float):
    """rmsnorm(x, g) in float64, unrounded: what the prologue feeds the GEMV."""
    xd = x.double()
    return xd * (xd.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * g.double()


def call_prologue(ctx: RunContext, dt: str, epilogue: int, x, g, eps: float, w, extra, out) -> int:
    import torch

    m, k = x.shape
    values = {"epilogue": epilogue, f"out_{dt}": out, f"x_{dt}": x, f"g_{dt}": g, "eps": eps, f"w_{dt}": w}
    values |= {f"extra_{dt}": extra, "m": m, "n": w.shape[0], "k": k, "stream": torch.cuda.current_stream().cuda_stream}
    return ctx.entry(f"kiln_rmsnorm_linear_{dt}", prologue_args(dt))(values)


def rmsnorm_prologue(ctx: RunContext) -> None:
    """kiln_rmsnorm_linear_<dt> = kiln_linear of rmsnorm(x, g), for m <= 8; m = 9 refused."""
    import torch

    from grader.child.compare import judge
    from grader.tasks.seeds import seed_for

    rng = Rng(seed_for(ctx.task, "rmsnorm prologue"), "cuda")
    cases = [(dt, *c) for dt in DTYPES for c in PROLOGUE] + [("f32", 5, 37, 33, 2, 1.0)]
    for dt, m, n, k, epilogue, scale in cases:
        eps = small_eps(scale)
        t = torch_dtype(dt)
        v = {key: value.to(t) for key, value in draw(rng, m, n, k, epilogue).items()}
        x = (v["x"].float() * scale).to(t)
        g = (1.0 + 0.1 * rng.randn(k)).to(t)
        out = torch.full((m, n), float("nan"), dtype=t, device="cuda")
        symbol = f"kiln_rmsnorm_linear_{dt}"
        where = f"{symbol} at {label(m, n, k, epilogue)}, x of scale {scale:g}, eps {eps:g}"
        ctx.check_rc(symbol, call_prologue(ctx, dt, epilogue, x, g, eps, v["w"], v["extra"], out), where)
        torch.cuda.synchronize()
        want = expected(normalized(x, g, eps), v["w"], v["extra"], epilogue).to(t)
        atol, rtol = TOLERANCE[dt]
        report = judge("out", out, want, atol, rtol, None)
        if report:
            ctx.fail(f"{where}: {report}")
    # m = 9 is the GEMM's, which has no prologue: refused before anything runs
    for dt in DTYPES:
        t = torch_dtype(dt)
        x, g = torch.ones(9, 16, dtype=t, device="cuda"), torch.ones(16, dtype=t, device="cuda")
        w, out = torch.ones(8, 16, dtype=t, device="cuda"), torch.full((9, 8), 7.0, dtype=t, device="cuda")
        rc = call_prologue(ctx, dt, 0, x, g, 1e-5, w, g, out)
        torch.cuda.synchronize()
        if rc != INVALID_VALUE or not bool((out == 7.0).all()):
            ctx.fail(
                f"kiln_rmsnorm_linear_{dt} with m = 9 returned {rc} (wrote: {not bool((out == 7.0).all())}): the"
                f" prologue is the GEMV's (m <= 8), so m = 9 must be cudaErrorInvalidValue ({INVALID_VALUE}) and"
                " leave out as it was"
            )


# (m, nq, nk, nv, k, scale of x) for kiln_rmsnorm_linear_qkv
STACKS = [
    (1, 64, 16, 16, 264, 1.0),
    (1, 9, 5, 7, 8, 30.0),
    (2, 100, 100, 100, 1000, 1.0),
    (5, 40, 23, 23, 40, 1e-2),
    (8, 33, 17, 17, 264, 1.0),
    (1, 512, 128, 128, 4096, 1.0),
]


def qkv_args(dt: str) -> list:
    """kiln_rmsnorm_linear_qkv's: out, x, the norm's weight and eps, wq, wk, wv, m, nq, nk, nv, k."""
    sizes = (Scalar(s, "i64") for s in ("m", "nq", "nk", "nv", "k"))
    weights = (In(f"{w}_{dt}", dt) for w in ("wq", "wk", "wv"))
    return [Out(f"out_{dt}", dt), In(f"x_{dt}", dt), In(f"g_{dt}", dt), Float("eps"), *weights, *sizes, STREAM]


def call_qkv(ctx: RunContext, dt: str, x, g, eps: float, wq, wk, wv, out) -> int:
    import torch

    m, k = x.shape
    values = {f"out_{dt}": out, f"x_{dt}": x, f"g_{dt}": g, "eps": eps, f"wq_{dt}": wq, f"wk_{dt}": wk}
    values |= {f"wv_{dt}": wv, "m": m, "nq": wq.shape[0], "nk": wk.shape[0], "nv": wv.shape[0], "k": k}
    return ctx.entry(f"kiln_rmsnorm_linear_qkv_{dt}", qkv_args(dt))(
        values | {"stream": torch.cuda.current_stream().cuda_stream}
    )


def apart(weights: list, gap: int = 3) -> list:
    """The weights copied into one buffer in the order 3rd, 1st, 2nd, with `gap` rows of NaN before
    each: views whose rows are not where a kernel that took them for one matrix would look."""
    import torch

    k = weights[0].shape[1]
    order = [2, 0, 1]
    rows = sum(w.shape[0] + gap for w in weights) + gap
    buf = torch.full((rows, k), float("nan"), dtype=weights[0].dtype, device=weights[0].device)
    views: list = [None] * 3
    at = gap
    for i in order:
        n = weights[i].shape[0]
        views[i] = buf[at : at + n]
        views[i].copy_(weights[i])
        at += n + gap
    return views


def stacked_qkv(ctx: RunContext) -> None:
    """kiln_rmsnorm_linear_qkv_<dt> = [rmsnorm_linear(x, g, wq) | ...(wk) | ...(wv)], m <= 8."""
    import torch

    from grader.child.compare import judge
    from grader.tasks.seeds import seed_for

    rng = Rng(seed_for(ctx.task, "stacked qkv"), "cuda")
    cases = [(dt, *c) for dt in DTYPES for c in STACKS] + [("f32", 1, 12, 6, 6, 33, 1.0)]
    for dt, m, nq, nk, nv, k, scale in cases:
        eps = small_eps(scale)
        t = torch_dtype(dt)
        x = (rng.randn(m, k) * scale).to(t)
        g = (1.0 + 0.1 * rng.randn(k)).to(t)
        weights = [(rng.randn(n, k) / k**0.5).to(t) for n in (nq, nk, nv)]
        wq, wk, wv = apart(weights)
        out = torch.full((m, nq + nk + nv), float("nan"), dtype=t, device="cuda")
        symbol = f"kiln_rmsnorm_linear_qkv_{dt}"
        where = f"{symbol} at m = {m}, nq | nk | nv = {nq} | {nk} | {nv}, k = {k}, x of scale {scale:g}"
        where += f", eps {eps:g}"
        ctx.check_rc(symbol, call_qkv(ctx, dt, x, g, eps, wq, wk, wv, out), where)
        torch.cuda.synchronize()
        h = normalized(x, g, eps)
        at = 0
        for name, w in zip(("q", "k", "v"), weights, strict=True):
            n = w.shape[0]
            want = expected(h, w, None, 0).to(t)
            atol, rtol = TOLERANCE[dt]
            report = judge(f"out's {name} columns [{at}, {at + n})", out[:, at : at + n], want, atol, rtol, None)
            if report:
                ctx.fail(f"{where}: {report}")
            at += n
    for dt in DTYPES:
        t = torch_dtype(dt)
        x, g = torch.ones(9, 16, dtype=t, device="cuda"), torch.ones(16, dtype=t, device="cuda")
        w, out = torch.ones(8, 16, dtype=t, device="cuda"), torch.full((9, 24), 7.0, dtype=t, device="cuda")
        rc = call_qkv(ctx, dt, x, g, 1e-5, w, w, w, out)
        torch.cuda.synchronize()
        if rc != INVALID_VALUE or not bool((out == 7.0).all()):
            ctx.fail(
                f"kiln_rmsnorm_linear_qkv_{dt} with m = 9 returned {rc}: the stacked GEMV is decode's (m <= 8), so"
                f" m = 9 must be cudaErrorInvalidValue ({INVALID_VALUE}) and leave out as it was"
            )


def odd_k_in_f32(ctx: RunContext) -> None:
    """float32 at k = 1, 3, 33 and 4099: rows of x and w that do not start on 16-byte boundaries
    (the scalar path of the GEMV and the GEMM), every epilogue, m = 1, 5 (decode) and 17 (prefill)."""
    import torch

    from grader.child.compare import judge
    from grader.tasks.seeds import seed_for

    rng = Rng(seed_for(ctx.task, "odd k"), "cuda")
    atol, rtol = TOLERANCE["f32"]
    for k in (1, 3, 33, 4099):
        for m in (1, 5, 17):
            for epilogue in (0, 1, 2):
                n = 37
                v = draw(rng, m, n, k, epilogue)
                out = torch.full((m, n), float("nan"), device="cuda")
                where = f"kiln_linear_f32 at {label(m, n, k, epilogue)} (k % 4 != 0: rows not 16-byte aligned)"
                ctx.check_rc("kiln_linear_f32", call(ctx, "f32", epilogue, v["x"], v["w"], v["extra"], out), where)
                torch.cuda.synchronize()
                report = judge("out", out, expected(v["x"], v["w"], v["extra"], epilogue), atol, rtol, None)
                if report:
                    ctx.fail(f"{where}: {report}")


def k_not_multiple_of_8_refused(ctx: RunContext) -> None:
    """The 16-bit entries need k % 8 == 0 (16-byte packets): k = 12 must be cudaErrorInvalidValue,
    returned before anything runs (out keeps its contents)."""
    import torch

    for dt in ("f16", "bf16"):
        for m in (1, 17):
            t = torch_dtype(dt)
            x = torch.ones(m, 12, dtype=t, device="cuda")
            w = torch.ones(16, 12, dtype=t, device="cuda")
            out = torch.full((m, 16), 7.0, dtype=t, device="cuda")
            unused = torch.zeros(1, dtype=t, device="cuda")  # epilogue 0 reads no extra
            rc = call(ctx, dt, 0, x, w, unused, out)
            torch.cuda.synchronize()
            if rc != INVALID_VALUE:
                ctx.fail(
                    f"kiln_linear_{dt} with m = {m}, k = 12 returned {rc}, not cudaErrorInvalidValue ({INVALID_VALUE}):"
                    f" the 16-bit kernels read rows in 16-byte packets, so k % 8 != 0 must be refused"
                )
            if not bool((out == 7.0).all()):
                ctx.fail(f"kiln_linear_{dt} with k = 12 wrote into out although it refused the call")


def replays_in_a_cuda_graph(ctx: RunContext) -> None:
    """A decode call (1x300x1000, swiglu) and a prefill call (129x200x520, add) in float16 captured
    into one CUDA graph on torch's capture stream, replayed twice on new data in the same buffers."""
    import torch

    from grader.child.compare import judge

    atol, rtol = TOLERANCE["f16"]
    shapes = [(1, 300, 1000, 2), (129, 200, 520, 1)]
    bufs = []
    for m, n, k, epilogue in shapes:
        x = torch.empty(m, k, dtype=torch.float16, device="cuda")
        w = torch.empty(n, k, dtype=torch.float16, device="cuda")
        extra = torch.empty(*((n, k) if epilogue == 2 else (m, n)), dtype=torch.float16, device="cuda")
        out = torch.empty(m, n, dtype=torch.float16, device="cuda")
        bufs.append((epilogue, x, w, extra, out))

    def refill() -> None:
        for epilogue, x, w, extra, out in bufs:
            k = x.shape[1]
            x.copy_(torch.randn_like(x, dtype=torch.float32))
            w.copy_(torch.randn_like(w, dtype=torch.float32) / k**0.5)
            extra.copy_(torch.randn_like(extra, dtype=torch.float32) / (k**0.5 if epilogue == 2 else 1.0))
            out.fill_(float("nan"))

    refill()
    calls = []
    for epilogue, x, w, extra, out in bufs:
        m, k = x.shape
        values = {"epilogue": epilogue, "out_f16": out, "x_f16": x, "w_f16": w, "extra_f16": extra}
        calls.append(("kiln_linear_f16", {**values, "m": m, "n": w.shape[0], "k": k}))
    graph = ctx.captured(calls)
    for replay in range(2):
        refill()
        graph.replay()
        torch.cuda.synchronize()
        for (m, n, k, epilogue), (_, x, w, extra, out) in zip(shapes, bufs, strict=True):
            report = judge("out", out, expected(x, w, extra, epilogue), atol, rtol, None)
            if report:
                where = f"kiln_linear_f16 {label(m, n, k, epilogue)}, replay {replay + 1} of a captured CUDA graph"
                ctx.fail(f"{where}: {report}")
    del graph


TASK = CudaTask(
    lab="lab5",
    number="03",
    title="linear: decode GEMV and prefill GEMM",
    sources=["kiln_llm/kernels/linear.cu"],
    entries=entries(),
    cases=[case(*c) for c in DECODE + PREFILL]
    + [case(1, 32000, 4096, 0, TIMING), case(1, 11008, 4096, 0, FFN_TIMING), case(512, 4096, 4096, 0, PREFILL_TIMING)]
    # `make grade`: a weight matrix past 2^31 elements (4 GiB in f16), read by the decode GEMV
    + [case(1, (1 << 31) // 4096 + 3, 4096, 0, huge=True)],
    make_inputs=make_inputs,
    tolerance=TOLERANCE,
    timing_case=TIMING,
    checks=[k_not_multiple_of_8_refused, odd_k_in_f32, rmsnorm_prologue, stacked_qkv, replays_in_a_cuda_graph],
    timeout=240,
    mistakes={
        "k tail": "k = 1000, 264, 40 and 8 after whole unrolled steps (GEMV), k = 40 and 520 after whole 32-wide"
        " steps (GEMM)",
        "epilogue": "every epilogue on both paths: a skipped residual is N(0, 1) off, swiglu's w3 read as w",
        "last rows": "n = 9, 33, 77, 1003: not a multiple of the rows a block computes",
        "stacked weights": "stacked_qkv: wq, wk and wv apart in memory, NaN rows between them",
        "warp reduction": "rmsnorm_prologue: every lane's share of the sum of squares differs",
        "attribute at its LLaMA value": "rmsnorm_prologue and stacked_qkv: eps 1e-3 for x of scale 1e-2",
        "tensor cores compiled, not used": (
            "the observed call on 512x4096x4096 must launch a kernel whose SASS has HMMA: a tensor-core kernel"
            " that is compiled but never launched does not count"
        ),
    },
    rules=[
        NO_LIBRARIES,
        # judged on what ran: the prefill case's call must launch a kernel whose SASS has HMMA, so a
        # tensor-core kernel compiled beside a GEMM that never takes its path does not count
        uses_tensor_cores(
            "prefill multiplies on the tensor cores (f16 and bf16)",
            ("kiln_linear_f16", "kiln_linear_bf16"),
            case=PREFILL_TIMING,
        ),
    ],
    perf=[
        PerfTarget("kiln_linear_f16", "share_of_copy", 0.85, 2, gate=True),
        PerfTarget("kiln_linear_f16", "share_of_copy", 0.75, 1, gate=False, case=FFN_TIMING),
        # the reference reached 0.215x and 0.216x cuBLAS in two H100 runs: a WMMA kernel, not wgmma and TMA
        PerfTarget("kiln_linear_f16", "speedup", 0.2, 1, gate=False, case=PREFILL_TIMING),
    ],
)


def test_linear(grade):
    grade(TASK)
