"""`make generate GPUS=N`: lab 5's text generation on a model split over N GPUs (given code).

    make generate GPUS=2                                     # the embedded tiny model on GPUs 0 and 1
    make generate GPUS=2 MODEL=~/models/llama2-7b PROMPT="..." STEPS=64
    PYTHONPATH=lab6 python -m kiln_tp.generate --world 2 [--device cpu] [lab 5's options]
    make generate GPUS=2 ARGS="--all-reduce own"           # your all-reduces of tasks 02 and 03, not NCCL

The same command line as lab 5's `python -m llama.generate` (prompt, model, sampling, --solutions,
--no-graph, ...) with --world N: N ranks started by kiln_tp.launch, rank r on GPU r, each holding
its share of the weights (task 05's shard_weights) in lab 5's CUDA executors, the all-reduces
lowered to NCCL (task 04), or with --all-reduce own to tasks 02 and 03's libraries
(kiln_tp.own_all_reduce: the one-shot for a decode step's rows, the ring for a prompt's), and
captured with the decode step. Every rank runs lab 5's decode_loop;
RankZeroSampler makes every rank feed rank 0's token, and rank 0 alone writes the text, as it is
chosen, to the same stdout; its statistics line follows once every rank is done. --device cpu runs
the ranks on the CPU instead (gloo, lab 4's CPU executor): slow, but no GPU needed.

Greedy (the default) prints the tokens one GPU prints, unless a step is a near tie: the ranks add
the same products in another order than one GPU (two partial sums per projection), so a logit moves
in its last bits, enough to swap two tokens whose logits are that close.

What cannot run is said in one line, before anything heavy starts: fewer GPUs than asked (with the
count seen), a model whose n_heads, n_kv_heads or hidden_dim does not divide by N (naming the
numbers), a task of labs 4 to 6 that the run needs and that is not done yet; then the exit status
is 2 (what the user gave) or 1 (a task not done, or a rank that failed, named with its error).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from kiln_tp.ipc import SOURCES

LAB = Path(__file__).resolve().parents[1]  # lab6/ (or the staged copy of it)
ROOT = LAB.parent
PROG = "python -m kiln_tp.generate"
SPLIT = ("n_heads", "n_kv_heads", "hidden_dim")  # what each rank gets an equal share of
# the lab 6 task files a run executes, by device (named from lab6/ as the task specs name them)
TASK_FILES = {"cpu": ("kiln_tp/shard.py",), "cuda": ("kiln_tp/shard.py", "kiln_tp/cuda.py")}
OWN_FILES = tuple(SOURCES.values())  # and with --all-reduce own, tasks 02 and 03
PACKAGES = ("kiln_tp", "../lab5/kiln_llm", "../lab5/llama", "../lab4/kiln")
TAGGED = re.compile(r"NotImplementedError: (?P<lab>lab\d+)/(?P<number>\d+):?\s*(?P<what>[^\n]*)")


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _on_path() -> None:
    """The grader (it builds the kernels), lab 4's kiln, lab 5's llama, kiln_llm and tiny, lab 6's kiln_tp."""
    for folder in (ROOT, ROOT / "lab4", ROOT / "lab5", LAB):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))


# --- what the user gave --------------------------------------------------------------------------


def read_config(path: Path, dtype: str | None) -> Any:
    """The model's LlamaConfig, read before any rank loads the weights: a Hugging Face directory's
    config.json alone; a llama2.c file loaded whole (its header is its config; such files are small)."""
    from llama.checkpoint import CheckpointError, load
    from llama.config import ConfigError, LlamaConfig

    cfg = path / "config.json"
    if path.is_dir() and cfg.is_file():
        try:
            return LlamaConfig.from_hf(json.loads(cfg.read_text(encoding="utf-8")))
        except (json.JSONDecodeError, UnicodeDecodeError, ConfigError) as e:
            raise CheckpointError(f"{cfg}: {e}") from e
    return load(path, dtype=dtype)[0]


def check_divisible(config: Any, world: int, what: str) -> None:
    """GenerateError naming the field, its value and the world when a rank would get no equal share."""
    from llama.generate import GenerateError

    for field in SPLIT:
        value = getattr(config, field)
        if value % world:
            raise GenerateError(
                f"the model's {field} = {value} is not divisible by {what}: tensor parallelism gives each rank "
                f"an equal share of the query heads, the kv heads and hidden_dim "
                f"({', '.join(f'{f} = {getattr(config, f)}' for f in SPLIT)})"
            )


def too_few_gpus(world: int) -> str:
    """Why GPUS=world cannot run here ("GPUS=2 needs 2 GPUs, ...; this machine shows 1"), or ""."""
    from kiln_tp.launch import gpus_visible

    seen = gpus_visible()
    if seen >= world:
        return ""
    narrowed = os.environ.get("CUDA_VISIBLE_DEVICES")
    return (
        f"GPUS={world} needs {world} GPUs, one rank on each; this machine shows {seen}"
        + (f" (CUDA_VISIBLE_DEVICES={narrowed})" if narrowed is not None else "")
        + ("; `--device cpu` (ARGS='--device cpu') runs the ranks on the CPU" if seen == 0 else "")
    )


def world_words(world: int, device: str) -> str:
    return f"GPUS={world}" if device == "cuda" else f"--world {world} (CPU ranks)"


# --- one rank --------------------------------------------------------------------------------------


def generate_rank(rank: int, world: int, spec: dict[str, Any]) -> dict[str, Any]:
    """What each rank of the launch runs: its share of the checkpoint in a TPLlamaModel, lab 5's
    decode_loop with rank 0's token broadcast; rank 0 writes the text to stdout as it comes and
    returns the tokens and the speeds."""
    from kiln_tp.model import RankZeroSampler, TPLlamaModel
    from kiln_tp.shard import shard_weights
    from llama.checkpoint import load
    from llama.generate import Sampler, decode_loop
    from llama.tokenizer import load_tokenizer

    device, ids = spec["device"], spec["ids"]
    on_gpu = device == "cuda"
    if spec["own_libs"]:  # before the model's executors are built: they lower all_reduce to them
        from kiln_tp.own_all_reduce import use_own_all_reduce

        use_own_all_reduce(spec["own_libs"]["ring"], spec["own_libs"]["one_shot"])
    config, weights = load(spec["model"], dtype=spec["dtype"])
    local_config, local_weights = shard_weights(config, weights, rank, world)
    del weights
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    model = TPLlamaModel(
        local_config,
        local_weights,
        device=device,
        max_seq=len(ids) + spec["max_new_tokens"],
        fuse=spec["fuse"],
        use_graph=spec["use_graph"],
    )
    del local_weights
    if on_gpu:  # the prompt's executor compiled and captured (every rank: its all-reduces meet), untimed
        model.prefill(ids, last=True)
        model.reset()
    shown = [False]
    stream = None
    if rank == 0:
        stream = load_tokenizer(spec["tokenizer"], config.vocab_size).stream()
        for i in ids:  # the prompt first, so that the first new word keeps its leading space
            stream.push(i)

    def show(piece: str) -> None:
        if not shown[0]:
            sys.stdout.write(spec["prompt"])
            shown[0] = True
        sys.stdout.write(piece)
        sys.stdout.flush()

    def on_token(token: int) -> None:
        if stream is not None:
            piece = stream.push(token)
            if piece:
                show(piece)

    sampler = RankZeroSampler(Sampler(spec["temperature"], spec["top_p"], spec["seed"]))
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    loop = decode_loop(
        model, ids, sampler, max_new_tokens=spec["max_new_tokens"], eos_id=spec["eos_id"], on_token=on_token, sync=sync
    )
    if stream is not None:
        rest = stream.flush()
        if rest:
            show(rest)
        show("")
    if spec["own_libs"]:  # every rank at once, nothing replays the model's graphs any more
        from kiln_tp.own_all_reduce import stop_own_all_reduce

        stop_own_all_reduce()
    return {
        "tokens": loop.tokens,
        "prefill_tokens_per_s": len(ids) / loop.prefill_seconds if loop.prefill_seconds > 0 else 0.0,
        "decode_tokens_per_s": loop.decode_steps / loop.decode_seconds if loop.decode_seconds > 0 else 0.0,
        "gpu_memory_bytes": torch.cuda.max_memory_allocated() if on_gpu else 0,
        "device": f"cuda ({torch.cuda.get_device_name()})" if on_gpu else "cpu",
        "stopped_at_eos": loop.stopped_at_eos,
    }


# --- the command line ------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    """lab 5's options, and --world."""
    from llama.generate import parser as lab5_parser

    ap = lab5_parser()
    ap.prog = PROG
    ap.description = "Generates text with lab 5's LLaMA split over several GPUs (lab 6's tensor parallelism)."
    ap.add_argument("--world", type=int, required=True, help="how many ranks (GPUs): make generate GPUS=N")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds before the ranks are ended (3600)")
    ap.add_argument(
        "--all-reduce",
        choices=("nccl", "own"),
        default="nccl",
        help="nccl: task 04's lowering (default); own: your ring and one-shot of tasks 02 and 03 (GPUs only)",
    )
    return ap


def not_done(device: str, *, use_graph: bool = True, own: bool = False) -> list[Any]:
    """Labs 4 and 5's tasks the run needs that are not done yet (llama.generate.not_done), then lab 6's
    (with `own`, tasks 02 and 03 too)."""
    from llama.generate import NotDone
    from llama.generate import not_done as lab45_not_done

    found = lab45_not_done(device, use_graph=use_graph)
    try:
        from grader.tasks.regions import RegionError, untouched_regions
    except ImportError:
        return found
    for name in TASK_FILES[device] + (OWN_FILES if own else ()):
        path = LAB / name
        try:
            regions = untouched_regions(path.read_text(encoding="utf-8"), str(path))
        except (OSError, UnicodeDecodeError, RegionError):
            continue
        mine: dict[str, NotDone] = {}
        for region in regions:
            lab, _, number = region.tag.partition("/")
            mine.setdefault(number, NotDone(lab, number, path, [])).lines.append(region.begin_line)
        found += sorted(mine.values(), key=lambda t: t.number)
    return found


def solutions_hint() -> str:
    if (LAB / "solutions").is_dir():
        return "`make generate GPUS=N SOLUTIONS=1` runs the reference solutions instead."
    return "`make test-lab4`, `make test-lab5` and `make test-lab6` say what each task still needs."


def use_solutions() -> Path | None:
    """`kiln_tp`, `kiln_llm`, `llama` and `kiln` from the reference solutions from now on, staged in
    .build/staged/lab6-solutions (the same folder every run: a second run finds the kernels built);
    the ranks, which start from this process's sys.path, import them too."""
    from grader.staging import use_packages

    staged = use_packages(LAB, list(PACKAGES), solutions=True)
    tops = {Path(p).name for p in PACKAGES}
    for name in list(sys.modules):
        if name.partition(".")[0] in tops:
            del sys.modules[name]
    return staged


def failed_task(error: Exception) -> str | None:
    """The line for a rank that stopped at a task's stub (`NotImplementedError("lab6/04: ...")`)."""
    m = TAGGED.search(str(error))
    if m is None:
        return None
    what = f": {m['what'].strip()}" if m["what"].strip() else ""
    return (
        f"lab {m['lab'][3:]} task {m['number']} is not done yet{what}; `make test-{m['lab']} TASK={m['number']}` "
        f"grades yours. {solutions_hint()}"
    )


def run(args: argparse.Namespace) -> int:
    from kiln_tp.launch import LaunchError, launch
    from llama.checkpoint import CheckpointError
    from llama.config import ConfigError
    from llama.generate import GenerateError, find_tokenizer
    from llama.tokenizer import TokenizerError, load_tokenizer

    device, world = args.device or "cuda", args.world
    what = world_words(world, device)
    try:
        if device == "cuda" and too_few_gpus(world):
            raise GenerateError(too_few_gpus(world))
        if args.model is None:
            from tiny.train import ensure_tiny_model

            model_path = str(ensure_tiny_model(log=_stderr))
        else:
            model_path = args.model
        path = Path(model_path)
        tok_path = args.tokenizer or (find_tokenizer(path) if path.exists() else None)
        config = read_config(path, args.dtype)
        check_divisible(config, world, what)
        tok = load_tokenizer(tok_path or find_tokenizer(path), config.vocab_size)
        if tok.vocab_size > config.vocab_size:
            raise GenerateError(f"the tokenizer has {tok.vocab_size} tokens but the model only {config.vocab_size}")
        ids = tok.encode(args.prompt, bos=tok.bos_id is not None)
        if not ids:
            raise GenerateError("the prompt is empty and the tokenizer has no BOS token to start from")
        room = config.max_seq_len - len(ids)
        if room <= 0:
            raise GenerateError(f"the prompt is {len(ids)} tokens; the model's context is {config.max_seq_len}")
        max_new = min(args.max_new_tokens, room)
    except (CheckpointError, ConfigError, TokenizerError, GenerateError) as e:
        if args.traceback:
            raise
        _stderr(f"{PROG}: error: {e}")
        return 2
    if device == "cuda":  # built here, once, not by every rank at the same time
        from kiln_llm import KernelBuild

        start = time.perf_counter()
        KernelBuild().wait(every=10.0, tick=lambda k: _stderr(f"lab6: building the CUDA kernels ({k.seconds():.0f} s)"))
        if time.perf_counter() - start > 2:
            _stderr(f"lab6: CUDA kernels built in {time.perf_counter() - start:.0f} s")
    own_libs: dict[str, str] = {}
    if args.all_reduce == "own":
        from kiln_tp.ipc import build_libraries

        own_libs, left_out = build_libraries(args.solutions)
        if left_out:
            for prefix, why in left_out.items():
                _stderr(f"{PROG}: error: --all-reduce own: {prefix} did not build: {why}")
            return 1
    spec = {
        "model": model_path,
        "dtype": args.dtype,
        "tokenizer": str(tok_path or find_tokenizer(path)),
        "device": device,
        "prompt": args.prompt,
        "ids": ids,
        "max_new_tokens": max_new,
        "eos_id": tok.eos_id,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "seed": args.seed,
        "fuse": not args.no_fuse,
        "use_graph": not args.no_graph,
        "own_libs": own_libs,
    }
    sys.stdout.flush()
    try:
        r = launch(world, generate_rank, spec, timeout=args.timeout, device=device)
    except LaunchError as e:
        said = None if args.solutions or args.traceback else failed_task(e)
        _stderr(said or f"{PROG}: error: {e}")
        return 1
    per_rank = f"GPU memory {r['gpu_memory_bytes'] / 2**30:.2f} GiB on rank 0" if r["gpu_memory_bytes"] else "no GPU"
    reduced = ", all-reduces by tasks 02 and 03" if own_libs else ""
    print(
        f"\n[{r['device']} x {world} ranks, tensor-parallel{reduced}] prompt {len(ids)} tokens, prefill "
        f"{r['prefill_tokens_per_s']:.1f} tok/s; {len(r['tokens'])} new tokens, decode {r['decode_tokens_per_s']:.1f} "
        f"tok/s; {per_rank}" + ("; stopped at EOS" if r["stopped_at_eos"] else "")
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    _on_path()
    ap = parser()
    args = ap.parse_args(argv)
    if args.world < 1:
        ap.error(f"--world (GPUS) must be at least 1, got {args.world}")
    if args.max_new_tokens < 1:
        ap.error("--max-new-tokens must be at least 1")
    if not args.temperature >= 0.0:  # also refuses NaN
        ap.error(f"--temperature must be >= 0 (0 is greedy), got {args.temperature}")
    if not 0.0 < args.top_p <= 1.0:
        ap.error(f"--top-p must be in (0, 1] (1 keeps every token), got {args.top_p}")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.all_reduce == "own" and args.device == "cpu":
        ap.error("--all-reduce own runs tasks 02 and 03's CUDA libraries: GPUs only (drop --device cpu)")
    if (args.device or "cuda") == "cuda":  # first: what the user asked for, before what is not done yet
        problem = too_few_gpus(args.world)
        if problem:
            _stderr(f"{PROG}: error: {problem}")
            return 2
    if args.solutions:
        use_solutions()
        from kiln_tp.generate import run as run_solutions  # the staged reference of this very module

        return run_solutions(args)
    if not args.traceback:
        missing = not_done(args.device or "cuda", use_graph=not args.no_graph, own=args.all_reduce == "own")
        if missing:  # said before anything is loaded, trained or started
            _stderr("\n".join([*(t.line() for t in missing), solutions_hint()]))
            return 1
    return run(args)


if __name__ == "__main__":
    from kiln_tp.generate import main as _main  # the module by its name: the ranks find generate_rank there

    sys.exit(_main())
