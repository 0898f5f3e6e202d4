"""Checks for lab3/06_extension.cu and lab3/06_extension.py: the student's tiled linear kernel as
the torch operator lab3ext::linear(x, w, b) = x·wᵀ + b (torch.nn.Linear's layout), built with
torch.utils.cpp_extension (ninja), with a fake for torch.compile and a backward registered from
Python through torch.library.

What is checked, through torch as a user meets the op:
- values, float32, on B in {1, 7, 64} and (in, out) in {(784, 1000), (1000, 10), (33, 17)}: fc1's
  and fc2's shapes and one whose edges are no multiple of any tile; two random draws each; and at
  7 x 33 -> 17 and 64 x 784 -> 1000 with non-contiguous inputs (x a transposed view, w and b every
  other element of a larger tensor), which the op must accept as torch's own ops do (the course's
  binding, 06_extension_op.cpp, makes them contiguous: a pointer read as if they were gives other
  values);
- torch.autograd.gradcheck in float64 (the kernel is templated; finite differences need float64)
  on B = 7, 33 -> 17: its fast mode (one random projection of the Jacobians), and only where that
  fails the full check (809 perturbed inputs, each two forward calls), whose verdict stands;
- torch.library.opcheck on the same case (schema, fake against the real op, the autograd
  registration, and tracing with symbolic sizes, with inputs requiring grad);
- torch.compile(backend="aot_eager", fullgraph=True) against eager, outputs and gradients;
- `runs_on_the_callers_stream` (custom): the op called on a side stream (a non-blocking stream of
  torch's pool) right after a long sleep kernel and a copy of new values into x, both queued on that
  stream: its kernel must run after them, so y must be the product of the new x. A kernel launched on
  the legacy default stream, or on a stream of its own, starts at once (a non-blocking stream does
  not wait for stream 0, nor stream 0 for it) and multiplies the old x;
- `captures_into_a_cuda_graph` (custom): the op captured by torch.cuda.graph on strided x, w and b
  (the binding's copies to contiguous tensors are captured too), then the graph replayed after new
  values are copied into the same views: y must be the new product. A call that
  synchronizes or allocates inside the capture is refused by CUDA, a kernel outside the capture
  stream runs once, eagerly, and a replay leaves y as it was;
- `backward_calls_the_op` (custom): the contract asks for the backward's two products through
  torch.ops.lab3ext.linear; the torch profiler records the operators one backward of y = op(x, w, b)
  calls (all three inputs requiring grad), and lab3ext::linear must be among them twice. A product
  computed another way (a broadcast multiply and a sum, which no rule on the source's spelling sees)
  shows as fewer calls;
- `training_matches_torch` (custom): the MLP of lab3/train.py with both layers calling
  torch.ops.lab3ext.linear, trained as lab3/train.py trains it (same seed, init, Adam, lr, batch and
  batch order, on the data the lab's networks were trained on: MNIST when cached, else the offline
  digits), must give the same per-step losses as the same MLP made of nn.Linear.

Inputs: x ~ N(0, 1), w ~ N(0, 1/in), b ~ N(0, 1), as in task 02 (every output of order 1, a
missing bias off by |b|).

Tolerances.
- Values (float32, atol 5e-4, rtol 0): task 02's tolerance for the same kernel on the same inputs
  (x ~ N(0, 1), w ~ N(0, 1/in), b ~ N(0, 1)). A float32 dot product of K terms plus the bias can be
  off by gamma_(K+1)·(sum|x_k·w_k| + |b|) at worst, gamma_m = m·u/(1 - m·u), u = 2^-24: 1.7e-3 at
  K = 1000; rounding errors behave as independent terms, so a real sum is off by about
  sqrt(K)·u·29 = 5.5e-5, and 5e-4 is nine times that. A kernel that rounds its inputs to TF32 or
  fp16 (10 bits of mantissa) is off by about 3e-4 rms at K = 784 (largest 1.4e-3 over 64,000
  outputs, on the CPU), so some 9% of its outputs fail 5e-4, where the worst-case bound of 2e-3
  would let every one of them pass; zeros, a
  transposed weight (off by about 1), a missing bias (off by |b|) or a skipped k tail (about 0.1)
  fail by far. rtol 0: the error does not scale with |y|.
- gradcheck: its defaults (atol 1e-5, rtol 1e-3) in float64, where the kernel's rounding (1e-16
  relative) is far below finite differences' own error (eps = 1e-6: about 1e-10); a gradient that
  is missing, scaled or summed over the wrong axis is off by order 1. (A gradient of the wrong
  shape, say grad_w as xᵀ·grad_y, is refused by autograd itself, in opcheck's run with inputs
  requiring grad.)
- compile vs eager: the float32 tolerance above (both run the same kernel; aot_eager reorders
  nothing inside it).
- Training: |loss_ext - loss_torch| <= TRAIN_ATOL + TRAIN_RTOL·loss_torch at every step, float32,
  TF32 off for torch's side. Measured on the CPU with a pure-torch stand-in for the op that sums
  each dot product in 16-wide float32 chunks one after another (a tiled kernel's order), against
  nn.Linear (MKL's order), over the 100 steps on the offline digits: at most 2.4e-7
  (at step 2; 1.2e-7 for a stand-in that rounds a float64 product once), with the loss going from
  2.33 to 0.03. The tolerance, 2e-5 + 1e-5·loss (4.3e-5 at the first steps), leaves about 100x
  room for the GPU's orders (cuBLAS against the tiled kernel), which are not measured here. With
  the same stand-in, broken backwards that gradcheck also catches fail here within a few steps:
  grad_b left out (zeros) at step 2, grad_w halved at step 4 (off by 1.7e-4 by step 10), and a
  forward rounded to bfloat16 at step 1; a grad_w of the wrong shape stops backward() itself.

No performance target: the timing case (B = 64, 784 -> 1000) reports the op against
torch.nn.functional.linear (cuBLAS, through the same dispatcher), which a 16 x 16 tiled kernel does
not beat; the lesson is the registration, not the speed (task 07 is about speed).
"""

from grader.tasks import Case, TorchExtensionTask, TorchOp
from grader.tasks.rules import never_references

BATCHES = [1, 7, 64]
LAYERS = [(784, 1000), (1000, 10), (33, 17)]
LINEAR_ATOL = 5e-4  # see the docstring: task 02's, the probabilistic bound times nine
TRAIN_STEPS = 100  # about 4.5 epochs of the offline digits, a tenth of one of MNIST; seconds on a GPU
TRAIN_ATOL, TRAIN_RTOL = 2e-5, 1e-5


SLEEP_CYCLES = 50_000_000  # torch.cuda._sleep: about 25 ms at 2 GHz, 500x the op at 64 x 784 -> 1000


def label(batch: int, n_in: int, n_out: int) -> str:
    return f"B={batch}, {n_in}->{n_out}"


def make_inputs(p, rng):
    if p.get("strided"):
        # x (B, in) as the transpose of an (in, B) tensor; w and b every other element of larger ones
        return {
            "x": rng.randn(p["in"], p["B"]).t(),
            "w": (rng.randn(p["out"], 2 * p["in"]) / p["in"] ** 0.5)[:, ::2],
            "b": rng.randn(2 * p["out"])[::2],
        }
    return {
        "x": rng.randn(p["B"], p["in"]),
        "w": rng.randn(p["out"], p["in"]) / p["in"] ** 0.5,
        "b": rng.randn(p["out"]),
    }


def reference(x, w, b):
    return (x.double() @ w.double().T + b.double()).to(x.dtype)


def baseline(x, w, b):
    import torch

    return torch.nn.functional.linear(x, w, b)


# --- the training check ------------------------------------------------------------------------------


def train_losses(linear, data, device: str, seed: int, steps: int) -> list[float]:
    """Per-step training losses of lab3/train.py's MLP whose two layers are `linear(x, w, b)`, from
    the seeded nn.Linear init, with train.py's Adam, learning rate, batch size and batch order."""
    import torch

    from lab3 import train

    torch.manual_seed(seed)
    init = train.MLP()  # nn.Linear's own init, from the seed
    params = [p.detach().to(device).clone().requires_grad_(True) for p in init.parameters()]
    w1, b1, w2, b2 = params  # fc1.weight (1000, 784), fc1.bias, fc2.weight (10, 1000), fc2.bias
    optimizer = torch.optim.Adam(params, lr=train.LR)
    x = torch.from_numpy(data.train_x).reshape(-1, 784).to(device)
    y = torch.from_numpy(data.train_y).to(device)
    order = torch.Generator().manual_seed(seed)
    losses: list[float] = []
    while len(losses) < steps:
        for idx in torch.randperm(len(y), generator=order).split(train.BATCH):
            xb, yb = x[idx.to(device)], y[idx.to(device)]
            # x (B, 784) @ w1ᵀ (784, 1000) -> relu -> @ w2ᵀ (1000, 10) -> logits (B, 10)
            logits = linear(torch.relu(linear(xb, w1, b1)), w2, b2)
            loss = torch.nn.functional.cross_entropy(logits, yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if len(losses) == steps:
                break
    return losses


def compare_losses(ours: list[float], theirs: list[float]) -> str:
    """'' when every step agrees within the tolerance, else what differs first."""
    for step, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if not abs(a - b) <= TRAIN_ATOL + TRAIN_RTOL * abs(b):  # `not <=` also catches a NaN
            return (
                f"step {step + 1}: loss {a:.6f} with torch.ops.lab3ext.linear, {b:.6f} with nn.Linear "
                f"(tolerance {TRAIN_ATOL:g} + {TRAIN_RTOL:g}·loss)"
                + ("; the steps before agree: look at the backward" if step else ": the forward itself differs")
            )
    return ""


def _judge(ctx, y, expected, where: str, why: str) -> None:
    import torch

    err = (y.double() - expected.double()).abs()
    bad = ~(err <= LINEAR_ATOL)  # NaN counts as bad
    if bool(bad.any()):
        worst = float(torch.nan_to_num(err, nan=float("inf")).max())
        ctx.fail(
            f"{where}: {int(bad.sum())} of {y.numel()} outputs wrong (largest error {worst:.3g},"
            f" atol {LINEAR_ATOL:g}): {why}"
        )


def runs_on_the_callers_stream(ctx) -> None:
    """The op on a side stream with a sleep and an update of x queued before it (module docstring)."""
    import torch

    from grader.tasks.spec import Rng

    rng = Rng(ctx.seed("stream"), "cuda")
    shape = {"B": 64, "in": 784, "out": 1000}
    old, new = make_inputs(shape, rng), make_inputs(shape, rng)
    x, w, b = old["x"].clone(), old["w"], old["b"]
    expected = reference(new["x"], w, b)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        x.copy_(new["x"])  # queued behind the sleep: the op must read these values
        y = torch.ops.lab3ext.linear(x, w, b)
        seen = y.clone()  # queued right after the op: it must see the op's finished result
    torch.cuda.synchronize()
    why = (
        "the kernel did not run in order on the caller's stream (torch.cuda.current_stream(), a non-default stream"
        " here, with a sleep and a copy into x queued on it): launch on the `stream` the binding passes"
    )
    where = "torch.ops.lab3ext.linear on a side stream at 64x784->1000"
    _judge(ctx, y, expected, where, why)
    _judge(ctx, seen, expected, where + ", read on that stream right after the call", why)


def captures_into_a_cuda_graph(ctx) -> None:
    """The op captured into a CUDA graph and replayed on new values in the same tensors."""
    import torch

    from grader.tasks.spec import Rng

    rng = Rng(ctx.seed("graph"), "cuda")
    # strided views: the binding's copies to contiguous tensors are captured with the kernel
    shape = {"B": 64, "in": 784, "out": 1000, "strided": True}
    first, fresh = make_inputs(shape, rng), make_inputs(shape, rng)
    x, w, b = first["x"], first["w"], first["b"]
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            y = torch.ops.lab3ext.linear(x, w, b)
    except Exception as e:  # CUDA refuses the capture: the op's own doing, not a crash of the grader
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        ctx.fail(
            f"torch.ops.lab3ext.linear cannot be captured into a CUDA graph (torch.cuda.graph: {first_line}):"
            f" launch only on the `stream` the binding passes, and do not synchronize inside the op"
        )
    for t, k in ((x, "x"), (w, "w"), (b, "b")):
        t.copy_(fresh[k])
    graph.replay()
    torch.cuda.synchronize()
    _judge(
        ctx,
        y,
        reference(fresh["x"], fresh["w"], fresh["b"]),
        "a CUDA graph of torch.ops.lab3ext.linear at 64x784->1000 (x, w and b strided views), replayed after new"
        " values were copied into them",
        "the replay did not compute the product again: the kernel ran outside the capture (launch on the `stream`"
        " the binding passes, the capture stream here)",
    )


def backward_calls_the_op(ctx) -> None:
    """One backward must call torch.ops.lab3ext.linear twice (module docstring)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from grader.tasks.spec import Rng

    rng = Rng(ctx.seed("backward"), "cuda")
    v = make_inputs({"B": 7, "in": 33, "out": 17}, rng)
    x, w, b = (v[k].detach().clone().requires_grad_(True) for k in ("x", "w", "b"))
    y = torch.ops.lab3ext.linear(x, w, b)
    grad_y = rng.randn(7, 17)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        y.backward(grad_y)
        torch.cuda.synchronize()
    calls = [e.name for e in prof.events()]
    ours = calls.count("lab3ext::linear")
    products = sorted({c for c in calls if c.split("::")[-1] in ("mm", "addmm", "bmm", "matmul", "mv", "dot")})
    if ours < 2:
        ctx.fail(
            f"one backward of torch.ops.lab3ext.linear (x, w and b requiring grad) called lab3ext::linear {ours}"
            f" time(s)" + (f" and {', '.join(products)}" if products else "") + ": the contract asks for grad_x and"
            " grad_w, the backward's two products, through torch.ops.lab3ext.linear itself"
        )
    ctx.note(f"one backward called lab3ext::linear {ours} times")


def training_matches_torch(ctx) -> None:
    """Training the MLP with the op gives nn.Linear's per-step losses (see the module docstring)."""
    import torch

    from grader.records import Verdict
    from grader.tasks.seeds import seed_for
    from lab3 import mnist, network

    data = mnist.load(network.metadata("mlp").get("data", "auto"))  # what the lab's networks were trained on
    seed = seed_for(ctx.task, "training") % 2**31
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # torch's float32 in float32, as the kernel computes
    try:
        theirs = train_losses(torch.nn.functional.linear, data, ctx.device, seed, TRAIN_STEPS)
        try:
            ours = train_losses(torch.ops.lab3ext.linear, data, ctx.device, seed, TRAIN_STEPS)
        except Exception as e:
            ctx.fail(f"training with torch.ops.lab3ext.linear raised {type(e).__name__}: {e}", Verdict.CRASH)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    where = f"training lab3/train.py's MLP for {TRAIN_STEPS} steps on {data.name}"
    wrong = compare_losses(ours, theirs)
    if wrong:
        ctx.fail(f"{where}: {wrong}")
    worst = max(abs(a - b) for a, b in zip(ours, theirs, strict=True))
    ctx.note(f"{where}: losses {theirs[0]:.4f} -> {theirs[-1]:.4f}, at most {worst:.1e} from nn.Linear's")


CASES = [Case(label(b, i, o), B=b, **{"in": i, "out": o}) for b in BATCHES for i, o in LAYERS]
CASES += [
    Case(label(b, i, o) + ", non-contiguous x, w and b", B=b, strided=True, **{"in": i, "out": o})
    for b, i, o in ((7, 33, 17), (64, 784, 1000))
]

TASK = TorchExtensionTask(
    lab="lab3",
    number="06",
    title="your linear kernel as a PyTorch operator (torch.library)",
    sources=["06_extension.cu", "06_extension.py"],
    course_sources=["06_extension_op.cpp"],
    register="06_extension.py",
    extension="lab3_extension",
    ops=[
        TorchOp(
            "lab3ext::linear",
            ["x", "w", "b"],
            reference,
            grad=["x", "w", "b"],
            baseline=baseline,
            flops=lambda v: 2 * v["x"].shape[0] * v["x"].shape[1] * v["w"].shape[0],
        )
    ],
    cases=CASES,
    make_inputs=make_inputs,
    tolerance={"f32": (LINEAR_ATOL, 0.0)},
    check_cases=[label(7, 33, 17)],
    timing_case=label(64, 784, 1000),
    rules=[
        # judged on the compiled .cu: ATen's products, cuBLAS and ATen's BLAS wrappers, however spelled
        # (at::empty, contiguous() and the stream guard are ATen calls the contract allows)
        never_references(
            r"(at::_ops::(\w*mm\w*|matmul\w*|linear\w*|einsum|tensordot|mv|addmv\w*|dot|vdot|inner|outer|ger"
            r"|chain_matmul|linalg_\w*)::|at::cuda::blas::|at::native::|cublas|cublasLt)",
            "the products are yours: the forward is your kernel, and the backward calls torch.ops.lab3ext.linear",
        )
    ],
    prepare="lab3.network:ensure_trained",
    timeout=240,
    checks=[runs_on_the_callers_stream, captures_into_a_cuda_graph, backward_calls_the_op, training_matches_torch],
    mistakes={
        "missing bias": "every case: b ~ N(0, 1), far past atol 5e-4",
        "precision downgrade": "the 784->1000 cases: inputs rounded to TF32 are off by about 3e-4 rms, 9% past 5e-4",
        "backward formula": (
            "gradcheck in float64 at 7x33->17 (a missing, scaled or summed-wrong gradient), and opcheck's sample with"
            " inputs requiring grad (a gradient of the wrong shape)"
        ),
        "fake shape": "opcheck's test_faketensor: the fake against the real op's output",
        "wrong stream": "the check runs_on_the_callers_stream: new x copied in behind a sleep on a side stream",
        "not capturable": "the check captures_into_a_cuda_graph: captured, then replayed on new values",
        "backward not through the op": "the check backward_calls_the_op: lab3ext::linear twice in one backward",
        "a library does the work": "the compiled .cu's undefined symbols: no ATen product, ATen BLAS or cuBLAS call",
    },
)


def test_extension(grade):
    grade(TASK)
