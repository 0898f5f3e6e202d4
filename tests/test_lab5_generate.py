"""`make generate`, run as a student runs it (issue 23), on copies of the course's tree:

- with the reference code in the student files of labs 4 and 5 (a student who finished both), it
  prints the prompt, generated text and its statistics line, and exits 0;
- as handed out (skeletons), it names the tasks not done yet and `make generate SOLUTIONS=1`, in a
  few lines without a traceback, and the program exits 1 (make says `Error 1`, and exits 2 itself);
  so it does when only lab 5's task 05 is missing, whether its TODO regions are still as given or a
  stub raises NotImplementedError at run time;
- a MODEL= that is truncated or not a checkpoint is one `error:` line and exit status 2;
- `SOLUTIONS=1` runs the reference on the skeletons, staged in the tree's .build/staged/lab5-solutions
  (the same folder every run, so a second run finds its kernels built) and nothing in TMPDIR, when it
  succeeds and when it fails (a MODEL= that does not exist: one `error:` line, exit status 2).

The copies hold grader/, lab4/, lab5/ and the Makefile; make runs this interpreter (the checkout's
.venv) and is told that the set-up stamp is made, so it never runs setup.sh there. The embedded tiny
model takes minutes to train, so lab5/models/tiny-llama/ in a copy is a random LLaMA of the same kind
(a Hugging Face directory with a byte-level BPE, 2 layers, dim 128, head_dim 32 as the GPU kernels
take, grouped-query), written in a second; each run generates 8 tokens. Without a GPU every run is on
the CPU (CI); on a GPU machine the plain runs take the GPU as a student's would, and a float16 run
(marked gpu) checks that path too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parents[1]
LAB5 = ROOT / "lab5"
if str(LAB5) not in sys.path:
    sys.path.insert(0, str(LAB5))

PROMPT = "Once upon a time"
STEPS = 8
MAKE = shutil.which("make")
pytestmark = pytest.mark.skipif(MAKE is None, reason="no make on this machine")
# a student release has no reference solutions: there only the handed-out tree can be checked
needs_solutions = pytest.mark.skipif(
    not (ROOT / "lab5" / "solutions").is_dir(), reason="no reference solutions here (a student release)"
)
# what the copies leave out: caches, build outputs, trained models, the labs' figures and notebooks
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".build", "models", "figures", "*.ipynb", "results")
STATS = re.compile(r"^\[(?P<device>cpu|cuda \(.+\))\] prompt \d+ tokens, .*; (?P<new>\d+) new tokens, ", re.MULTILINE)
STAGED = "lab5-*"  # what an earlier grader.staging left in TMPDIR on every run


# --- the copies and the model --------------------------------------------------------------------------------


def write_model(folder: Path) -> None:
    """A random LLaMA as the Hugging Face directory tiny.train writes (the files `ensure_tiny_model` wants)."""
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
        "num_attention_heads": 4,  # head_dim 32: a size the GPU's attention kernels take (lab5/05's GPU model)
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
    g = torch.Generator().manual_seed(0)
    weights = {}
    for name, shape in expected_shapes(LlamaConfig.from_hf(hf)).items():
        w = torch.rand(shape, generator=g) + 0.5 if len(shape) == 1 else torch.randn(shape, generator=g)
        weights[hf_name(name)] = (w if len(shape) == 1 else w / shape[-1] ** 0.5).contiguous()
    save_file(weights, str(folder / "model.safetensors"))


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("model") / "tiny-llama"
    write_model(folder)
    return folder


def copy_course(dest: Path, model: Path, *, solved: bool) -> Path:
    """The course as a student's clone holds it; `solved`: every labN/solutions/<package> over the student's."""
    dest.mkdir(parents=True)
    shutil.copy2(ROOT / "Makefile", dest / "Makefile")
    for name in ("grader", "lab4", "lab5"):
        shutil.copytree(ROOT / name, dest / name, ignore=IGNORE)
    if solved:
        for lab in ("lab4", "lab5"):
            for package in sorted(p for p in (dest / lab / "solutions").iterdir() if p.is_dir()):
                shutil.copytree(package, dest / lab / package.name, dirs_exist_ok=True)
    shutil.copytree(model, dest / "lab5" / "models" / "tiny-llama")
    return dest


@pytest.fixture(scope="module")
def solved(tmp_path_factory: pytest.TempPathFactory, model: Path) -> Path:
    return copy_course(tmp_path_factory.mktemp("solved") / "course", model, solved=True)


@pytest.fixture(scope="module")
def handed_out(tmp_path_factory: pytest.TempPathFactory, model: Path) -> Path:
    return copy_course(tmp_path_factory.mktemp("handed-out") / "course", model, solved=False)


# --- running make ----------------------------------------------------------------------------------------------


def make_generate(tree: Path, tmp: Path, *variables: str) -> subprocess.CompletedProcess[str]:
    """`make generate PROMPT=... STEPS=8 <variables>` in tree, with TMPDIR=tmp."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
    env.pop("PYTHONPATH", None)  # the Makefile sets its own
    tmp.mkdir(parents=True, exist_ok=True)
    env["TMPDIR"] = str(tmp)
    # -o: the set-up stamp counts as made, so make never runs setup.sh in a copy; PY: this interpreter
    cmd = [str(MAKE), "--no-print-directory", "-o", ".venv/.setup-stamp", "generate", f"PY={sys.executable}"]
    return subprocess.run(
        [*cmd, f"PROMPT={PROMPT}", f"STEPS={STEPS}", *variables],
        cwd=tree,
        env=env,
        capture_output=True,
        encoding="utf-8",
        errors="replace",
        timeout=600,
    )


def said(r: subprocess.CompletedProcess[str]) -> str:
    return f"exit status {r.returncode}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"


def check_text(r: subprocess.CompletedProcess[str], device: str) -> None:
    """A run that generated: the prompt and its continuation, then the statistics line."""
    assert r.returncode == 0, said(r)
    assert "Traceback" not in r.stderr, said(r)
    stats = STATS.search(r.stdout)
    assert stats is not None, said(r)
    assert stats["device"].startswith(device), said(r)
    assert 1 <= int(stats["new"]) <= STEPS, said(r)
    text = r.stdout[: stats.start()]
    assert PROMPT in text and len(text.rpartition(PROMPT)[2].strip()) > 0, said(r)


def our_lines(r: subprocess.CompletedProcess[str]) -> list[str]:
    """What the program wrote to stderr, without make's own `make: *** ... Error N`."""
    return [line for line in r.stderr.splitlines() if line.strip() and not line.startswith("make")]


def has_cuda() -> bool:
    return torch.cuda.is_available()


# --- a student who finished labs 4 and 5 ------------------------------------------------------------------------


@needs_solutions
def test_generate_runs_on_finished_labs(solved: Path, tmp_path: Path) -> None:
    r = make_generate(solved, tmp_path / "tmp")
    check_text(r, "cuda" if has_cuda() else "cpu")
    assert "running on the CPU" in r.stderr or has_cuda(), said(r)


@needs_solutions
@pytest.mark.gpu
def test_generate_runs_on_the_gpu_in_float16(solved: Path, tmp_path: Path) -> None:
    if not has_cuda():
        pytest.skip("no CUDA GPU that torch can use: `make generate` runs on the CPU here (the test above)")
    r = make_generate(solved, tmp_path / "tmp", "ARGS=--device cuda --dtype float16")
    check_text(r, "cuda")


# --- a student who has not finished ------------------------------------------------------------------------------


def exit_status(r: subprocess.CompletedProcess[str]) -> int:
    """The program's exit status, as make tells it (make itself exits 2 whenever a recipe fails)."""
    m = re.search(r"^make: \*\*\* \[.*\] Error (\d+)$", r.stderr, re.MULTILINE)
    return int(m[1]) if m else r.returncode


def check_not_done(r: subprocess.CompletedProcess[str], *tasks: str) -> list[str]:
    """Exit 1, a line per task not done, the way to run the reference, no traceback."""
    assert r.returncode != 0 and exit_status(r) == 1, said(r)
    assert "Traceback" not in r.stdout + r.stderr, said(r)
    lines = our_lines(r)
    for task in tasks:
        assert any(f"{task} is not done yet" in line for line in lines), said(r)
    # the way to run the reference where this tree has one; a student release is pointed at its tests
    hint = "make generate SOLUTIONS=1" if (ROOT / "lab5" / "solutions").is_dir() else "make test-lab5"
    assert hint in r.stderr, said(r)
    assert STATS.search(r.stdout) is None, said(r)
    return lines


def test_handed_out_labs_name_the_tasks_not_done(handed_out: Path, tmp_path: Path) -> None:
    r = make_generate(handed_out, tmp_path / "tmp")
    cpu = ["lab 4 task 02", "lab 5 task 01", "lab 5 task 05", "lab 5 task 06"]
    gpu = ["lab 4 task 01", "lab 4 task 06", "lab 5 task 02", "lab 5 task 04", "lab 5 task 05", "lab 5 task 06"]
    lines = check_not_done(r, *(gpu if has_cuda() else cpu))
    assert len(lines) <= 14, said(r)  # a line per task and the hint: no log of a model trained or loaded
    assert "lab5/llama/model.py:" in r.stderr, said(r)  # where to start


@pytest.fixture
def lab5_task05_missing(tmp_path: Path, model: Path) -> Callable[[Callable[[str], str]], Path]:
    """A finished course but for lab5/llama/model.py, made by `edit` from the reference."""

    def make(edit: Callable[[str], str]) -> Path:
        tree = copy_course(tmp_path / "course", model, solved=True)
        target = tree / "lab5" / "llama" / "model.py"
        target.write_text(edit((ROOT / "lab5" / "solutions" / "llama" / "model.py").read_text()))
        return tree

    return make


@needs_solutions
def test_one_task_missing_is_named_alone(
    lab5_task05_missing: Callable[[Callable[[str], str]], Path], tmp_path: Path
) -> None:
    tree = lab5_task05_missing(lambda _: (ROOT / "lab5" / "llama" / "model.py").read_text())  # the skeleton
    r = make_generate(tree, tmp_path / "tmp")
    lines = check_not_done(r, "lab 5 task 05")
    assert len(lines) == 2, said(r)  # that task, then the hint
    assert "lab 4" not in r.stderr and "task 06" not in r.stderr, said(r)


@needs_solutions
def test_a_stub_that_raises_is_named_too(
    lab5_task05_missing: Callable[[Callable[[str], str]], Path], tmp_path: Path
) -> None:
    # a region with code in it is not "as given", so only the NotImplementedError at run time shows it
    decode = "return self._run(self.decoder, [token], last=True)"

    def edit(text: str) -> str:
        assert text.count(decode) == 1
        return text.replace(decode, 'raise NotImplementedError("lab5/05: decode")')

    # on the CPU everywhere: the same path on a GPU, less a build of every kernel in a fresh tree
    r = make_generate(lab5_task05_missing(edit), tmp_path / "tmp", "ARGS=--device cpu")
    check_not_done(r, "lab 5 task 05")
    assert "lab5/llama/model.py:" in r.stderr and "decode" in r.stderr, said(r)


# --- a model that cannot be used --------------------------------------------------------------------------------


def truncated(tmp: Path, model: Path) -> Path:
    folder = tmp / "cut"
    shutil.copytree(model, folder)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    return folder


def not_a_model(tmp: Path, model: Path) -> Path:
    (tmp / "notes.bin").write_text("these are my notes, not a checkpoint\n" * 20)
    return tmp / "notes.bin"


BAD_MODELS: dict[str, Callable[[Path, Path], Path]] = {
    "truncated": truncated,
    "not a checkpoint": not_a_model,
}


@needs_solutions
@pytest.mark.parametrize("kind", list(BAD_MODELS))
def test_unusable_model_is_one_line(kind: str, solved: Path, model: Path, tmp_path: Path) -> None:
    path = BAD_MODELS[kind](tmp_path, model)
    check_unusable(make_generate(solved, tmp_path / "tmp", f"MODEL={path}"), path)


def check_unusable(r: subprocess.CompletedProcess[str], path: Path) -> None:
    """Exit status 2 and one line that names the model, no traceback, no text."""
    assert r.returncode == 2 and exit_status(r) == 2, said(r)
    assert "Traceback" not in r.stdout + r.stderr, said(r)
    errors = [line for line in our_lines(r) if "error:" in line]
    assert len(errors) == 1 and str(path) in errors[0], said(r)
    assert STATS.search(r.stdout) is None, said(r)


# --- the reference solutions ------------------------------------------------------------------------------------


@needs_solutions
def test_solutions_run_on_the_handed_out_labs_and_clean_up(handed_out: Path, tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    r = make_generate(handed_out, tmp, "SOLUTIONS=1")
    check_text(r, "cuda" if has_cuda() else "cpu")
    assert not sorted(tmp.glob(STAGED)), f"{sorted(tmp.glob(STAGED))} left behind\n{said(r)}"
    staged = handed_out / ".build" / "staged" / "lab5-solutions"
    model_py = staged / "llama" / "model.py"
    assert model_py.is_file(), said(r)
    stamp = model_py.stat().st_mtime_ns

    missing = tmp_path / "no-such-model"
    r = make_generate(handed_out, tmp, "SOLUTIONS=1", f"MODEL={missing}")
    check_unusable(r, missing)
    assert not sorted(tmp.glob(STAGED)), f"{sorted(tmp.glob(STAGED))} left behind after an error\n{said(r)}"
    assert model_py.stat().st_mtime_ns == stamp, "an unchanged staged file is written again (its build cache goes cold)"


def test_a_student_release_is_not_offered_the_solutions(tmp_path: Path) -> None:
    """A release without labN/solutions/ names the grader's command instead of SOLUTIONS=1."""
    from llama import generate

    (tmp_path / "with" / "solutions").mkdir(parents=True)
    assert "make generate SOLUTIONS=1" in generate.solutions_hint(tmp_path / "with")
    hint = generate.solutions_hint(tmp_path)
    assert "SOLUTIONS" not in hint and "make test-lab5" in hint, hint


# --- the kernels built in the background (issue 23: a first run in a minute) --------------------------------


def kernel_build(*loaders: Callable[[], object], **kw: object) -> object:
    """A kiln_llm.KernelBuild whose two loaders are `loaders` instead of lab 4's and lab 5's builds."""
    from kiln_llm import KernelBuild

    build = KernelBuild(**kw)  # type: ignore[arg-type]
    build._loaders = loaders  # type: ignore[attr-defined]
    return build


def test_kernel_build_runs_both_loaders_on_other_threads_at_low_priority() -> None:
    import threading

    seen: list[tuple[str, int | None]] = []
    done: list[float] = []
    both = threading.Barrier(2, timeout=20)  # broken (an error wait() raises) unless the two run at once
    caller = threading.get_native_id()

    def loader(name: str) -> Callable[[], None]:
        def load() -> None:
            assert threading.get_native_id() != caller
            nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) if hasattr(os, "getpriority") else None
            both.wait()
            seen.append((name, nice))

        return load

    build = kernel_build(loader("lab5"), loader("lab4"), on_done=lambda b: done.append(b.seconds()))
    assert not build.running and build.seconds() == 0.0  # nothing starts before start()
    build.start()
    build.wait(every=0.01, tick=lambda b: None)
    assert not build.running
    assert sorted(name for name, _ in seen) == ["lab4", "lab5"]
    assert done == [build.seconds()] and build.seconds() > 0
    if sys.platform == "linux":  # nice is per thread there, and a thread it starts inherits it
        assert all(nice == min(19, os.getpriority(os.PRIO_PROCESS, 0) + build.NICE) for _, nice in seen), seen
    build.wait()  # again: returns at once


def test_kernel_build_raises_a_loaders_error_on_the_waiting_thread() -> None:
    from kiln.runtime import KilnRunError

    def broken() -> None:
        raise KilnRunError("building kiln_llm's kernels (llama.cu) failed: llama.cu(3): error: oops")

    done: list[object] = []
    build = kernel_build(broken, lambda: None, on_done=done.append)
    with pytest.raises(KilnRunError, match="oops"):
        build.wait()  # starts it too
    assert done == []


def test_training_lines_say_the_kernels_compile_alongside() -> None:
    from llama.generate import _training_log

    lines: list[str] = []

    class Building:
        running = True

        def seconds(self) -> float:
            return 12.0

    say = _training_log(lines.append, Building())  # type: ignore[arg-type]
    assert say is not None
    say("step    50/600  loss 2.345  (16 s, about 26 s left)")
    say("lab5: saved /x/tiny-llama (loss 0.562, 40 s)")
    assert lines[0].startswith("step    50/600  loss 2.345  (16 s, about 26 s left); CUDA kernels compiling")
    assert "(12 s)" in lines[0]
    assert lines[1] == "lab5: saved /x/tiny-llama (loss 0.562, 40 s)"  # bench_llama.py reads this one
    Building.running = False
    say("step   600/600  loss 0.562  (36 s)")
    assert lines[2] == "step   600/600  loss 0.562  (36 s)"
    assert _training_log(None, Building()) is None  # type: ignore[arg-type]
    log = lines.append
    assert _training_log(log, None) is log  # on the CPU: nothing compiles


def test_split_compilation_builds_and_is_part_of_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """lab 5's kernels are built with nvcc's split compilation where the toolkit has it: the flags
    compile and link, and a library built with them is not taken for one built without."""
    from grader import paths, toolchain
    from grader.build import shared_library, split_compile_flags

    try:
        toolchain.find_nvcc()
    except toolchain.ToolchainError:
        pytest.skip("no nvcc here")
    monkeypatch.setattr(paths, "BUILD", tmp_path / "build")
    src = tmp_path / "k.cu"
    src.write_text(
        '#include "course.h"\n__global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }\n'
        "COURSE_API cudaError_t run_twice(float* x, cudaStream_t s) {\n"
        "    twice<<<1, 32, 0, s>>>(x);\n    return cudaGetLastError();\n}\n"
    )
    flags = split_compile_flags()
    assert not flags or flags[0] == "--split-compile=0", flags
    plain = shared_library("k", [src], group="t", stem="k")
    split = shared_library("k", [src], group="t", stem="k", split_compile=True)
    assert split.is_file() and plain.is_file()
    assert (split == plain) == (not flags), "the flags are part of the build's key"
