"""Trains the embedded tiny LLaMA on the repo's own stories and saves it as a Hugging Face checkpoint.

    python lab5/tiny/train.py [--steps N] [--out DIR]

makes (default lab5/models/tiny-llama/):
    config.json, generation_config.json, model.safetensors   a transformers LlamaForCausalLM, float32
    tokenizer.json, tokenizer_config.json                   byte-level BPE with <s> (bos) and </s> (eos)
    tiny.json                                               how it was made: corpus, steps, losses, time

The model is small on purpose (4 layers, dim 128, 4 query heads sharing 2 KV heads, so lab 5's grouped-
query attention path runs) and the corpus is a small grammar (tiny.corpus), so a few minutes on two CPU
cores give a model whose greedy output is grammatical sentences, not noise. Everything is seeded and
runs single-process on the CPU with deterministic kernels, so a clone retrains the same weights.

`ensure_tiny_model()` trains only when the directory is missing or incomplete; lab 5's `generate` calls
it when no model is given.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `tiny` importable the way the tests import it
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tiny.corpus import STORY_SEPARATOR, corpus

__all__ = [
    "DEFAULT_DIR",
    "REQUIRED_FILES",
    "TrainConfig",
    "TrainResult",
    "ensure_tiny_model",
    "is_usable",
    "main",
    "train",
]

DEFAULT_DIR = Path(__file__).resolve().parents[1] / "models" / "tiny-llama"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
BOS, EOS, UNK = "<s>", "</s>", "<unk>"
PROMPT = "Once upon a time"
FIX = "python lab5/tiny/train.py"

Log = Callable[[str], None]


@dataclass(frozen=True)
class TrainConfig:
    """Everything that decides the weights. The defaults are the embedded model; tests shrink them."""

    steps: int = 600
    n_stories: int = 6000  # about 1.3 MB of text; the held-out stories come from seed + 1
    seed: int = 0
    vocab_size: int = 512  # BPE target; the corpus has ~210 words, so most become single tokens
    dim: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2  # grouped-query attention: two query heads share each KV head
    hidden_dim: int = 352  # SwiGLU width, about 8/3 * dim rounded to a multiple of 32 as LLaMA does
    context: int = 128
    batch_size: int = 32
    lr: float = 3e-3
    warmup: int = 30
    weight_decay: float = 0.01
    log_every: int = 50
    eval_batches: int = 8
    # "auto": the GPU when torch sees one (seconds), else the CPU (minutes). Each gives its own
    # weights, the same every time on one kind of device: the README's sample is the CPU's
    device: str = "auto"

    def chosen_device(self) -> str:
        import torch

        if self.device != "auto":
            return self.device
        return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass
class TrainResult:
    out: Path
    seconds: float
    losses: list[tuple[int, float]] = field(default_factory=list)  # (step, training loss)
    final_loss: float = math.nan  # mean training loss over the last log_every steps
    eval_loss: float = math.nan  # on stories the model never saw
    sample: str = ""  # greedy continuation of PROMPT
    # where the seconds went, in order: "imports" (transformers), "text" (corpus, tokenizer, token
    # streams), "model" (made and on its device), "steps", "evaluation" (held-out loss, sample), "save"
    phases: dict[str, float] = field(default_factory=dict)


# --- tokenizer ---------------------------------------------------------------------------------------


def train_tokenizer(text: str, vocab_size: int) -> Any:
    """A byte-level BPE (the GPT-2 / LLaMA 3 kind: any byte sequence encodes, no unknown tokens) on text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tk = Tokenizer(models.BPE(unk_token=None))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[UNK, BOS, EOS],  # ids 0, 1, 2 as in LLaMA 2
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, so nothing is unencodable
        show_progress=False,
    )
    tk.train_from_iterator(text.split(STORY_SEPARATOR), trainer=trainer)
    # like LLaMA 2's tokenizer, encoding with special tokens puts <s> first (lab 5 adds it itself)
    tk.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, tk.token_to_id(BOS))])
    return tk


def encode_stories(tk: Any, text: str) -> list[int]:
    """One token stream: <s> story </s> <s> story </s> ..., so the model learns where stories start and end."""
    bos, eos = tk.token_to_id(BOS), tk.token_to_id(EOS)
    ids: list[int] = []
    for enc in tk.encode_batch(text.split(STORY_SEPARATOR), add_special_tokens=False):
        ids += [bos, *enc.ids, eos]
    return ids


# --- model -------------------------------------------------------------------------------------------


def build_model(cfg: TrainConfig, vocab_size: int, bos_id: int, eos_id: int) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=cfg.dim,
        intermediate_size=cfg.hidden_dim,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads,
        max_position_embeddings=cfg.context,  # trained on this many positions; longer is extrapolation
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,  # separate output matrix, as in LLaMA 2
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=None,
        attention_bias=False,
        mlp_bias=False,
        initializer_range=0.02,
    )
    return LlamaForCausalLM(config)


def _lr(step: int, cfg: TrainConfig) -> float:
    # linear warm-up, then cosine decay to a tenth: the usual small-GPT schedule, robust at this size
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def _starts(data: Any, cfg: TrainConfig, gen: Any) -> Any:
    """Where one batch's rows begin in data: batch_size offsets drawn with gen (a CPU generator)."""
    import torch

    return torch.randint(0, data.numel() - cfg.context - 1, (cfg.batch_size,), generator=gen)


def _rows(data: Any, starts: Any, cfg: TrainConfig) -> tuple[Any, Any]:
    """The batch whose rows begin at starts (on data's device): inputs and next-token targets."""
    import torch

    rows = data[starts[:, None] + torch.arange(cfg.context + 1, device=data.device)]  # (B, context + 1)
    return rows[:, :-1], rows[:, 1:]


def _batch(data: Any, cfg: TrainConfig, gen: Any) -> tuple[Any, Any]:
    return _rows(data, _starts(data, cfg, gen).to(data.device), cfg)


def _loss(model: Any, x: Any, y: Any) -> Any:
    from torch.nn import functional

    logits = model(input_ids=x).logits
    return functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def greedy(model: Any, tk: Any, prompt: str, max_new_tokens: int = 100) -> str:
    """The prompt and its greedy continuation, stopping at </s> or the trained context."""
    import torch

    eos = tk.token_to_id(EOS)
    ids = [tk.token_to_id(BOS), *tk.encode(prompt, add_special_tokens=False).ids]
    limit = model.config.max_position_embeddings
    model.eval()
    with torch.no_grad():
        for _ in range(max_new_tokens):
            if len(ids) >= limit:
                break
            nxt = int(model(input_ids=torch.tensor([ids], device=model.device)).logits[0, -1].argmax())
            if nxt == eos:
                break
            ids.append(nxt)
    return str(tk.decode(ids[1:], skip_special_tokens=True))


# --- training ----------------------------------------------------------------------------------------


def _threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))  # the cores this process may use, not the machine's
    except AttributeError:  # pragma: no cover - macOS
        return max(1, os.cpu_count() or 1)


def train(
    cfg: TrainConfig | None = None, out: str | os.PathLike[str] = DEFAULT_DIR, log: Log | None = None
) -> TrainResult:
    """Trains the tokenizer and the model under cfg and writes the checkpoint directory out.

    The directory appears whole or not at all: files are written to a temporary sibling and renamed,
    so an interrupted run never leaves a half checkpoint that ensure_tiny_model() would accept."""
    import torch

    cfg = cfg or TrainConfig()
    say = log or (lambda _msg: None)
    out = Path(out)
    t0 = time.perf_counter()
    # seeds, threads and deterministic kernels are process-wide: set them for this run, then put them back
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    filling = torch.utils.deterministic.fill_uninitialized_memory
    cuda = cfg.chosen_device() == "cuda"
    # on a GPU one CPU thread queues the work and the other cores stay free (make generate compiles
    # its kernels on them meanwhile); the CPU's own training takes every core this process may use
    torch.set_num_threads(1 if cuda else _threads())
    # on a GPU, cuBLAS is deterministic only with a fixed workspace, which must be set before its
    # first handle; where it is too late, the run is not bit-reproducible but still right
    if cuda:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=cuda)
    # deterministic mode also fills every new tensor with NaN, a kernel per allocation, against
    # reads of memory nothing wrote; no op here reads such memory, so the fill changes no result
    torch.utils.deterministic.fill_uninitialized_memory = False
    try:
        with torch.random.fork_rng(devices=[0] if cuda else []):
            torch.manual_seed(cfg.seed)
            return _train(cfg, out, say, t0)
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
        torch.utils.deterministic.fill_uninitialized_memory = filling


def _train(cfg: TrainConfig, out: Path, say: Log, t0: float) -> TrainResult:
    import torch
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: F401 (build_model's too: timed here)
    from transformers.utils import logging as hf_logging

    result = TrainResult(out=out, seconds=0.0)
    lap = [t0]

    def phase(name: str) -> None:  # the seconds since the last phase ended, as phase `name`
        now = time.perf_counter()
        result.phases[name] = now - lap[0]
        lap[0] = now

    phase("imports")
    text = corpus(cfg.n_stories, cfg.seed)
    tk = train_tokenizer(text, cfg.vocab_size)
    device = cfg.chosen_device()
    # the token streams live where the model does: a batch is one gather there, not a copy per step
    data = torch.tensor(encode_stories(tk, text), dtype=torch.long, device=device)
    held_out = torch.tensor(
        encode_stories(tk, corpus(max(cfg.n_stories // 20, 50), cfg.seed + 1)), dtype=torch.long, device=device
    )
    phase("text")
    bos_id, eos_id = tk.token_to_id(BOS), tk.token_to_id(EOS)
    model = build_model(cfg, tk.get_vocab_size(), bos_id, eos_id).to(device)
    phase("model")
    n_params = sum(p.numel() for p in model.parameters())
    where = "the GPU" if device == "cuda" else f"{torch.get_num_threads()} CPU threads"
    took = ", ".join(f"{k} {v:.1f} s" for k, v in result.phases.items())
    say(
        f"corpus {len(text) / 1e6:.2f} MB, {data.numel():,} tokens, vocab {tk.get_vocab_size()}; "
        f"model {n_params / 1e6:.2f} M parameters; {cfg.steps} steps on {where} "
        f"(set up in {sum(result.phases.values()):.0f} s: {took})"
    )

    # no weight decay on norms (1-D): shrinking their gains only fights the normalization
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
    )
    # every batch's offsets drawn up front from the seeded CPU generator, the same numbers in the same
    # order as one draw per step, and sent to the device once: a step then never waits for the host
    gen = torch.Generator().manual_seed(cfg.seed)
    starts = torch.stack([_starts(data, cfg, gen) for _ in range(cfg.steps)]).to(device) if cfg.steps else None
    window_size = max(1, cfg.log_every)
    pending: list[Any] = []  # this stretch's losses, still on the device: read at each progress line
    model.train()
    started = lap[0]
    for step in range(cfg.steps):
        for group in opt.param_groups:
            group["lr"] = _lr(step, cfg)
        x, y = _rows(data, starts[step], cfg)
        loss = _loss(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        pending.append(loss.detach())
        if (step + 1) % cfg.log_every == 0 or step == cfg.steps - 1:
            # the one wait for the GPU in a stretch of steps: reading a loss after each step would
            # keep the host from queueing the next step while the GPU runs this one
            first = len(result.losses)
            result.losses += [(first + i, v) for i, v in enumerate(torch.stack(pending).tolist())]
            pending.clear()
            window = [v for _, v in result.losses[-window_size:]]
            mean, elapsed = sum(window) / len(window), time.perf_counter() - t0
            left = (time.perf_counter() - started) / (step + 1) * (cfg.steps - step - 1)
            rest = f", about {left:.0f} s left" if step + 1 < cfg.steps else ""
            say(f"step {step + 1:5d}/{cfg.steps}  loss {mean:.3f}  ({elapsed:.0f} s{rest})")
    window = [v for _, v in result.losses[-window_size:]]
    result.final_loss = sum(window) / len(window) if window else math.nan
    phase("steps")

    # the held-out loss and the sample on the training device: a GPU does them in a second or two,
    # where on an H200 machine 40 s passed between the last step and the saved model with them on its
    # CPU. Then the weights go to the CPU to be saved, in float32
    model.eval()
    eval_gen = torch.Generator().manual_seed(cfg.seed + 1)
    with torch.no_grad():
        evals = [float(_loss(model, *_batch(held_out, cfg, eval_gen))) for _ in range(cfg.eval_batches)]
    result.eval_loss = sum(evals) / len(evals)
    result.sample = greedy(model, tk, PROMPT)
    model = model.to("cpu")
    phase("evaluation")

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        bar = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # a progress bar for one small file is only noise in the log
        try:
            model.save_pretrained(tmp)  # config.json, generation_config.json, model.safetensors
        finally:
            if bar:
                hf_logging.enable_progress_bar()
        wrapped = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=BOS, eos_token=EOS, unk_token=UNK)
        wrapped.save_pretrained(tmp)  # tokenizer.json and tokenizer_config.json naming bos/eos
        # transformers 5 records its own class name, which 4.x cannot resolve; the fast class loads in both
        side = tmp / "tokenizer_config.json"
        side_cfg = json.loads(side.read_text(encoding="utf-8"))
        side_cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
        side.write_text(json.dumps(side_cfg, indent=2) + "\n", encoding="utf-8")
        phase("save")
        result.seconds = time.perf_counter() - t0
        record = {
            "made_by": FIX,
            "config": asdict(cfg),
            "seconds": round(result.seconds, 1),
            "phases": {k: round(v, 1) for k, v in result.phases.items()},
            "final_loss": round(result.final_loss, 4),
            "eval_loss": round(result.eval_loss, 4),
            "sample": result.sample,
            "losses": [[s, round(v, 4)] for s, v in result.losses[:: max(1, cfg.log_every // 5)]],
        }
        (tmp / "tiny.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        # mkdtemp (and the safetensors writer) make owner-only files; a shared checkout needs them readable
        tmp.chmod(0o755)
        for f in tmp.iterdir():
            f.chmod(0o644)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return result


# --- the default model -------------------------------------------------------------------------------


def is_usable(directory: str | os.PathLike[str] = DEFAULT_DIR) -> bool:
    """Whether directory holds every file of a checkpoint (train() writes them all or none)."""
    folder = Path(directory)
    return all((folder / name).is_file() and (folder / name).stat().st_size > 0 for name in REQUIRED_FILES)


def _stderr(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def ensure_tiny_model(
    directory: str | os.PathLike[str] | None = None,
    log: Log | None = _stderr,
    on_train: Callable[[], None] | None = None,
) -> Path:
    """The embedded model's directory, trained first if it is missing or incomplete (once across processes).

    A lock file beside the directory makes a second process wait for the first one's model instead of
    training too. Says what it is making and where through log (stderr by default; None for silence).
    `on_train()` is called once training is decided, after that line and before the first step (lab
    5's generate starts compiling its CUDA kernels then, to run alongside)."""
    folder = Path(directory) if directory is not None else DEFAULT_DIR
    if is_usable(folder):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with (folder.parent / f".{folder.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if is_usable(folder):
            return folder  # another process trained it while we waited
        say = log or (lambda _msg: None)
        cfg = TrainConfig()
        how = "on the GPU, under a minute" if cfg.chosen_device() == "cuda" else "on the CPU, a few minutes"
        say(
            f"lab5: no model given and the embedded tiny LLaMA is missing from {folder}; training it now on the "
            f"repo's own stories ({cfg.steps} steps {how}, once; `{FIX}` does the same)"
        )
        if on_train is not None:
            on_train()
        result = train(cfg, folder, log)
        say(f"lab5: saved {folder} (loss {result.final_loss:.3f}, {result.seconds:.0f} s)")
    return folder


def main(argv: list[str] | None = None) -> int:
    defaults = TrainConfig()
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--steps", type=int, default=defaults.steps, help=f"optimizer steps (default {defaults.steps})")
    ap.add_argument("--out", type=Path, default=DEFAULT_DIR, help=f"checkpoint directory (default {DEFAULT_DIR})")
    ap.add_argument("--stories", type=int, default=defaults.n_stories, help="stories in the training corpus")
    ap.add_argument("--seed", type=int, default=defaults.seed)
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="auto: the GPU when there is one")
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error("--steps must be at least 1")
    cfg = replace(defaults, steps=args.steps, n_stories=args.stories, seed=args.seed, device=args.device)
    result = train(cfg, args.out, print)
    print(f"final loss {result.final_loss:.3f} (held-out {result.eval_loss:.3f}) in {result.seconds:.0f} s")
    print(f"sample (greedy): {result.sample}")
    print(f"saved {result.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
