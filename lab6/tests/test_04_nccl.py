"""Checks for lab6/kiln_tp/cuda.py: the all_reduce node lowered to NCCL, run by lab 4's CUDA executor and
captured in lab 5's CUDA graphs, on 2 GPUs (skipped, naming the counts, on a machine that shows fewer).

Every check starts its ranks with kiln_tp.launch(..., device="cuda"): rank r on GPU r, one process
group whose CUDA tensors go through NCCL (its communicator made when the group is, not inside a
capture), CPU tensors through gloo.

- One all_reduce alone (kiln_tp.model.all_reduce_runs): the graph y = all_reduce(x), z = y + x, in
  float32, float16 and bfloat16, of 1, 1000, 4096 (a decode step's row of the 7B model) and 5 x 4096
  (a prompt's) elements, compiled by kiln_llm with its CUDA graph (use_graph=True: the executor's
  warm-up, its capture, then replays) and without (every launch called by each run), run three
  times on new inputs, rank 1 sleeping 0.2 s on the host before the second (a launch that does not
  make the executor's stream wait for the sum then has its slot read long before the sum is there).
  Every rank feeds whole numbers from -8 to 8, whose sums are exact in every dtype: y must be the
  sum of the two ranks' x and z that sum plus rank 0's own x, exactly, on every run. z catches an
  input reduced where it lies (the add then reads the sum, not x) and an add that did not wait for
  the sum; y a sum left anywhere but the node's slot of the arena, a slot never written, a
  reduction made once when the executor was built, and a capture that failed (a launch that waits
  on the host).
- The same graph on one GPU (a launch of one rank): y must be x and z twice x, with no call of
  torch.distributed.all_reduce at all: the sum over one rank is its own tensor.
- Lab 5's tiny model (lab5/models/tiny-llama: made by the grading process before this one starts,
  by lab5/tiny/train.py, from the repository's own stories: no network) split over the 2 GPUs, in
  float32 and converted to float16, against the same model on one GPU (lab 5's LlamaModel, in this
  process): the logits of a prompt ("Once upon a time", with BOS), then 24 greedy tokens by lab 5's
  decode_loop, rank 0's token broadcast, each step's logits, and every rank's logits against rank
  0's. The decode steps must have replayed lab 5's captured step graphs (the all-reduces inside
  them), not lab 4's launches one by one.

Tolerances. One GPU and two add the same products in a different order in two places a layer: the
output projection and the down projection each sum K/2 products per rank, then the all-reduce adds
the two partial sums, where one GPU's kernel adds all K in its own order. In float32 that moves a
logit by about 1e-5 (the tiny model's logits reach about 20); the bound is 1e-3, lab 5's own for its
GPU kernels. In float16 each rank's partial sum is rounded to float16 before NCCL adds the two (2^-11
of its size), and the rounding of a residual stream carries through 4 layers: the bound is lab 5's
float16 one, 0.05 + 1% of the largest logit. Greedy tokens must be equal up to any step whose top
two logits (one GPU) are within ten times the bound of each other, a near tie where either token is
right: from there the two runs may feed different tokens, and the comparison stops. The ranks'
logits must be equal to the bit: two ranks' sum a + b is the same number in either order, and NCCL
gives every rank the same bits of it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from grader.tasks import PythonTask

LAB = Path(__file__).resolve().parents[1]
TINY = LAB.parent / "lab5" / "models" / "tiny-llama"  # lab5/tiny/train.py's DEFAULT_DIR

LAB4_GPU = [
    "../lab4/kiln/planner.py",
    "../lab4/kiln/kernels/pointwise.cu",
    "../lab4/kiln/kernels/matmul.cu",
    "../lab4/kiln/kernels/layout.cu",
    "../lab4/kiln/cuda.py",
    "../lab4/kiln/capture.py",
]
LAB5_GPU = [
    "../lab5/kiln_llm/kernels/llama.cu",
    "../lab5/kiln_llm/kernels/linear.cu",
    "../lab5/kiln_llm/fusion.py",
    "../lab5/llama/model.py",
    "../lab5/llama/generate.py",
]

TASK = PythonTask(
    lab="lab6",
    number="04",
    title="all_reduce on the GPU: NCCL inside the CUDA graph",
    sources=["kiln_tp/cuda.py"],
    packages=["kiln_tp", "../lab5/kiln_llm", "../lab5/llama", "../lab4/kiln"],
    builds_on=["kiln_tp/shard.py", *LAB4_GPU, *LAB5_GPU],
    gpu=True,
    gpus=2,
    timeout=900,  # the first run on a machine builds lab 4's and lab 5's kernels (minutes)
    prepare="lab6.tests.test_04_nccl:prepare_tiny_model",
    mistakes={
        "output slot": "test_all_reduce_graph: the sum must be left in the node's slot of the arena "
        "(ex.tensors[node]), which the next launch reads, not in a tensor the launch makes",
        "input not copied": "test_all_reduce_graph: out reduced in place without x copied into it first holds "
        "whatever an earlier node or run left there",
        "input reduced in place": "test_all_reduce_graph: z = y + x reads x after the all-reduce; reducing x where "
        "it lies makes it the sum",
        "reduced when lowered": "test_all_reduce_graph: the lowering runs once, when the executor is built; the "
        "launch is what every run (and the captured graph) repeats",
        "waits on the host": "test_all_reduce_graph[captured] and the model tests: a launch that synchronizes "
        "cannot be captured in a CUDA graph",
        "not waited": "test_all_reduce_graph: a reduction queued with async_op=True and never waited for runs "
        "beside the next launch, which reads the slot before the sum (rank 1 is late in run 2: it always does)",
    },
)

SHAPES = [(1,), (1000,), (4096,), (5, 4096)]
DTYPES = ["float32", "float16", "bfloat16"]
RUNS = 3
PROMPT = "Once upon a time"
STEPS = 24
# (atol, share of the largest logit) by model dtype; near ties are 10x the bound (the docstring says why)
TOL = {"float32": (1e-3, 1e-3), "float16": (0.05, 0.01)}
TIE = 10


def prepare_tiny_model() -> None:
    """Run by the grading process before this task's process starts (outside any sandbox): lab 5's
    embedded tiny model, trained into lab5/models/tiny-llama if it is not there (under a minute on
    a GPU; once). Nothing where fewer than 2 GPUs are visible: the task is skipped there."""
    from grader import toolchain

    if toolchain.visible_gpu_count() < TASK.gpus:
        return
    lab5 = str(LAB.parent / "lab5")
    if lab5 not in sys.path:
        sys.path.insert(0, lab5)
    from tiny.train import ensure_tiny_model

    ensure_tiny_model(TINY)


# --- one all_reduce --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reduced():
    from kiln_tp import launch
    from kiln_tp.model import all_reduce_runs

    return launch(2, all_reduce_runs, SHAPES, DTYPES, RUNS, timeout=600, device="cuda")


@pytest.fixture(scope="module")
def alone():
    from kiln_tp import launch
    from kiln_tp.model import all_reduce_runs

    return launch(1, all_reduce_runs, SHAPES, DTYPES, RUNS, timeout=600, device="cuda")


def _check_runs(got, world: int, use_graph: bool) -> None:
    import torch

    from kiln_tp.model import reduce_input

    how = "captured in the executor's CUDA graph" if use_graph else "launched one by one (use_graph=False)"
    for shape in SHAPES:
        for name in DTYPES:
            dtype = getattr(torch, name)
            for run, (y, z) in enumerate(got[(shape, name, use_graph)]):
                x0 = reduce_input(0, run, shape, dtype)
                want = sum((reduce_input(r, run, shape, dtype) for r in range(world)), torch.zeros_like(x0))
                where = f"{name}{list(shape)}, {how}, run {run + 1} of {RUNS}"
                assert y.dtype == dtype and tuple(y.shape) == shape, f"{where}: y is {y.dtype}{list(y.shape)}"
                bad = (y != want).nonzero()
                assert not len(bad), (
                    f"{where}: y = all_reduce(x) is wrong at {len(bad)} of {y.numel()} elements; at "
                    f"{bad[0].tolist()}: {y[tuple(bad[0])].item()}, the sum of the {world} ranks' x is "
                    f"{want[tuple(bad[0])].item()}"
                )
                bad = (z != want + x0).nonzero()
                assert not len(bad), (
                    f"{where}: z = y + x is wrong at {len(bad)} of {z.numel()} elements (y is right): the add "
                    f"after the all-reduce must still read x, the rank's own input; at {bad[0].tolist()}: "
                    f"{z[tuple(bad[0])].item()}, expected {(want + x0)[tuple(bad[0])].item()}"
                )


@pytest.mark.points(3)
@pytest.mark.parametrize("use_graph", [True, False], ids=["captured", "launched"])
def test_all_reduce_graph(reduced, use_graph):
    _check_runs(reduced["results"], 2, use_graph)


@pytest.mark.points(1)
def test_world_one_is_a_copy(alone):
    _check_runs(alone["results"], 1, True)
    _check_runs(alone["results"], 1, False)
    assert alone["nccl_calls"] == 0, (
        f"on one GPU the launches called torch.distributed.all_reduce {alone['nccl_calls']} times: the sum over "
        "one rank is its own tensor, a copy, with no NCCL call"
    )


# --- lab 5's tiny model on 2 GPUs -------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """{dtype: (config, weights)} of lab 5's tiny model, the prompt's ids, and where they are saved."""
    import llama

    if not all((TINY / f).is_file() for f in ("config.json", "model.safetensors", "tokenizer.json")):
        pytest.fail(
            f"{TINY} is missing: the grading process trains it before this task runs (prepare_tiny_model); "
            "`python lab5/tiny/train.py` makes it by hand"
        )
    models = {name: llama.load(TINY, dtype=name) for name in TOL}
    tok = llama.load_tokenizer(TINY / "tokenizer.json", models["float32"][0].vocab_size)
    prompt = tok.encode(PROMPT, bos=tok.bos_id is not None)
    path = tmp_path_factory.mktemp("tiny") / "models.pt"
    import torch

    torch.save(models, path)
    return models, prompt, path


@pytest.fixture(scope="module")
def one_gpu(tiny):
    """The tiny model on GPU 0 of this process (lab 5's LlamaModel): prompt logits, greedy tokens and
    each step's logits, and each choice's margin (top-1 minus top-2 logit)."""
    import torch

    from kiln_tp.model import _Recorded
    from llama.generate import Sampler, decode_loop
    from llama.model import LlamaModel

    models, prompt, _ = tiny
    out = {}
    for name, (config, weights) in models.items():
        m = LlamaModel(config, weights, device="cuda", max_seq=len(prompt) + STEPS)
        prefill = m.prefill(prompt)
        m.reset()
        rec = _Recorded(m)
        loop = decode_loop(rec, prompt, Sampler(0.0), max_new_tokens=STEPS, eos_id=None)
        rows = torch.stack([r.reshape(-1, r.shape[-1])[-1] for r in rec.rows])
        top2 = rows.topk(2, dim=-1).values
        out[name] = {
            "prefill": prefill,
            "steps": rows[1:],
            "tokens": loop.tokens,
            "margins": (top2[:, 0] - top2[:, 1]).tolist(),
        }
        del m, rec
    torch.cuda.synchronize()
    return out


@pytest.fixture(scope="module")
def two_gpus(tiny, one_gpu):  # one_gpu first: it builds the kernels the ranks then find built
    from kiln_tp import launch
    from kiln_tp.model import greedy_cases

    _, prompt, path = tiny
    return launch(2, greedy_cases, str(path), list(TOL), prompt, STEPS, "cuda", timeout=600, device="cuda")


@pytest.mark.points(3)
@pytest.mark.parametrize("name", list(TOL))
def test_tiny_model_on_two_gpus(name, one_gpu, two_gpus):
    import torch

    ref, got = one_gpu[name], two_gpus[name]
    atol, share = TOL[name]
    bound = atol + share * float(ref["prefill"].abs().max())
    assert got["captured"], "the decode steps did not replay lab 5's step graphs: the all-reduces must run captured"
    diff = (got["prefill"] - ref["prefill"]).abs().max().item()
    assert got["prefill"].shape == ref["prefill"].shape and diff <= bound, (
        f"{name}: the prompt's logits on 2 GPUs differ from one GPU's by up to {diff:.3g} (bound {bound:.3g})"
    )
    tie = next((i for i, m in enumerate(ref["margins"]) if m < TIE * bound), len(ref["margins"]))
    assert got["tokens"][:tie] == ref["tokens"][:tie], (
        f"{name}: greedy tokens on 2 GPUs {got['tokens']}, on one GPU {ref['tokens']}"
        + (f" (compared up to the near tie at step {tie})" if tie < len(ref["margins"]) else "")
    )
    n = min(tie, len(ref["steps"]))
    if n:
        diff = (got["steps"][:n] - ref["steps"][:n]).abs().max().item()
        step = int((got["steps"][:n] - ref["steps"][:n]).abs().amax(dim=-1).argmax()) + 1
        assert diff <= bound, (
            f"{name}: decode step {step}'s logits on 2 GPUs differ from one GPU's by {diff:.3g} (bound {bound:.3g})"
        )
    assert torch.isfinite(got["prefill"]).all()


@pytest.mark.points(1)
def test_ranks_agree(two_gpus):
    for name, got in two_gpus.items():
        assert got["spread"] == 0.0, (
            f"{name}: rank 1's logits differ from rank 0's by up to {got['spread']:.3g}; every rank must get the "
            "same sum from the all-reduce"
        )


def test_nccl(grade):
    grade(TASK)
