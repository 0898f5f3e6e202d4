"""Checks for lab3/02_cuda_mlp.cu: the MLP's forward pass as the student's own kernels (linear as
y = x·wᵀ + b with w in torch's (out, in) layout, ReLU in place, argmax per row) and mlp_predict,
which runs the network over n images `batch` at a time.

Every case runs every entry point, each on its own inputs: linear on x (B, in) and w (out, in),
with in and out like fc1's and fc2's (784 -> 1000, 1000 -> 10) and 33 -> 17, whose tails are not
a multiple of any tile; relu on B·out values; argmax on logits (B, out) whose even rows are small
integers, so most of them hold ties (torch.argmax picks the lowest index: so must the kernel); and
mlp_predict on n = 1 or 1000 images with batch 1, 64 or 256, so that the last batch is short (its
labels past n are fenced by the grader: a padded last batch writes there and is `wrong`).

Tolerances. linear: x ~ N(0, 1), w ~ N(0, 1/in), b ~ N(0, 1), so |y| is about 1.4. A float32 dot
product of K terms plus the bias, in any order, is off by at most gamma_(K+1)·(sum|x_k·w_k| + |b|)
with gamma_m = m·u/(1 - m·u), u = 2^-24 (Higham, §3.1; an FMA only makes it smaller). At K = 1000
the sum of |x_k·w_k| is about 0.64·sqrt(K) = 20 (24 at most over a million outputs), plus |b| < 5:
gamma_1001·29 = 1.7e-3: no correct order of summation can be off by more. That worst case needs
every rounding error to point the same way; rounding errors behave as independent, zero-mean
terms, so the error of a real sum grows with sqrt(K), not K (Higham and Mary, "A new approach to
probabilistic rounding error analysis", 2019): about sqrt(1000)·2^-24·29 = 5.5e-5 for one output,
and a float32 evaluation on the CPU measured within 1.5e-6 of float64 on these inputs. atol = 5e-4, nine
times that estimate, is what `linear` is held to. It is tight enough to reject a kernel that
computes in a lower precision: an fp16 rounding of the right answer (what `make verify`'s
calibration tries) is off by up to |y|·2^-11, over 5e-4 wherever |y| > 1, and TF32 inputs by
about 4e-4 rms at K = 1000. Zeros, a transposed weight (every output a different dot product, off
by about 1), a missing bias (off by |b|) or a skipped k tail (off by about 0.1) fail by far; rtol
is 0 because the error does not scale with |y| (a sum that cancels has a small y and the same
error). relu and the labels are exact; the labels' near-tie filter below keeps the worst-case
bound, since a label must be right for every correct order.

mlp_predict's labels are compared exactly, so no input may sit on a near tie that rounding may
break either way. make_inputs bounds the error of each logit as above, through both layers (the
ReLU does not grow an error; see `logit_error_bound`), and draws again every image whose two
largest float64 logits are within twice that bound: on the others, every correct float32
evaluation gives torch's label. The custom check `trained_network_matches_torch` does the same on
the trained network and the whole test set (lab3.network's load_mlp and load_testset): the labels
must equal torch's float32 ones except on images whose top two logits are within that bound of
each other, and both accuracies are noted. It also fences the labels, as the cases do.

Widths and alignment. relu_inplace gets B·out values, 119 and 70 in the 7 x 33 -> 17 and
7 x 1000 -> 10 cases: no multiple of 4, and their last three values are negative, so a float4 loop
with no scalar remainder leaves them negative (`wrong`). The custom check `unaligned_pointers`
calls every entry point once on pointers 4 to 12 bytes past a 16-byte boundary (copies at element
offsets 1, 2 or 3, as a torch view may start; lab3/tests/unaligned.py), at 7 x 36 -> 20 and n = 9
images in batches of 4, whose widths are multiples of 4 so that a vectorized path is taken: a
float4 access there faults with a misaligned address (`crash`), which no aligned case can show.

No performance target: the timing case (n = 10000, batch 4096; linear at 4096 x 784 -> 1000)
reports the time against torch (cuBLAS in float32, TF32 off by default), which a 16 x 16 tiled
kernel does not beat; gates are set once measured on an H100.
"""

from grader.child.context import RunContext
from grader.tasks import (
    NO_LIBRARIES,
    Case,
    CudaTask,
    Entry,
    In,
    InOut,
    Int,
    Out,
    uses_shared_memory,
    uses_syncthreads,
)
from grader.tasks.seeds import seed_for
from grader.tasks.spec import Rng

IMAGE, HIDDEN, CLASSES = 784, 1000, 10
U = 2.0**-24  # float32's unit roundoff
LINEAR_ATOL = 5e-4  # see the docstring: the probabilistic bound, times nine
FENCE = 4096  # labels past n the trained check watches, as the grader's own fence

LINEAR_ARGS = [In("x"), In("w"), In("b"), Out("y"), Int("B"), Int("in"), Int("out")]
RELU_ARGS = [InOut("h"), Int("count")]
ARGMAX_ARGS = [In("logits"), Out("best", "i64"), Int("B"), Int("classes")]
MLP_ARGS = [
    In("images"),
    Int("n"),
    Int("batch"),
    In("w1"),
    In("b1"),
    In("w2"),
    In("b2"),
    Out("labels", "i64"),
]

# (B, in, out) for the layers; (n, batch) for the network. Sanitized (small): the cheap ones.
SHAPES = [
    (1, 784, 1000, 1, 1),
    (7, 33, 17, 1, 64),
    (1000, 1000, 10, 1, 64),
    (64, 1000, 10, 1000, 64),
    (1000, 33, 17, 1000, 256),
    (7, 1000, 10, 1000, 1),
    (1000, 784, 1000, 1000, 256),
]
TIMING = (4096, 784, 1000, 10000, 4096)
SWEEP = [1, 4, 16, 64, 256, 1024, 4096]  # batch sizes of the throughput plot (make bench-lab3)


def label(s: tuple[int, int, int, int, int]) -> str:
    return f"B={s[0]} {s[1]}->{s[2]} n={s[3]} batch={s[4]}"


def case(s: tuple[int, int, int, int, int], small: bool) -> Case:
    b, k, m, n, batch = s
    return Case(label(s), small=small, B=b, in_=k, out=m, n=n, batch=batch)


def gamma(m: int) -> float:
    return m * U / (1 - m * U)


def logit_error_bound(x, w1, b1, w2, b2):
    """Per image, the largest error a correct float32 evaluation can make in a logit, in float64.

    fc1: |h~ - h| <= gamma_785·(|x|·|w1|ᵀ + |b1|) (ReLU is 1-Lipschitz, so it passes on no more).
    fc2 on h~: its rounding, gamma_1001·(|h~|·|w2|ᵀ + |b2|), plus what h's error carries, e_h·|w2|ᵀ.
    """
    x, w1, b1, w2, b2 = (t.double() for t in (x, w1, b1, w2, b2))
    h = (x @ w1.T + b1).clamp_min(0)
    e_h = gamma(IMAGE + 1) * (x.abs() @ w1.abs().T + b1.abs())
    e = gamma(HIDDEN + 1) * ((h + e_h) @ w2.abs().T + b2.abs()) + e_h @ w2.abs().T
    return h @ w2.T + b2, e.amax(dim=1)


def near_ties(x, w1, b1, w2, b2):
    """Images whose two largest logits are close enough for float32 rounding to swap them."""
    logits, e = logit_error_bound(x, w1, b1, w2, b2)
    top = logits.topk(2, dim=1).values
    return (top[:, 0] - top[:, 1]) <= 2 * e


def network_inputs(n: int, rng: Rng) -> dict:
    w1, b1 = rng.randn(HIDDEN, IMAGE) / IMAGE**0.5, rng.randn(HIDDEN) * 0.1
    w2, b2 = rng.randn(CLASSES, HIDDEN) / HIDDEN**0.5, rng.randn(CLASSES) * 0.1
    x = rng.randn(n, IMAGE)
    for _ in range(30):  # about 15% of the images are redrawn each round
        near = near_ties(x, w1, b1, w2, b2)
        count = int(near.sum())
        if count == 0:
            break
        x[near] = rng.randn(count, IMAGE)
    else:
        raise AssertionError("make_inputs: images with near-tied logits are left after 30 draws")
    return {"images": x, "w1": w1, "b1": b1, "w2": w2, "b2": b2}


def make_inputs(p, rng):
    import torch

    b, k, m = p["B"], p["in_"], p["out"]
    logits = rng.randn(b, m)
    logits[::2] = rng.integers(-2, 3, (b + 1) // 2, m).float()  # small integers: ties in most rows
    return {
        "x": rng.randn(b, k),
        "w": rng.randn(m, k) / k**0.5,
        "b": rng.randn(m),
        "B": b,
        "in": k,
        "out": m,
        # the last three values negative: a vectorized ReLU that skips the count's remainder leaves them
        "h": torch.cat([rng.randn(b * m - min(3, b * m)), -rng.randn(min(3, b * m)).abs() - 0.5]),
        "count": b * m,
        "logits": logits,
        "classes": m,
        "n": p["n"],
        "batch": p["batch"],
        **network_inputs(p["n"], rng),
    }


def linear_reference(v):
    return {"y": v["x"].double() @ v["w"].double().T + v["b"].double()}


def relu_reference(v):
    return {"h": v["h"].clamp_min(0)}


def argmax_reference(v):
    import torch

    return {"best": torch.argmax(v["logits"], dim=1)}


def mlp_reference(v):
    logits, _ = logit_error_bound(v["images"], v["w1"], v["b1"], v["w2"], v["b2"])
    return {"labels": logits.argmax(dim=1)}


def torch_linear(v, o):
    import torch

    torch.addmm(v["b"], v["x"], v["w"].T, out=o["y"])


def torch_argmax(v, o):
    import torch

    torch.argmax(v["logits"], dim=1, out=o["best"])


def torch_mlp(v, o):
    import torch

    x, n, batch = v["images"], v["n"], v["batch"]
    for s in range(0, n, batch):  # the same batches as mlp_predict
        h = torch.relu(torch.addmm(v["b1"], x[s : s + batch], v["w1"].T))
        torch.argmax(torch.addmm(v["b2"], h, v["w2"].T), dim=1, out=o["labels"][s : s + batch])


def trained_network_matches_torch(ctx: RunContext) -> None:
    """The trained MLP on the whole test set: the same labels as torch's float32 forward pass,
    except on images whose top two logits are within rounding of each other."""
    import torch

    from lab3.network import load_mlp, load_testset

    net, test = load_mlp(), load_testset()
    w1, b1, w2, b2 = (
        net[k].to("cuda", torch.float32).contiguous() for k in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")
    )
    x = test["x"].reshape(-1, IMAGE).to("cuda", torch.float32).contiguous()
    y = test["y"].to("cuda")
    n = x.shape[0]
    batch = 256 if n % 256 else 255  # a short last batch
    fenced = torch.full((n + FENCE,), -7, dtype=torch.int64, device="cuda")
    labels = fenced[:n]
    fn = ctx.entry("mlp_predict")
    values = {"images": x, "n": n, "batch": batch, "w1": w1, "b1": b1, "w2": w2, "b2": b2, "labels": labels}
    ctx.check_rc("mlp_predict", fn(values), f"the trained network, n={n}, batch={batch}")
    torch.cuda.synchronize()
    where = f"mlp_predict on the trained network's {n} test images, batch={batch}"
    if bool((fenced[n:] != -7).any()):
        ctx.fail(f"{where}: wrote out of bounds past the end of labels: the last batch holds only {n % batch} images")
    if bool((labels == -7).any()):
        ctx.fail(f"{where}: {int((labels == -7).sum())} labels never written")
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # torch's own float32, within the same bound
    try:
        theirs = (torch.relu(x @ w1.T + b1) @ w2.T + b2).argmax(dim=1)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    near = near_ties(x, w1, b1, w2, b2)
    differ = labels != theirs
    bad = differ & ~near
    ours_acc, torch_acc = float((labels == y).double().mean()), float((theirs == y).double().mean())
    ctx.note(
        f"trained MLP, {n} test images, batch {batch}: accuracy {ours_acc:.2%} (torch {torch_acc:.2%}); "
        f"{int(differ.sum())} labels differ from torch's, all on the {int(near.sum())} near ties"
    )
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        ctx.fail(
            f"{where} is wrong: {int(bad.sum())} labels differ from torch's where no rounding can explain it (first at"
            f" image {i}: {int(labels[i])}, torch says {int(theirs[i])});"
            f" accuracy {ours_acc:.2%}, torch {torch_acc:.2%}"
        )


def unaligned_pointers(ctx: RunContext) -> None:
    """Every entry point on pointers that are legal but not 16-byte aligned (module docstring)."""
    from grader.tasks.spec import clone_values
    from lab3.tests.unaligned import call_unaligned

    shape = {"B": 7, "in_": 36, "out": 20, "n": 9, "batch": 4}
    v = make_inputs(shape, Rng(seed_for(ctx.task, "unaligned"), "cuda"))
    where = "7x36->20, n=9, batch=4, with every pointer at an element offset of 1 to 3 (unaligned)"
    for symbol, ref, atol in (
        ("linear", linear_reference, LINEAR_ATOL),
        ("relu_inplace", relu_reference, 0.0),
        ("argmax_rows", argmax_reference, 0.0),
        ("mlp_predict", mlp_reference, 0.0),
    ):
        call_unaligned(ctx, symbol, v, ref(clone_values(v)), atol, where)


def flops_linear(v):
    return 2 * v["B"] * v["in"] * v["out"]


def flops_mlp(v):
    return 2 * v["n"] * (IMAGE * HIDDEN + HIDDEN * CLASSES)


TASK = CudaTask(
    lab="lab3",
    number="02",
    title="the MLP with your own CUDA kernels",
    sources=["02_cuda_mlp.cu"],
    entries=[
        Entry(
            "linear",
            LINEAR_ARGS,
            reference=linear_reference,
            baseline=torch_linear,
            flops=flops_linear,
            tolerance={"f32": (LINEAR_ATOL, 0.0)},
        ),
        Entry(
            "relu_inplace",
            RELU_ARGS,
            reference=relu_reference,
            bytes_moved=lambda v: 8 * v["count"],
            tolerance={"f32": (0.0, 0.0)},
        ),
        Entry("argmax_rows", ARGMAX_ARGS, reference=argmax_reference, baseline=torch_argmax),
        Entry("mlp_predict", MLP_ARGS, reference=mlp_reference, baseline=torch_mlp, flops=flops_mlp),
    ],
    cases=[case(s, small=s[0] * s[1] * s[2] <= 1 << 24 and s[3] == 1) for s in SHAPES] + [case(TIMING, small=False)],
    make_inputs=make_inputs,
    timing_case=label(TIMING),
    sweep=[case((b, 784, 1000, b, b), small=False) for b in SWEEP],
    sweep_entries=["mlp_predict"],
    checks=[trained_network_matches_torch, unaligned_pointers],
    prepare="lab3.network:ensure_trained",
    timeout=180,
    rules=[
        NO_LIBRARIES,
        uses_shared_memory("linear stages tiles of x and w in shared memory", kernels="linear"),
        uses_syncthreads("the tiles are shared by the block: it must wait for them to be filled", kernels="linear"),
    ],
    mistakes={
        "transposed weights": "linear on 33 -> 17 and 1000 -> 10: w indexed as (in, out) is another dot product",
        "missing bias": "linear on every case: b ~ N(0, 1), far past atol 5e-4",
        "missing ReLU": "the trained network's labels (the custom check) and the random cases' mlp_predict labels",
        "padded last batch": "mlp_predict with n = 1000 and batch 64 or 256: the labels past n are fenced",
        "argmax ties": "argmax_rows on rows of small integers (ties) at 1000 classes: torch picks the lowest index",
        "widths not a multiple of the vector width": (
            "relu_inplace on 119 and 70 values whose last three are negative: a float4 loop without its remainder"
        ),
        "unaligned pointers": "the check unaligned_pointers: every pointer 4 to 12 bytes past a 16-byte boundary",
    },
)


def test_cuda_mlp(grade):
    grade(TASK)
