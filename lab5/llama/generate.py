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
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .model import LlamaModel

__all__ = ["GenerateResult", "LoopResult", "Sampler", "decode_loop", "generate", "main"]

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
        raise NotImplementedError("lab5/06: Sampler.distribution")  # ~
        # TODO(lab5/06) end

    def __call__(self, logits: torch.Tensor) -> int:
        """One token id drawn from distribution(logits) with self.generator (the arg-max when greedy)."""
        # TODO(lab5/06) begin: greedy arg-max, else one seeded draw (~3 lines); see the chapter's section "Sampling"
        raise NotImplementedError("lab5/06: Sampler.__call__")  # ~
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
    raise NotImplementedError("lab5/06: decode_loop")  # ~
    # TODO(lab5/06) end


# --- generate: loading, streaming and statistics (given) --------------------------------------------


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
    raise FileNotFoundError(f"{model_path}: no tokenizer.json or tokenizer.bin in {folder}; pass one with --tokenizer")


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
    prefilled once untimed first, so that compiling its executor is not counted as prefill time."""
    from .checkpoint import load
    from .model import LlamaModel
    from .tokenizer import load_tokenizer

    say = log or (lambda _msg: None)
    if model_path is None:
        if str(LAB) not in sys.path:
            sys.path.insert(0, str(LAB))  # `tiny` lives beside `llama`
        from tiny.train import ensure_tiny_model

        model_path = str(ensure_tiny_model(log=log))
    device = device or default_device()
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device='cuda' but torch sees no CUDA GPU; use device='cpu'")
    if device == "cpu":
        say("running on the CPU (kiln's CPU executor): expect a few tokens per second on a large model")

    path = Path(model_path)
    config, weights = load(path, dtype=dtype, progress=_loading(path, say))
    tok = load_tokenizer(tokenizer_path or find_tokenizer(path), config.vocab_size)
    if tok.vocab_size > config.vocab_size:
        raise ValueError(f"the tokenizer has {tok.vocab_size} tokens but the model only {config.vocab_size}")
    ids = tok.encode(prompt, bos=tok.bos_id is not None)
    if not ids:
        raise ValueError("the prompt is empty and the tokenizer has no BOS token to start from")
    room = config.max_seq_len - len(ids)
    if room <= 0:
        raise ValueError(f"the prompt is {len(ids)} tokens; the model's context is {config.max_seq_len}")
    if max_new_tokens > room:
        say(f"stopping at the model's context of {config.max_seq_len} tokens: {room} new tokens at most")
        max_new_tokens = room

    on_gpu = device == "cuda"
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    model = LlamaModel(
        config, weights, device=device, max_seq=len(ids) + max_new_tokens, fuse=fuse, use_graph=use_graph
    )
    del weights  # the model holds what it needs (on the GPU: its own copy)
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    if on_gpu:
        model.prefill(ids, last=True)  # compiles (and captures) the executor of this prompt length, untimed
        model.reset()

    # the stream decoder sees the prompt first, so that the first new word keeps its leading space
    stream = tok.stream()
    for i in ids:
        stream.push(i)
    pieces: list[str] = []

    def on_token(token: int) -> None:
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


def use_solutions(packages: Sequence[str] = ("../lab4/kiln", "kiln_llm", "llama")) -> None:
    """Makes `import llama`, `kiln_llm` and `kiln` find the reference solutions from now on.

    `tiny` is not staged: it trains the embedded model into lab5/models/ beside itself, and a staged
    copy would train a second one in a temporary folder."""
    root = str(LAB.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    from grader.staging import use_packages

    use_packages(LAB, list(packages), solutions=True)
    # the lab's own copies may be imported already (this module is one): forget them
    tops = {Path(p).name for p in packages}
    for name in list(sys.modules):
        if name.partition(".")[0] in tops:
            del sys.modules[name]


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
    return ap


def run(args: argparse.Namespace) -> int:
    shown = [False]

    def show(piece: str) -> None:
        if not shown[0]:  # the prompt goes out with the first piece, after whatever loading logged
            sys.stdout.write(args.prompt)
            shown[0] = True
        sys.stdout.write(piece)
        sys.stdout.flush()

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
    show("")  # the prompt, if no text came
    memory = f"GPU memory {_gib(r.gpu_memory_bytes)}" if r.gpu_memory_bytes else "no GPU memory"
    print(
        f"\n[{r.device}] prompt {len(r.prompt_tokens)} tokens, prefill {r.prefill_tokens_per_s:.1f} tok/s; "
        f"{len(r.tokens)} new tokens, decode {r.decode_tokens_per_s:.1f} tok/s; {memory}"
        + ("; stopped at EOS" if r.stopped_at_eos else "")
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.max_new_tokens < 1:
        parser().error("--max-new-tokens must be at least 1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for folder in (LAB.parent, LAB):  # the grader builds the CUDA kernels; `tiny` lives beside `llama`
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    if args.solutions:
        use_solutions()
        from llama.generate import run as run_solutions  # the staged reference of this very module

        return run_solutions(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
