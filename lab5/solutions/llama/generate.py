"""Lab 5 task 06 · text generation: sampling, the generation loop, its timings and a command line.

Implement: `Sampler.distribution` and `Sampler.__call__` (greedy, temperature, top-p, seeded), and
           `decode_loop` (prefill the prompt, then one decode step per new token), in the TODO
           regions. The chapter's sections "Sampling" and "The generation loop" explain them.
Contract:  `Sampler(temperature, top_p, seed)`: `distribution(logits)` is the probability vector the
           next token is drawn from: one-hot on the first arg-max when temperature == 0; otherwise
           softmax(logits / temperature) in float32, and with top_p < 1 only the nucleus kept: the
           smallest set of tokens, taken by descending probability, whose mass reaches top_p,
           renormalised to sum to 1. `sampler(logits)` returns one token id drawn from it with
           torch.multinomial and the sampler's own torch.Generator (seeded from `seed`), so a run
           is reproducible: the same seed gives the same tokens.
           `decode_loop(model, prompt_ids, sampler, max_new_tokens=, eos_id=, on_token=, sync=)`
           runs `model.prefill(prompt_ids)` once, then alternates sampling and `model.decode(token)`;
           it stops at eos_id (which is not returned) or after max_new_tokens tokens, and never
           calls decode for a token it will not use. It calls on_token(id) for every returned
           token as soon as it is chosen, and times prefill and the decode steps apart, calling
           sync() before each reading of clock() (torch.cuda.synchronize on a GPU; clock is
           time.perf_counter unless a test passes its own).
           `generate(...)` (given) loads the model and the tokenizer, calls decode_loop and streams
           the text; `main` is the command line.
Test:      make test-lab5 TASK=06

    python -m llama.generate --prompt "Once upon a time"          # from lab5/; the embedded tiny model
    python -m llama.generate --model ~/models/llama2-7b --prompt "..." --max-new-tokens 64

The command line (`make generate`) answers an unusable model, or a task of labs 4 and 5 that the run
needs and that is not done yet, with a line that says so and exit status 2 or 1 (`--traceback` shows
the error whole instead); `--solutions` runs the reference solutions of every task.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .checkpoint import CheckpointError
from .config import ConfigError
from .tokenizer import TokenizerError

if TYPE_CHECKING:
    from kiln_llm import KernelBuild

    from .model import LlamaModel

__all__ = ["GenerateError", "GenerateResult", "LoopResult", "Sampler", "decode_loop", "generate", "main"]

LAB = Path(__file__).resolve().parents[1]  # lab5/ (or the staged copy of it)
Log = Callable[[str], None]


# --- sampling ------------------------------------------------------------------------------------


class Sampler:
    """Chooses the next token from a row of logits: greedy, or drawn with temperature and top-p."""

    def __init__(self, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0) -> None:
        if not temperature >= 0.0:  # also refuses NaN
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {temperature}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1 keeps every token), got {top_p}")
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.seed = seed
        # a generator of our own: the draws depend on the seed only, not on what else used torch's RNG
        self.generator = torch.Generator().manual_seed(seed)

    def distribution(self, logits: torch.Tensor) -> torch.Tensor:
        """The float32 probabilities [V] the next token is drawn from (logits: [V], any float dtype)."""
        # TODO(lab5/06) begin: one-hot, or softmax(l/T) cut to top-p (~15 lines); see the chapter's section "Sampling"
        logits = logits.detach().to("cpu", torch.float32).reshape(-1)  # (V,)
        if self.temperature == 0.0:
            probs = torch.zeros_like(logits)
            probs[torch.argmax(logits)] = 1.0  # argmax takes the first of equal maxima, as HF's greedy does
            return probs
        probs = torch.softmax(logits / self.temperature, dim=-1)
        if self.top_p >= 1.0:
            return probs
        sorted_p, order = torch.sort(probs, descending=True)
        # token i (by rank) is in the nucleus when the mass before it has not reached top_p yet:
        # that keeps the smallest prefix whose mass reaches top_p (and always the most likely token)
        before = torch.cumsum(sorted_p, dim=0) - sorted_p
        kept = torch.where(before < self.top_p, sorted_p, torch.zeros_like(sorted_p))
        out = torch.zeros_like(probs)
        out[order] = kept
        return out / out.sum()
        # ~ raise NotImplementedError("lab5/06: Sampler.distribution")
        # TODO(lab5/06) end

    def __call__(self, logits: torch.Tensor) -> int:
        """One token id drawn from distribution(logits) with self.generator (the arg-max when greedy)."""
        # TODO(lab5/06) begin: greedy arg-max, else one seeded draw (~3 lines); see the chapter's section "Sampling"
        if self.temperature == 0.0:
            # no draw: greedy decoding leaves the generator untouched
            return int(torch.argmax(logits.detach().to("cpu", torch.float32).reshape(-1)))
        return int(torch.multinomial(self.distribution(logits), 1, generator=self.generator))
        # ~ raise NotImplementedError("lab5/06: Sampler.__call__")
        # TODO(lab5/06) end


# --- the generation loop ---------------------------------------------------------------------------


@dataclass
class LoopResult:
    """What decode_loop returns: the new tokens (EOS not included) and the time spent in the model."""

    tokens: list[int] = field(default_factory=list)
    prefill_seconds: float = 0.0  # the one model.prefill call
    decode_seconds: float = 0.0  # all model.decode calls together
    decode_steps: int = 0  # how many model.decode calls
    stopped_at_eos: bool = False


def decode_loop(
    model: LlamaModel,
    prompt_ids: Sequence[int],
    sampler: Sampler,
    *,
    max_new_tokens: int,
    eos_id: int | None,
    on_token: Callable[[int], None] | None = None,
    sync: Callable[[], None] = lambda: None,
    clock: Callable[[], float] = time.perf_counter,
) -> LoopResult:
    """Prefills prompt_ids (model.pos must be 0), then samples and decodes up to max_new_tokens tokens.

    The first new token comes from the prefill's last row of logits; each later one from
    model.decode(previous token). Returns the tokens and the seconds spent in prefill and in decode."""
    # TODO(lab5/06) begin: prefill, sample, stop, decode; time them (~25 lines); see "The generation loop"
    out = LoopResult()
    if max_new_tokens <= 0:
        return out
    sync()
    start = clock()
    logits = model.prefill(list(prompt_ids), last=True)  # (V,): the last position predicts the next token
    sync()
    out.prefill_seconds = clock() - start
    while True:
        token = sampler(logits)
        if eos_id is not None and token == eos_id:
            out.stopped_at_eos = True
            break
        out.tokens.append(token)
        if on_token is not None:
            on_token(token)
        if len(out.tokens) == max_new_tokens:
            break  # no decode for a token nobody will read
        sync()
        start = clock()
        logits = model.decode(token)  # (V,)
        sync()
        out.decode_seconds += clock() - start
        out.decode_steps += 1
    return out
    # ~ raise NotImplementedError("lab5/06: decode_loop")
    # TODO(lab5/06) end


# --- generate: loading, streaming and statistics (given) --------------------------------------------


class GenerateError(ValueError):
    """A run that cannot start as asked: no tokenizer beside the model, a prompt the model cannot
    take, a device that is not there. The command line says it in one line, as it does a
    CheckpointError, ConfigError or TokenizerError."""


@dataclass
class GenerateResult:
    """One generation: the new text and tokens (the prompt's not included) and how fast it went."""

    text: str
    tokens: list[int]
    prefill_tokens_per_s: float
    decode_tokens_per_s: float  # 0.0 when no decode step ran (a single new token, or EOS at once)
    gpu_memory_bytes: int  # torch.cuda.max_memory_allocated during the run; 0 on the CPU
    device: str  # "cpu", or "cuda (<the GPU's name>)"
    prompt_tokens: list[int] = field(default_factory=list)
    stopped_at_eos: bool = False


def find_tokenizer(model_path: Path) -> Path:
    """A checkpoint directory holds its tokenizer; a llama2.c .bin has tokenizer.bin (or .json) beside it."""
    folder = model_path if model_path.is_dir() else model_path.parent
    for name in ("tokenizer.json", "tokenizer.bin"):
        if (folder / name).is_file():
            return folder / name
    raise GenerateError(f"{model_path}: no tokenizer.json or tokenizer.bin in {folder}; pass one with --tokenizer")


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def generate(
    model_path: str | None,
    prompt: str,
    *,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
    device: str | None = None,
    on_text: Callable[[str], None] | None = None,
    dtype: str | torch.dtype | None = None,
    tokenizer_path: str | None = None,
    log: Log | None = None,
    fuse: bool = True,
    use_graph: bool = True,
) -> GenerateResult:
    """Generates a continuation of prompt with the model at model_path (None: the embedded tiny model).

    The text goes to on_text piece by piece as tokens are chosen; what is returned is the whole of
    it, with the tokens and the speeds. Prefill and decode are timed apart: on a GPU the prompt is
    prefilled once untimed first, so that compiling its executor is not counted as prefill time.

    On a GPU, lab 4's and lab 5's kernels are built (nvcc, a minute the first time) or found built
    on other threads (kiln_llm.KernelBuild): while the tiny model trains, if it must, else while
    the GPU starts. With LAB5_TIMINGS=1 in the environment, log gets a line per phase."""
    from kiln_llm import KernelBuild

    from .checkpoint import load
    from .model import LlamaModel
    from .tokenizer import load_tokenizer

    say = log or (lambda _msg: None)
    mark = _timings(say)
    device = device or default_device()
    if device not in ("cpu", "cuda"):
        raise GenerateError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise GenerateError("device='cuda' but torch sees no CUDA GPU; use device='cpu'")
    on_gpu = device == "cuda"
    kernels = KernelBuild(on_done=_kernels_done(say)) if on_gpu else None
    if model_path is None:
        if str(LAB) not in sys.path:
            sys.path.insert(0, str(LAB))  # `tiny` lives beside `llama`
        from tiny.train import ensure_tiny_model

        def alongside() -> None:  # training is decided: nvcc gets the other cores meanwhile
            if kernels is not None:
                kernels.start()
                say("lab5: meanwhile lab 4's and lab 5's CUDA kernels are built (or found built) in the background")

        model_path = str(ensure_tiny_model(log=_training_log(log, kernels), on_train=alongside))
        mark("the tiny model is there")
    if device == "cpu":
        say("running on the CPU (kiln's CPU executor): expect a few tokens per second on a large model")

    path = Path(model_path)
    # a missing tokenizer is said before the weights load (13 GB of them for a 7B model); a missing
    # model is the loader's to say
    tok_path = tokenizer_path or (find_tokenizer(path) if path.exists() else None)
    config, weights = load(path, dtype=dtype, progress=_loading(path, say))
    tok = load_tokenizer(tok_path or find_tokenizer(path), config.vocab_size)
    if tok.vocab_size > config.vocab_size:
        raise GenerateError(f"the tokenizer has {tok.vocab_size} tokens but the model only {config.vocab_size}")
    ids = tok.encode(prompt, bos=tok.bos_id is not None)
    if not ids:
        raise GenerateError("the prompt is empty and the tokenizer has no BOS token to start from")
    room = config.max_seq_len - len(ids)
    if room <= 0:
        raise GenerateError(f"the prompt is {len(ids)} tokens; the model's context is {config.max_seq_len}")
    if max_new_tokens > room:
        say(f"stopping at the model's context of {config.max_seq_len} tokens: {room} new tokens at most")
        max_new_tokens = room
    mark("checkpoint and tokenizer loaded")

    if kernels is not None:
        kernels.start()  # nothing the user gave can fail from here on; a no-op if the training started it
        torch.cuda.reset_peak_memory_stats()  # starts CUDA on this thread while the kernels load on theirs
        mark("CUDA started")
        kernels.wait(every=1.0, tick=_compiling(say))
        mark("kernels loaded")
    model = LlamaModel(
        config, weights, device=device, max_seq=len(ids) + max_new_tokens, fuse=fuse, use_graph=use_graph
    )
    del weights  # the model holds what it needs (on the GPU: its own copy)
    mark("model compiled")
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    if on_gpu:
        model.prefill(ids, last=True)  # compiles (and captures) the executor of this prompt length, untimed
        model.reset()
        mark("the prompt's executor compiled and run once")

    # the stream decoder sees the prompt first, so that the first new word keeps its leading space
    stream = tok.stream()
    for i in ids:
        stream.push(i)
    pieces: list[str] = []
    first = [True]

    def on_token(token: int) -> None:
        if first[0]:
            first[0] = False
            mark("first token chosen")
        piece = stream.push(token)
        if piece:
            pieces.append(piece)
            if on_text is not None:
                on_text(piece)

    loop = decode_loop(
        model,
        ids,
        Sampler(temperature, top_p, seed),
        max_new_tokens=max_new_tokens,
        eos_id=tok.eos_id,
        on_token=on_token,
        sync=sync,
    )
    rest = stream.flush()
    if rest:
        pieces.append(rest)
        if on_text is not None:
            on_text(rest)
    mark(f"{len(loop.tokens)} tokens generated")
    return GenerateResult(
        text="".join(pieces),
        tokens=loop.tokens,
        prefill_tokens_per_s=len(ids) / loop.prefill_seconds if loop.prefill_seconds > 0 else 0.0,
        decode_tokens_per_s=loop.decode_steps / loop.decode_seconds if loop.decode_seconds > 0 else 0.0,
        gpu_memory_bytes=torch.cuda.max_memory_allocated() if on_gpu else 0,
        device=f"cuda ({torch.cuda.get_device_name()})" if on_gpu else "cpu",
        prompt_tokens=ids,
        stopped_at_eos=loop.stopped_at_eos,
    )


# --- the reference solutions, for --solutions (given) ---------------------------------------------


def use_solutions(packages: Sequence[str] = ("../lab4/kiln", "kiln_llm", "llama")) -> Path | None:
    """Makes `import llama`, `kiln_llm` and `kiln` find the reference solutions from now on.

    They are staged in .build/staged/lab5-solutions (returned), the same folder every run, so that
    a second run finds the kernels the first one built. `tiny` is not staged: it trains the
    embedded model into lab5/models/ beside itself, and a staged copy would train a second one."""
    root = str(LAB.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    from grader.staging import use_packages

    staged = use_packages(LAB, list(packages), solutions=True)
    # the lab's own copies may be imported already (this module is one): forget them
    tops = {Path(p).name for p in packages}
    for name in list(sys.modules):
        if name.partition(".")[0] in tops:
            del sys.modules[name]
    return staged


# --- tasks not done yet (given) ---------------------------------------------------------------------

# The task files a run executes, by device, named from lab5/ as the task specs name them: a TODO
# region still as given in one of them means the run cannot work (a NotImplementedError somewhere in
# the middle, or on a GPU an empty kernel's garbage), so the command line names the task first.
# The CPU runs lab 4's CPU executor and lab 5's CPU kernels; the GPU lab 4's planner, kernels and
# CUDA executor (capture.py for the CUDA graph), lab 5's kernels and fusion pass. Both run 05 and 06.
TASK_FILES = {
    "cpu": ("../lab4/kiln/cpu.py", "kiln_llm/cpu.py", "llama/model.py", "llama/generate.py"),
    "cuda": (
        "../lab4/kiln/planner.py",
        "../lab4/kiln/kernels/pointwise.cu",
        "../lab4/kiln/kernels/matmul.cu",
        "../lab4/kiln/kernels/layout.cu",
        "../lab4/kiln/cuda.py",
        "../lab4/kiln/capture.py",
        "kiln_llm/kernels/llama.cu",
        "kiln_llm/kernels/linear.cu",
        "kiln_llm/fusion.py",
        "llama/model.py",
        "llama/generate.py",
    ),
}
GRAPH_ONLY = ("../lab4/kiln/capture.py",)  # what --no-graph does not run


def solutions_hint(lab_dir: Path | None = None) -> str:
    """How to run the reference instead: only where a solutions/ folder exists (the instructors'
    repository); a student release has none, so there the hint is the grader's own command."""
    lab_dir = lab_dir or Path(__file__).resolve().parents[1]
    if (lab_dir / "solutions").is_dir():
        return "`make generate SOLUTIONS=1` runs the reference solutions"
    return "`make test-lab4` and `make test-lab5` say what each task still needs"


@dataclass
class NotDone:
    """One task the run needs whose file still has TODO regions as given."""

    lab: str  # "lab4"
    number: str  # "02"
    file: Path
    lines: list[int]  # where its untouched regions begin

    def line(self) -> str:
        more = f" and {len(self.lines) - 1} more TODO regions" if len(self.lines) > 1 else ""
        return (
            f"lab {self.lab[3:]} task {self.number} is not done yet: {_shown(self.file)}:{self.lines[0]}{more} "
            f"still as given (`make test-{self.lab} TASK={self.number}` grades it)"
        )


def _shown(path: Path) -> str:
    """A path from the repository root, as a student finds it."""
    try:
        return str(path.resolve().relative_to(LAB.parent))
    except ValueError:
        return str(path)


def not_done(device: str, *, use_graph: bool = True) -> list[NotDone]:
    """The tasks of labs 4 and 5 that a run on `device` needs and that are not done yet: files
    with a TODO region that holds nothing but its given stub lines (the grader's "untouched").
    Empty when the grader cannot be imported or a file's markers are broken: the run then finds
    out for itself (and a NotImplementedError is still answered in one line)."""
    try:
        from grader.paths import lab_file
        from grader.tasks.regions import RegionError, untouched_regions
    except ImportError:
        return []
    found: dict[tuple[str, str], NotDone] = {}
    for name in TASK_FILES[device]:
        if name in GRAPH_ONLY and not use_graph:
            continue
        home, inner = lab_file(LAB, name)
        path = home / inner
        try:
            regions = untouched_regions(path.read_text(encoding="utf-8"), str(path))
        except (OSError, UnicodeDecodeError, RegionError):
            continue
        for region in regions:
            lab, _, number = region.tag.partition("/")
            task = found.setdefault((lab, number), NotDone(lab, number, path, []))
            if task.file == path:
                task.lines.append(region.begin_line)
    return sorted(found.values(), key=lambda t: (int(t.lab[3:]), t.number))


def not_done_message(tasks: Sequence[NotDone]) -> str:
    hint = solutions_hint()
    return "\n".join([*(t.line() for t in tasks), f"{hint} instead." if "SOLUTIONS=1" in hint else f"{hint}."])


TAGGED = re.compile(r"^(?P<lab>lab\d+)/(?P<number>\d+)\b:?\s*(?P<what>.*)$", re.DOTALL)


def not_implemented_message(error: NotImplementedError) -> str | None:
    """The line for a stub that raised, `NotImplementedError("lab5/05: prefill")`; None for one
    without a task's tag (a bug, whose traceback is wanted)."""
    m = TAGGED.match(str(error))
    if m is None:
        return None
    frames = traceback.extract_tb(error.__traceback__)
    where = f" ({_shown(Path(frames[-1].filename))}:{frames[-1].lineno})" if frames else ""
    what = f": {m['what'].strip()}{where}" if m["what"].strip() else where
    grades = f"`make test-{m['lab']} TASK={m['number']}` grades yours"
    hint = solutions_hint()
    tail = f"{hint} ({grades})" if "SOLUTIONS=1" in hint else grades
    return f"lab {m['lab'][3:]} task {m['number']} is not done yet{what}; {tail}"


# --- the command line (given) ----------------------------------------------------------------------


def _loading(path: Path, say: Callable[[str], None]) -> Callable[[str, float], None]:
    """The loader's progress, told at every tenth of the way: a 13 GB checkpoint takes a while."""
    told = [-1]

    def progress(what: str, fraction: float) -> None:
        tenth = int(fraction * 10)
        if tenth > told[0]:
            told[0] = tenth
            say(f"loading {path.name}: {100 * fraction:3.0f}% ({what})")

    return progress


def _training_log(log: Log | None, kernels: KernelBuild | None) -> Log | None:
    """The tiny model's training lines, each step's saying too that the kernels compile meanwhile."""
    if log is None or kernels is None:
        return log

    def say(msg: str) -> None:
        if msg.startswith("step ") and kernels.running:
            msg += f"; CUDA kernels compiling alongside ({kernels.seconds():.0f} s)"
        log(msg)

    return say


def _compiling(say: Log) -> Callable[[KernelBuild], None]:
    """While generate waits for the kernels: a line at once, then one every 10 s."""
    told = [-math.inf]

    def tick(kernels: KernelBuild) -> None:
        if kernels.seconds() - told[0] >= 10:
            told[0] = kernels.seconds()
            say(f"lab5: waiting for lab 4's and lab 5's CUDA kernels to build ({told[0]:.0f} s so far)")

    return tick


def _kernels_done(say: Log) -> Callable[[KernelBuild], None]:
    def done(kernels: KernelBuild) -> None:
        if kernels.seconds() >= 2:  # a build, not a look-up of libraries already built
            say(f"lab5: CUDA kernels built in {kernels.seconds():.0f} s")

    return done


def _timings(say: Log) -> Callable[[str], None]:
    """mark(what): with LAB5_TIMINGS=1, a line of how many seconds after the process started
    `what` happened; a no-op otherwise."""
    if not os.environ.get("LAB5_TIMINGS"):
        return lambda _what: None
    start = time.perf_counter() - _process_age()

    def mark(what: str) -> None:
        say(f"lab5 timing: {time.perf_counter() - start:7.2f} s  {what}")

    mark("generate() called")
    return mark


def _process_age() -> float:
    """Seconds since this process started (Linux's /proc, to a hundredth); 0 where unknown."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m llama.generate", description="Generates text with lab 5's LLaMA on kiln."
    )
    ap.add_argument("--prompt", default="Once upon a time", help="the text to continue")
    ap.add_argument("--model", default=None, help="a Hugging Face directory or a llama2.c .bin (default: tiny)")
    ap.add_argument("--tokenizer", default=None, help="tokenizer.json or tokenizer.bin (default: beside the model)")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="stop after this many new tokens (default 128)")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default); 0.8 is usual for stories")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: keep this much probability mass")
    ap.add_argument("--seed", type=int, default=0, help="the sampler's seed (same seed, same text)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when there is a GPU")
    ap.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default=None, help="default: the file's")
    ap.add_argument("--no-fuse", action="store_true", help="compile without the fusion pass (task 04)")
    ap.add_argument("--no-graph", action="store_true", help="launch kernels one by one, no CUDA graph")
    ap.add_argument("--solutions", action="store_true", help="run the reference solutions, not your files")
    ap.add_argument("--traceback", action="store_true", help="show an unusable model's or a missing task's error whole")
    return ap


def run(args: argparse.Namespace) -> int:
    shown = [False]

    def show(piece: str) -> None:
        if not shown[0]:  # the prompt goes out with the first piece, after whatever loading logged
            sys.stdout.write(args.prompt)
            shown[0] = True
        sys.stdout.write(piece)
        sys.stdout.flush()

    try:
        r = generate(
            args.model,
            args.prompt,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            seed=args.seed,
            device=args.device,
            on_text=show,
            dtype=args.dtype,
            tokenizer_path=args.tokenizer,
            log=_stderr,
            fuse=not args.no_fuse,
            use_graph=not args.no_graph,
        )
    except (CheckpointError, ConfigError, TokenizerError, GenerateError) as e:
        # what the user gave cannot be used: the loaders' messages say what and where
        if getattr(args, "traceback", False):
            raise
        _stderr(f"{parser().prog}: error: {e}")
        return 2
    except NotImplementedError as e:
        # a stub the static check (not_done) could not see; in the reference solutions, a bug
        said = None if args.solutions or getattr(args, "traceback", False) else not_implemented_message(e)
        if said is None:
            raise
        _stderr(said)
        return 1
    show("")  # the prompt, if no text came
    memory = f"GPU memory {_gib(r.gpu_memory_bytes)}" if r.gpu_memory_bytes else "no GPU memory"
    print(
        f"\n[{r.device}] prompt {len(r.prompt_tokens)} tokens, prefill {r.prefill_tokens_per_s:.1f} tok/s; "
        f"{len(r.tokens)} new tokens, decode {r.decode_tokens_per_s:.1f} tok/s; {memory}"
        + ("; stopped at EOS" if r.stopped_at_eos else "")
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.max_new_tokens < 1:
        ap.error("--max-new-tokens must be at least 1")
    if not args.temperature >= 0.0:  # also refuses NaN
        ap.error(f"--temperature must be >= 0 (0 is greedy), got {args.temperature}")
    if not 0.0 < args.top_p <= 1.0:
        ap.error(f"--top-p must be in (0, 1] (1 keeps every token), got {args.top_p}")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # the grader builds the CUDA kernels; llama.model imports lab 4's kiln; `tiny` lives beside `llama`
    for folder in (LAB.parent, LAB.parent / "lab4", LAB):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    if args.solutions:
        use_solutions()
        from llama.generate import run as run_solutions  # the staged reference of this very module

        return run_solutions(args)
    if not args.traceback:
        missing = not_done(args.device or default_device(), use_graph=not args.no_graph)
        if missing:  # said before anything is loaded, or the tiny model trained
            _stderr(not_done_message(missing))
            return 1
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
