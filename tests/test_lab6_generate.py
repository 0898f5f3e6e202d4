"""`make generate GPUS=N` (lab6/kiln_tp/generate.py) where no GPU is needed.

- The Makefile: without GPUS, `make generate` runs lab 5's llama.generate as before; with GPUS=N it
  runs kiln_tp.generate with --world N and the same options (`make -n`: nothing runs).
- Fewer GPUs than asked (CUDA_VISIBLE_DEVICES="" shows none): one `error:` line naming both counts
  and exit status 2, from `make generate GPUS=2` as a student types it, before anything loads.
- As handed out (lab 6's skeletons), a CPU run names the tasks not done yet, lab 6's 05 among them,
  and how to run the reference instead; exit status 1.
- With the reference solutions (--solutions) on a random 2-layer LLaMA (4 query heads over 2 kv
  heads, written here as a Hugging Face directory): 4 ranks are refused with one line naming
  n_kv_heads = 2 and the world; 2 CPU ranks (--device cpu: gloo) print the same text as lab 5's
  generate in one process, and their statistics line says the ranks.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parents[1]
LAB5 = ROOT / "lab5"
if str(LAB5) not in sys.path:
    sys.path.insert(0, str(LAB5))
MAKE = shutil.which("make")
PROMPT = "Once upon a time"
STEPS = 8
STATS = re.compile(r"^\[(?P<device>cpu|cuda \(.+\))(?P<tp> x (?P<world>\d+) ranks, tensor-parallel)?\] prompt ", re.M)
needs_solutions = pytest.mark.skipif(
    not (ROOT / "lab6" / "solutions" / "kiln_tp" / "cuda.py").exists(),
    reason="no reference solutions here (a student release)",
)


def write_model(folder: Path) -> None:
    """A random LLaMA of 2 layers, dim 128, 4 query heads over 2 kv heads, hidden 128, as a Hugging
    Face directory with a byte-level BPE trained on the course's stories (tiny.train's tokenizer)."""
    from safetensors.torch import save_file

    from llama import LlamaConfig, expected_shapes
    from llama.checkpoint import hf_name
    from tiny.corpus import corpus
    from tiny.train import BOS, EOS, UNK, train_tokenizer

    folder.mkdir(parents=True)
    tk = train_tokenizer(corpus(50, seed=0), 300)
    tk.save(str(folder / "tokenizer.json"))
    side = {"bos_token": BOS, "eos_token": EOS, "unk_token": UNK, "tokenizer_class": "PreTrainedTokenizerFast"}
    (folder / "tokenizer_config.json").write_text(json.dumps(side))
    hf = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": tk.get_vocab_size(),
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": tk.token_to_id(BOS),
        "eos_token_id": tk.token_to_id(EOS),
        "torch_dtype": "float32",
    }
    (folder / "config.json").write_text(json.dumps(hf, indent=1))
    g = torch.Generator().manual_seed(3)
    weights = {}
    for name, shape in expected_shapes(LlamaConfig.from_hf(hf)).items():
        w = torch.rand(shape, generator=g) + 0.5 if len(shape) == 1 else torch.randn(shape, generator=g)
        weights[hf_name(name)] = (w if len(shape) == 1 else w / shape[-1] ** 0.5).contiguous()
    save_file(weights, str(folder / "model.safetensors"))


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("model") / "random-llama"
    write_model(folder)
    return folder


def run_module(lab: str, module: str, *args: str, gpus: str | None = None) -> subprocess.CompletedProcess[str]:
    """`PYTHONPATH=<lab> python -m <module> <args>` from the repository root, as the Makefile runs it."""
    env = {**os.environ, "PYTHONPATH": lab, "TOKENIZERS_PARALLELISM": "false"}
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


def said(r: subprocess.CompletedProcess[str]) -> str:
    return f"exit status {r.returncode}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"


def make(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """make in the checkout, the set-up stamp taken as made (-o) and this interpreter as PY."""
    clean = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
    clean.pop("PYTHONPATH", None)
    cmd = [str(MAKE), "--no-print-directory", "-o", ".venv/.setup-stamp", *args, f"PY={sys.executable}"]
    return subprocess.run(cmd, cwd=ROOT, env={**clean, **(env or {})}, capture_output=True, text=True, timeout=600)


# --- the Makefile -------------------------------------------------------------------------------------------


@pytest.mark.skipif(MAKE is None, reason="no make on this machine")
def test_makefile_runs_lab5_or_lab6() -> None:
    one = make("-n", "generate", f"PROMPT={PROMPT}", "STEPS=5").stdout.strip().splitlines()[-1]
    many = make("-n", "generate", "GPUS=3", f"PROMPT={PROMPT}", "STEPS=5").stdout.strip().splitlines()[-1]
    assert one.startswith(f"PYTHONPATH=lab5 {sys.executable} -m llama.generate "), one
    assert many.startswith(f"PYTHONPATH=lab6 {sys.executable} -m kiln_tp.generate --world 3 "), many
    assert one.split("llama.generate", 1)[1].strip() == many.split("--world 3", 1)[1].strip(), (
        "the same options after the module"
    )


@pytest.mark.skipif(MAKE is None, reason="no make on this machine")
def test_too_few_gpus_is_one_line() -> None:
    r = make("generate", "GPUS=2", env={"CUDA_VISIBLE_DEVICES": ""})
    ours = [line for line in r.stderr.splitlines() if line.strip() and not line.startswith("make")]
    assert r.returncode == 2, said(r)
    assert ours == [
        "python -m kiln_tp.generate: error: GPUS=2 needs 2 GPUs, one rank on each; this machine shows 0 "
        "(CUDA_VISIBLE_DEVICES=); `--device cpu` (ARGS='--device cpu') runs the ranks on the CPU"
    ], said(r)


# --- runs on the CPU ---------------------------------------------------------------------------------------


def test_tasks_not_done_are_named(model: Path) -> None:
    r = run_module("lab6", "kiln_tp.generate", "--world", "2", "--device", "cpu", "--model", str(model))
    assert r.returncode == 1, said(r)
    assert "Traceback" not in r.stderr, said(r)
    assert re.search(r"^lab 6 task 05 is not done yet: lab6/kiln_tp/shard\.py:\d+", r.stderr, re.M), said(r)
    assert "task 04" not in r.stderr, "the CPU does not run task 04's lowering"
    if (ROOT / "lab6" / "solutions").is_dir():
        assert (
            r.stderr.strip().splitlines()[-1]
            == "`make generate GPUS=N SOLUTIONS=1` runs the reference solutions instead."
        )


def test_own_all_reduce_is_for_gpus_and_needs_tasks_02_and_03() -> None:
    r = run_module("lab6", "kiln_tp.generate", "--world", "2", "--device", "cpu", "--all-reduce", "own")
    assert r.returncode == 2, said(r)
    assert "--all-reduce own runs tasks 02 and 03's CUDA libraries: GPUs only" in r.stderr, said(r)
    code = (
        "from kiln_tp.generate import not_done\n"
        "for own in (True, False):\n"
        "    print(sorted({t.lab + '/' + t.number for t in not_done('cuda', own=own)}))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "lab6"), str(ROOT)])}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    with_own, without = out.stdout.splitlines()[-2:]
    assert "'lab6/02'" in with_own and "'lab6/03'" in with_own, with_own  # this checkout's skeletons
    assert "lab6/02" not in without and "lab6/03" not in without, without


@needs_solutions
def test_indivisible_model_is_refused(model: Path) -> None:
    r = run_module("lab6", "kiln_tp.generate", "--world", "4", "--device", "cpu", "--model", str(model), "--solutions")
    assert r.returncode == 2, said(r)
    assert r.stderr.strip().splitlines() == [
        "python -m kiln_tp.generate: error: the model's n_kv_heads = 2 is not divisible by --world 4 (CPU ranks): "
        "tensor parallelism gives each rank an equal share of the query heads, the kv heads and hidden_dim "
        "(n_heads = 4, n_kv_heads = 2, hidden_dim = 128)"
    ], said(r)


@needs_solutions
def test_two_ranks_print_what_one_process_prints(model: Path) -> None:
    common = ["--device", "cpu", "--model", str(model), "--prompt", PROMPT, "--max-new-tokens", str(STEPS)]
    one = run_module("lab5", "llama.generate", *common, "--solutions")
    two = run_module("lab6", "kiln_tp.generate", "--world", "2", *common, "--solutions")
    texts = []
    for r in (one, two):
        assert r.returncode == 0, said(r)
        stats = STATS.search(r.stdout)
        assert stats is not None, said(r)
        texts.append(r.stdout[: stats.start()])
    assert STATS.search(two.stdout)["world"] == "2", said(two)
    assert texts[0].startswith(PROMPT) and len(texts[0]) > len(PROMPT) + 1, said(one)
    assert texts[1] == texts[0], f"2 ranks:\n{texts[1]!r}\none process:\n{texts[0]!r}"


# --- on two GPUs ---------------------------------------------------------------------------------------------


@needs_solutions
@pytest.mark.gpu
def test_own_all_reduce_prints_what_nccl_prints() -> None:
    """Greedy generation of the tiny model on 2 GPUs, the reference solutions: tasks 02 and 03's
    all-reduces in NCCL's place give the same text (their float32 sums round once, NCCL's float16
    ones after each addition: a near tie could still swap a token, and the tiny model has none here)."""
    import torch

    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if seen < 2:
        pytest.skip(f"needs 2 GPUs (one rank on each); this machine shows {seen}")
    common = ["--world", "2", "--prompt", PROMPT, "--max-new-tokens", str(STEPS), "--solutions"]
    nccl = run_module("lab6", "kiln_tp.generate", *common)
    own = run_module("lab6", "kiln_tp.generate", *common, "--all-reduce", "own")
    assert nccl.returncode == 0, said(nccl)
    assert own.returncode == 0, said(own)
    assert "all-reduces by tasks 02 and 03" in own.stdout, said(own)
    text = [r.stdout.split("\n[")[0] for r in (nccl, own)]
    assert text[0] == text[1], f"NCCL:\n{text[0]}\ntasks 02 and 03:\n{text[1]}"
