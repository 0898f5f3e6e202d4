"""Lab 5's benchmark: kiln's LLaMA decode against the GPU's memory roofline and against transformers.

    python lab5/bench_llama.py                              # your kiln (every lab 5 task done)
    python lab5/bench_llama.py --solutions                  # the reference solutions, with the gate
    python lab5/bench_llama.py --solutions --write-readme   # and the table into lab5/README.md
    python lab5/bench_llama.py --shape tinyllama --skip-hf --steps 64

Needs a GPU, and nothing from the network: the weights are random float16 tensors made on the GPU
in the shapes of LLaMA-2-7B (dim 4096, 32 layers, 32 heads, hidden 11008, vocab 32000) and of
TinyLlama-1.1B (dim 2048, 22 layers, 32 query heads on 4 KV heads, hidden 5632). Speed does not
depend on the values, only on the shapes, and one run measures everything on the same GPU:

- the device copy bandwidth: a 1 GiB device-to-device copy, counted as bytes read plus written;
- kiln's decode at batch 1 (one CUDA graph per token, the fused graph), tokens per second, and its
  share of the roofline: a decode step must read every weight once (the embedding table only one
  row) and the KV cache of the positions so far, so at best it runs at copy bandwidth / those bytes;
- kiln's prefill of a PROMPT_LEN-token prompt, tokens per second (the float32 logits of every
  position copied to the host included, as LlamaModel.prefill returns them);
- the GPU memory of kiln's executors (weights, KV caches, activations: LlamaModel.memory_bytes);
- transformers' LlamaForCausalLM on the SAME weights (its parameters are our tensors, not copies):
  eager (sdpa attention, dynamic cache) and with a static cache and a compiled decoding forward
  (torch.compile mode="reduce-overhead": CUDA graphs), as transformers recommends for latency.
  Its decode is timed per token inside generate() by a logits processor that synchronizes and
  reads the clock once per generated token, so both sides count the same thing: seconds per token
  with the logits of the previous one known.

Before any timing, the last-position logits of kiln's prefill are compared with transformers' eager
ones (relative L2 error): a fast wrong model is not a result.

Writes lab5/results/reference-bench.json (--solutions) or my-bench.json and prints a markdown table;
--write-readme replaces the block between `<!-- bench-lab5:begin -->` and `<!-- bench-lab5:end -->`
in lab5/README.md. With --solutions it exits non-zero (the gate) when kiln's decode is under
GATE_ROOFLINE of the roofline, not faster than compiled transformers, or its logits disagree.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

LAB = Path(__file__).resolve().parent
ROOT = LAB.parent
README = LAB / "README.md"
BEGIN, END = "<!-- bench-lab5:begin -->", "<!-- bench-lab5:end -->"

PROMPT_LEN = 512
STEPS = 128
WARMUP_STEPS = 8
PREFILL_RUNS = 5
COPY_BYTES = 1 << 30
GATE_ROOFLINE = 0.85
DEVICE = "cuda"  # a module variable only so that the course's CPU smoke test can run the code paths
MAX_LOGIT_ERROR = 0.05  # relative L2 distance of kiln's last-position logits from transformers'

# LlamaConfig fields of each shape (Meta's names, lab5/llama/config.py)
SHAPES: dict[str, dict[str, Any]] = {
    "7b": {
        "label": "LLaMA-2-7B shape",
        "dim": 4096,
        "n_layers": 32,
        "n_heads": 32,
        "n_kv_heads": 32,
        "hidden_dim": 11008,
        "vocab_size": 32000,
    },
    "tinyllama": {
        "label": "TinyLlama-1.1B shape",
        "dim": 2048,
        "n_layers": 22,
        "n_heads": 32,
        "n_kv_heads": 4,
        "hidden_dim": 5632,
        "vocab_size": 32000,
    },
}


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def use_lab(solutions: bool) -> None:
    """Puts lab 5's packages (or, with `solutions`, the reference files over them) and the grader on sys.path."""
    # the grader builds the kernels; lab 4's kiln runs the graphs; llama, kiln_llm and tiny live in lab5/
    for folder in (ROOT, ROOT / "lab4", LAB):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    if solutions:
        from llama.generate import use_solutions

        use_solutions()


# --- what is measured -------------------------------------------------------------------------------


def copy_bandwidth() -> float:
    """Bytes per second a device-to-device copy moves (read + written), median of 20 copies of 1 GiB."""
    import torch

    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device=DEVICE).fill_(1)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(20):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * COPY_BYTES / statistics.median(times)


def make_config(shape: str, max_seq: int) -> Any:
    from llama import LlamaConfig

    fields = {k: v for k, v in SHAPES[shape].items() if k != "label"}
    return LlamaConfig(**fields, norm_eps=1e-5, rope_theta=10000.0, max_seq_len=max_seq, dtype="float16")


def random_weights(config: Any, seed: int = 0) -> dict[str, Any]:
    """Every tensor of the model, float16, drawn on the GPU (no host copy): linear weights at scale
    1/sqrt(fan-in) and norms near 1, so activations stay in range through every layer."""
    import torch

    from llama import expected_shapes

    g = torch.Generator(device=DEVICE).manual_seed(seed)
    weights = {}
    for name, shape in expected_shapes(config).items():
        t = torch.empty(shape, dtype=torch.float16, device=DEVICE)
        if len(shape) == 1:
            t.normal_(1.0, 0.1, generator=g)
        elif name == "tok_embeddings":
            t.normal_(0.0, 1.0, generator=g)
        else:
            t.normal_(0.0, 1.0 / math.sqrt(shape[1]), generator=g)
        weights[name] = t
    return weights


def bytes_per_token(config: Any, weights: dict[str, Any], kv_rows: float) -> float:
    """What one decode step must read: every weight (of the embedding table, one row) and kv_rows
    rows of keys and of values in each layer."""
    item = 2  # float16
    w = sum(t.numel() for n, t in weights.items() if n != "tok_embeddings") * item + config.dim * item
    kv = 2 * config.n_layers * kv_rows * config.kv_dim * item
    return w + kv


def bench_kiln(config: Any, weights: dict[str, Any], prompt: list[int], steps: int) -> dict[str, Any]:
    """Prefill and decode of kiln's LlamaModel (fused, one CUDA graph per run)."""
    import torch

    from llama.model import LlamaModel

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    model = LlamaModel(
        config, weights, device=DEVICE, max_seq=len(prompt) + WARMUP_STEPS + steps + 1, fuse=True, use_graph=True
    )
    logits = model.prefill(prompt, last=True)  # compiles the prompt length's executor (and captures its graph)
    build_s = time.perf_counter() - t0
    prefill = []
    for _ in range(PREFILL_RUNS):
        model.reset()
        torch.cuda.synchronize()
        start = time.perf_counter()
        logits = model.prefill(prompt, last=True)  # (V,) float32 on the CPU: the copy is part of the cost
        torch.cuda.synchronize()
        prefill.append(time.perf_counter() - start)
    last = logits.clone()  # (V,)
    token = int(last.argmax())
    for _ in range(WARMUP_STEPS):
        token = int(model.decode(token).argmax())
    first_pos = model.pos
    per_token = []
    for _ in range(steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        row = model.decode(token)
        torch.cuda.synchronize()
        per_token.append(time.perf_counter() - start)
        token = int(row.argmax())
    result = {
        "build_s": build_s,
        "prefill_tokens_per_s": len(prompt) / statistics.median(prefill),
        "decode_tokens_per_s": steps / sum(per_token),
        "decode_ms_median": statistics.median(per_token) * 1e3,
        # rows of the cache a step reads: positions 0..pos inclusive, averaged over the timed steps
        "kv_rows_mean": first_pos + (steps - 1) / 2 + 1,
        "memory_bytes": model.memory_bytes(),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "last_logits": last,
    }
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return result


# --- transformers on the same weights ---------------------------------------------------------------


def hf_model(config: Any, weights: dict[str, Any]) -> Any:
    """LlamaForCausalLM whose parameters ARE our tensors: built on the meta device (no memory, no
    random init), then load_state_dict(assign=True). Only RoPE's frequencies are made on the GPU."""
    import torch
    import transformers
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = transformers.LlamaConfig(
        hidden_size=config.dim,
        num_hidden_layers=config.n_layers,
        num_attention_heads=config.n_heads,
        num_key_value_heads=config.n_kv_heads,
        intermediate_size=config.hidden_dim,
        vocab_size=config.vocab_size,
        rms_norm_eps=config.norm_eps,
        rope_theta=config.rope_theta,
        max_position_embeddings=config.max_seq_len,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    from llama.checkpoint import hf_name

    model.load_state_dict({hf_name(n): t for n, t in weights.items()}, strict=True, assign=True)
    with torch.device(DEVICE):
        model.model.rotary_emb = LlamaRotaryEmbedding(config=cfg)  # its buffers were on meta
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"transformers' model still has tensors on the meta device: {left[:4]}")
    model.eval()
    model.generation_config.eos_token_id = None  # random weights: never stop early
    model.generation_config.pad_token_id = 0
    return model


def hf_last_logits(model: Any, prompt: list[int]) -> Any:
    import torch

    with torch.no_grad():
        ids = torch.tensor([prompt], device=DEVICE)
        return model(input_ids=ids, logits_to_keep=1).logits[0, -1].float().cpu()


def hf_generate_timed(model: Any, prompt: list[int], steps: int) -> tuple[float, float]:
    """(seconds from the call to the first token, seconds per later token) of one greedy generate()."""
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    class Stamp(LogitsProcessor):
        """Runs once per generated token, after its logits: the clock, with the GPU caught up."""

        def __init__(self) -> None:
            self.times: list[float] = []

        def __call__(self, input_ids: Any, scores: Any) -> Any:
            torch.cuda.synchronize()
            self.times.append(time.perf_counter())
            return scores

    stamp = Stamp()
    ids = torch.tensor([prompt], device=DEVICE)
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=steps + 1,
            min_new_tokens=steps + 1,
            logits_processor=LogitsProcessorList([stamp]),
        )
    if out.shape[1] != len(prompt) + steps + 1 or len(stamp.times) != steps + 1:
        raise RuntimeError(f"transformers generated {out.shape[1] - len(prompt)} tokens, {steps + 1} asked")
    return stamp.times[0] - start, (stamp.times[-1] - stamp.times[0]) / steps


def bench_hf(config: Any, weights: dict[str, Any], prompt: list[int], steps: int) -> dict[str, Any]:
    """transformers eager, then with a static cache and a compiled decoding forward, on our weights."""
    import torch
    from transformers.generation.configuration_utils import CompileConfig

    model = hf_model(config, weights)
    result: dict[str, Any] = {"last_logits": hf_last_logits(model, prompt)}

    say("  transformers eager: warm-up, then timed")
    hf_generate_timed(model, prompt[:16], 4)
    first, per = hf_generate_timed(model, prompt, steps)
    result["eager"] = {"first_token_s": first, "decode_tokens_per_s": 1 / per}

    say("  transformers static cache + torch.compile(mode='reduce-overhead'): compiling (a minute or two)")
    # generate() compiles the decoding forward itself when the cache is static (transformers >= 4.48);
    # the prefill of each prompt stays eager, as in transformers' own recipe
    model.generation_config.cache_implementation = "static"
    model.generation_config.compile_config = CompileConfig(mode="reduce-overhead")
    t0 = time.perf_counter()
    for _ in range(2):  # the first compiles, the second records the CUDA graphs
        hf_generate_timed(model, prompt, steps)
    if not hasattr(model, "_compiled_call"):
        # an older or newer transformers that does not compile by itself: the documented manual recipe
        say("  (generate() did not compile the forward: compiling model.forward explicitly)")
        model.generation_config.disable_compile = True
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
        for _ in range(2):
            hf_generate_timed(model, prompt, steps)
    compile_s = time.perf_counter() - t0
    first, per = hf_generate_timed(model, prompt, steps)
    result["compiled"] = {"first_token_s": first, "decode_tokens_per_s": 1 / per, "compile_s": compile_s}
    del model
    gc.collect()
    torch._dynamo.reset()  # drop the compiled graphs (and their CUDA graph pools) before the next shape
    torch.cuda.empty_cache()
    return result


# --- one shape ------------------------------------------------------------------------------------------


def bench_shape(shape: str, args: argparse.Namespace, bandwidth: float) -> dict[str, Any]:
    import torch

    label = SHAPES[shape]["label"]
    config = make_config(shape, args.prompt_len + WARMUP_STEPS + args.steps + 1)
    say(f"{label}: random float16 weights on the GPU")
    weights = random_weights(config)
    n_params = sum(t.numel() for t in weights.values())
    g = torch.Generator().manual_seed(1)
    prompt = [1, *torch.randint(3, config.vocab_size, (args.prompt_len - 1,), generator=g).tolist()]

    say(f"  kiln: compiling, then prefill x{PREFILL_RUNS} and {args.steps} decode steps")
    kiln = bench_kiln(config, weights, prompt, args.steps)
    per_token = bytes_per_token(config, weights, kiln.pop("kv_rows_mean"))
    roofline = bandwidth / per_token
    row: dict[str, Any] = {
        "label": label,
        "config": {k: v for k, v in SHAPES[shape].items() if k != "label"},
        "parameters": n_params,
        "prompt_len": args.prompt_len,
        "steps": args.steps,
        "bytes_per_token": per_token,
        "roofline_tokens_per_s": roofline,
        "kiln": {k: v for k, v in kiln.items() if k != "last_logits"},
    }
    row["kiln"]["roofline_share"] = kiln["decode_tokens_per_s"] / roofline
    if not args.skip_hf:
        hf = bench_hf(config, weights, prompt, args.steps)
        a, b = kiln["last_logits"], hf.pop("last_logits")
        row["logit_error"] = float((a - b).norm() / b.norm())
        row["hf"] = hf
    del weights
    gc.collect()
    torch.cuda.empty_cache()
    return row


# --- the report -----------------------------------------------------------------------------------------


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def table(results: dict[str, Any]) -> str:
    bw = results["copy_bandwidth_bytes_per_s"]
    lines = [
        f"{results['device']}, device copy {bw / 1e12:.2f} TB/s (read + write). Batch 1, float16, random weights; "
        f"decode after a {results['prompt_len']}-token prompt, {results['steps']} tokens.",
        "",
        "| model | kiln decode | roofline | share | kiln prefill | transformers eager | transformers compiled"
        " | kiln / compiled | kiln arenas |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in results["shapes"].values():
        k = row["kiln"]
        hf = row.get("hf")
        eager = f"{hf['eager']['decode_tokens_per_s']:.0f} tok/s" if hf else "n/a"
        compiled = f"{hf['compiled']['decode_tokens_per_s']:.0f} tok/s" if hf else "n/a"
        ratio = f"{k['decode_tokens_per_s'] / hf['compiled']['decode_tokens_per_s']:.2f}x" if hf else "n/a"
        lines.append(
            f"| {row['label']} ({row['parameters'] / 1e9:.2f} B) | {k['decode_tokens_per_s']:.0f} tok/s"
            f" | {row['roofline_tokens_per_s']:.0f} tok/s | {100 * k['roofline_share']:.1f}%"
            f" | {k['prefill_tokens_per_s']:.0f} tok/s | {eager} | {compiled} | {ratio}"
            f" | {_gib(k['memory_bytes'])} |"
        )
    return "\n".join(lines)


def gate(results: dict[str, Any], skip_hf: bool) -> list[str]:
    """What keeps the reference solutions from passing; empty when they pass."""
    problems = []
    for shape, row in results["shapes"].items():
        k = row["kiln"]
        # the targets are for the 7B shape; TinyLlama's row is reported (its small layers
        # leave the fixed cost of each kernel a larger share), but its logits must still be right
        if shape == "7b" and k["roofline_share"] < GATE_ROOFLINE:
            problems.append(
                f"{row['label']}: decode at {100 * k['roofline_share']:.1f}% of the roofline, under"
                f" {100 * GATE_ROOFLINE:.0f}%"
            )
        if skip_hf:
            continue
        if row["logit_error"] > MAX_LOGIT_ERROR:
            problems.append(
                f"{row['label']}: kiln's logits are {row['logit_error']:.3f} (relative L2) from transformers',"
                f" over {MAX_LOGIT_ERROR}"
            )
        fastest = row["hf"]["compiled"]["decode_tokens_per_s"]
        if shape == "7b" and k["decode_tokens_per_s"] <= fastest:
            problems.append(
                f"{row['label']}: decode {k['decode_tokens_per_s']:.0f} tok/s is not faster than compiled"
                f" transformers' {fastest:.0f} tok/s"
            )
    return problems


def write_readme(text: str) -> None:
    readme = README.read_text(encoding="utf-8")
    if BEGIN not in readme or END not in readme or readme.index(BEGIN) > readme.index(END):
        sys.exit(f"{README}: no {BEGIN} ... {END} block to replace")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    README.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--solutions", action="store_true", help="time the reference solutions (and gate them)")
    parser.add_argument("--shape", choices=["7b", "tinyllama", "both"], default="both", help="default: both")
    parser.add_argument("--steps", type=int, default=STEPS, help=f"decode steps timed (default {STEPS})")
    parser.add_argument("--prompt-len", type=int, default=PROMPT_LEN, help=f"prompt tokens (default {PROMPT_LEN})")
    parser.add_argument("--skip-hf", action="store_true", help="leave out transformers (no compile wait)")
    parser.add_argument("--write-readme", action="store_true", help=f"put the table into {README.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.prompt_len < 1:
        parser.error("--steps and --prompt-len must be at least 1")
    use_lab(args.solutions)
    import torch

    if not torch.cuda.is_available():
        sys.exit("bench_llama.py needs a GPU")

    shapes = ["7b", "tinyllama"] if args.shape == "both" else [args.shape]
    say("device copy bandwidth")
    bandwidth = copy_bandwidth()
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "date": datetime.date.today().isoformat(),
        "solutions": args.solutions,
        "torch": torch.__version__,
        "prompt_len": args.prompt_len,
        "steps": args.steps,
        "copy_bandwidth_bytes_per_s": bandwidth,
        "shapes": {},
    }
    if not args.skip_hf:
        import transformers

        results["transformers"] = transformers.__version__
    for shape in shapes:
        results["shapes"][shape] = bench_shape(shape, args, bandwidth)

    text = table(results)
    print(text)
    for row in results["shapes"].values():
        if "logit_error" in row:
            print(f"{row['label']}: kiln's last-position logits vs transformers': relative L2 {row['logit_error']:.2e}")
    out = LAB / "results" / ("reference-bench.json" if args.solutions else "my-bench.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out.relative_to(ROOT)}")
    problems = gate(results, args.skip_hf) if args.solutions else []
    if args.write_readme:
        cmd = "python lab5/bench_llama.py" + (" --solutions" if args.solutions else "")
        failed = f" (its gate failed: {'; '.join(problems)})" if problems else ""
        write_readme(f"Measured by `{cmd}` on {results['date']}{failed}:\n\n{text}")
        print(f"wrote the table into {README.relative_to(ROOT)}")
    if args.solutions:
        for p in problems:
            print(f"GATE: {p}", file=sys.stderr)
        if problems:
            return 1
    else:
        for row in results["shapes"].values():
            if row.get("logit_error", 0.0) > MAX_LOGIT_ERROR:
                print(f"WARNING: {row['label']}: your logits are {row['logit_error']:.3f} from transformers'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
