"""Checks for lab3/01_cpu_inference.cpp: the MLP's forward pass (784 -> 1000 -> ReLU -> 10) as plain
C++ loops over torch.nn.Linear's (out, in) weights, built as a C++ extension and graded on the CPU
(gpu=False: graded on a machine without a GPU too, never skipped).

Inputs: x standard normal (MNIST's normalized pixels span about -0.4 to 2.8), weights standard
normal scaled by 1/sqrt(in) as a trained or freshly initialized layer is (so every hidden value
and logit is of order 1, and about half the hidden values are negative: a missing ReLU shows),
biases standard normal times 0.1 (a missing bias moves a logit by about 0.1). Batches 1, 3, 64 and
257 (not a multiple of any blocking a student may try); the last case runs the trained network on
the first 256 test images, once lab3/network.py provides it.

The network's widths are 784 -> 1000 -> 10, and 784 and 1000 are multiples of 8: a loop unrolled
by 4 or 8 with no remainder loop passes on them. The contract takes any in, hidden and out >= 1
(the binding reads them from the tensors), so two cases change the widths: 13 -> 1001 -> 7 and
1001 -> 13 -> 7. A k loop that stops at the last multiple of 8 drops 5 terms of each fc1 dot
product in the first (1 in the second, off by |x_k·w_k|, about 0.03, far past 1e-4), and an output
loop unrolled by 8 with no remainder never writes any of the 7 logits. Both cost microseconds.

Tolerance (atol 1e-4, rtol 1e-4, over a float64 reference cast to float32): each output is a
float32 sum of 784 (then 1000) products in an order other than the reference's. Rounding adds
about u·sqrt(n)·sum|x_k w_k| (u = 6e-8): measured, a one-accumulator loop is within 2e-6 of the
float64 result on these inputs and torch's own float32 matmul within 1e-6, so 1e-4 leaves 50x room
(the trained network's larger sums and logits of order 10 get rtol's 1e-3 on top). Zeros, a
missing bias (0.1), a missing ReLU or weights read as (in, out) are all off by 1e-1 or more.

No timing: the kind times only on the GPU. Images per second on the CPU, for each loop order and
for torch, are measured and discussed in the chapter's section on task 01. The op is not run
through opcheck or torch.compile: it has no fake (meta) implementation, and the lesson here is the
loops; lab 3 task 06 is the one about torch.library.
"""

from pathlib import Path

from grader.tasks import Case, TorchExtensionTask, TorchOp
from grader.tasks.rules import never_references

IN, HIDDEN, OUT = 784, 1000, 10
BATCHES = [1, 3, 64, 257]
# (batch, in, hidden, out): widths that are no multiple of 4 or 8, as the contract allows
ODD_WIDTHS = [(3, 13, 1001, 7), (2, 1001, 13, 7)]
TRAINED_BATCH = 256
# the trained network comes from lab3/network.py (load_mlp, load_testset, ensure_trained)
TRAINED = (Path(__file__).resolve().parents[1] / "network.py").is_file()


def make_inputs(p, rng):
    if p.get("trained"):
        from lab3.network import load_mlp, load_testset

        net, test = load_mlp(), load_testset()
        x = test["x"][: p["batch"]].reshape(-1, IN).float().contiguous()
        return {
            "x": x,
            "w1": net["fc1.weight"].contiguous(),
            "b1": net["fc1.bias"].contiguous(),
            "w2": net["fc2.weight"].contiguous(),
            "b2": net["fc2.bias"].contiguous(),
        }
    n_in, hidden, out = p.get("n_in", IN), p.get("hidden", HIDDEN), p.get("n_out", OUT)
    return {
        "x": rng.randn(p["batch"], n_in),
        "w1": rng.randn(hidden, n_in) / n_in**0.5,
        "b1": rng.randn(hidden) * 0.1,
        "w2": rng.randn(out, hidden) / hidden**0.5,
        "b2": rng.randn(out) * 0.1,
    }


def reference(x, w1, b1, w2, b2):
    import torch

    h = torch.relu(x.double() @ w1.double().T + b1.double())
    return (h @ w2.double().T + b2.double()).to(x.dtype)


CASES = [Case(f"batch={b}", batch=b) for b in BATCHES]
CASES += [Case(f"batch={b}, {i}->{h}->{o}", batch=b, n_in=i, hidden=h, n_out=o) for b, i, h, o in ODD_WIDTHS]
if TRAINED:
    CASES.append(Case(f"trained, {TRAINED_BATCH} test images", batch=TRAINED_BATCH, trained=True))

TASK = TorchExtensionTask(
    lab="lab3",
    number="01",
    title="CPU inference (the MLP as C++ loops)",
    sources=["01_cpu_inference.cpp"],
    course_sources=["01_cpu_inference_binding.cpp"],
    extension="lab3_cpu_inference",
    ops=[TorchOp("lab3::mlp_forward_cpu", ["x", "w1", "b1", "w2", "b2"], reference, opcheck=False, compile=False)],
    cases=CASES,
    make_inputs=make_inputs,
    tolerance={"f32": (1e-4, 1e-4)},
    rules=[
        # judged on the compiled file: what it calls outside itself, however it is spelled
        never_references(
            r"((at|torch|c10|caffe2|Eigen|dnnl|oneapi)::|mkl_|cblas_|openblas|[sdcz](gemm|gemv|dot)_?$)",
            "the lesson is the loops: write them in plain C++, without torch, ATen or a BLAS doing the math",
        )
    ],
    prepare="lab3.network:ensure_trained" if TRAINED else None,
    gpu=False,
    mistakes={
        "transposed weights": "every case: w read as (in, out) gives other dot products (in bounds, off by about 1)",
        "missing bias": "every case: b ~ 0.1·N(0, 1) moves each output far past atol 1e-4",
        "missing ReLU": "every case: about half the hidden values are negative",
        "short image loop": "batch 1, 3, 64 and 257: the last image's logits are left at the binding's zeros",
        "widths not a multiple of the unroll": (
            "13 -> 1001 -> 7 and 1001 -> 13 -> 7: a loop unrolled by 4 or 8 without its remainder drops terms or"
            " outputs that 784 -> 1000 -> 10 never shows"
        ),
        "a library does the work": (
            "the compiled file's undefined symbols: no torch, ATen, c10 or BLAS function, however an include macro"
            " or a namespace alias spells it"
        ),
    },
)


def test_cpu_inference(grade):
    grade(TASK)
