"""Lab 6's benchmark: decode of the Llama-2-7B shape on 1, 2 and 4 GPUs, compute and communication apart.

    python lab6/bench_tp.py                                   # your kiln_tp (lab 6's 04 and 05, labs 4 and 5 done)
    python lab6/bench_tp.py --solutions --write-readme        # the reference: JSON, README block and figure
    python lab6/bench_tp.py --gpus 1 2 --steps 64             # fewer counts, fewer steps
    python lab6/bench_tp.py --own-all-reduce                  # also each count with tasks 02 and 03's all-reduces

Needs GPUs and nothing from the network: the weights are random float16 tensors in the shape of
Llama-2-7B (dim 4096, 32 layers, 32 heads, hidden 11008, vocab 32000: 6.74 G parameters, 13.5 GB),
drawn on each GPU from one seed, so every run and every rank holds the same model. Speed depends on
the shapes, not on the values. Each GPU count is measured in its own processes (kiln_tp.launch,
device="cuda": one rank per GPU, NCCL), one count after the other; a count larger than the GPUs
this machine shows is skipped, and the table says so.

- 1 GPU: lab 5's LlamaModel (the fused graph, the decode step in CUDA graphs), what one GPU runs
  without any of lab 6: the baseline of every speed-up.
- W GPUs: kiln_tp's TPLlamaModel on each rank, its share of the weights (shard_weights) and the
  step with its 2 x 32 all-reduces captured in CUDA graphs (task 04's lowering). With
  --own-all-reduce, each such count once more with the all-reduces lowered to tasks 02 and 03's
  libraries (kiln_tp.own_all_reduce: the one-shot for the step's rows), a row "W, tasks 02+03".
- Decode: a prompt of PROMPT_LEN tokens, WARMUP steps untimed, then --steps steps, each timed on
  rank 0 with the GPU synchronized on both sides of model.decode (lab 5's benchmark's measure). The
  tokens fed are fixed in advance (seeded), the same at every count, so the logits of two counts
  can be compared, and no rank waits for a broadcast inside the timed step.
- Compute and communication apart: after the timed steps, each rank builds its one-token graph
  again with every all_reduce node replaced by a view of its input (a reshape: no launch, no copy,
  no NCCL), compiles it sharing the model's weights and caches, captures it in the same two step
  graphs and replays it at the same positions with the same tokens (the caches' rows it writes
  are wrong, and nothing reads them after). Its step time is the compute; the step time minus it
  is the communication: what the 64 all_reduce launches add, the NCCL kernels, the copies into
  their output slots and the waits for the slower rank. Per all-reduce, that is divided by 64.
  Besides, each rank times NCCL alone: 64 all-reduces of one 4096-element float16 row captured in
  one CUDA graph, replayed, with CUDA events: the all-reduce's latency with nothing in between.
- Checked before any figure counts: the last-position logits of the prompt and of the first
  decode step at each count against one GPU's (relative L2). With --solutions an error over
  MAX_LOGIT_ERROR fails the run (exit status 1); speeds never do.

Prints a markdown table: tokens per second, milliseconds per step and its compute and
communication, the speed-up over one GPU; the issue's goals (GOALS: 2 GPUs at 1.6x one, 4 at 2.5x)
marked met or missed, not asserted. Writes lab6/results/reference-bench.json (--solutions) or
my-bench.json; --write-readme also draws lab6/figures/tp-decode.png and replaces the block between
`<!-- bench-lab6:begin -->` and `<!-- bench-lab6:end -->` in lab6/README.md.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import math
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

LAB = Path(__file__).resolve().parent
ROOT = LAB.parent
README = LAB / "README.md"
FIGURE = LAB / "figures" / "tp-decode.png"
BEGIN, END = "<!-- bench-lab6:begin -->", "<!-- bench-lab6:end -->"
PACKAGES = ["kiln_tp", "../lab5/kiln_llm", "../lab5/llama", "../lab4/kiln"]

COUNTS = (1, 2, 4)
PROMPT_LEN = 512
STEPS = 128
WARMUP = 8
SEED = 0
LAUNCH_TIMEOUT_S = 1800.0  # one count: make the weights, compile, capture, prefill, time (minutes at most)
MAX_LOGIT_ERROR = 0.05  # relative L2 of a count's logits from one GPU's
NCCL_ROW = 4096  # the all-reduce NCCL is timed alone on: one decode step's row of the residual stream
NCCL_REPEATS = 20
# the goals (issue 26): decode speed over one GPU's, on H100s; shown, never a gate
GOALS = {2: 1.6, 4: 2.5}
OWN = " own"  # the key suffix of a run whose all-reduces are tasks 02 and 03's ("2 own")

SHAPE: dict[str, Any] = {
    "label": "Llama-2-7B shape",
    "dim": 4096,
    "n_layers": 32,
    "n_heads": 32,
    "n_kv_heads": 32,
    "hidden_dim": 11008,
    "vocab_size": 32000,
}


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def use_lab(solutions: bool) -> None:
    """Lab 4's kiln, lab 5's kiln_llm and llama, lab 6's kiln_tp and the grader on sys.path: the
    student's files, or with `solutions` the reference solutions staged over them. The ranks start
    from this process's sys.path and import the same."""
    for folder in (ROOT, ROOT / "lab4", ROOT / "lab5", LAB):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    if solutions:
        from grader.staging import use_packages

        use_packages(LAB, PACKAGES, solutions=True)


# --- on each rank ------------------------------------------------------------------------------------


def make_config(max_seq: int) -> Any:
    from llama import LlamaConfig

    fields = {k: v for k, v in SHAPE.items() if k != "label"}
    return LlamaConfig(**fields, norm_eps=1e-5, rope_theta=10000.0, max_seq_len=max_seq, dtype="float16")


def random_weights(config: Any, seed: int = SEED) -> dict[str, Any]:
    """Every tensor of the model, float16, drawn on the current GPU from `seed` (lab 5's benchmark's
    recipe: linear weights at scale 1/sqrt(fan-in), norms near 1): the same values on every GPU."""
    import torch

    from llama import expected_shapes

    g = torch.Generator(device="cuda").manual_seed(seed)
    weights = {}
    for name, shape in expected_shapes(config).items():
        t = torch.empty(shape, dtype=torch.float16, device="cuda")
        if len(shape) == 1:
            t.normal_(1.0, 0.1, generator=g)
        elif name == "tok_embeddings":
            t.normal_(0.0, 1.0, generator=g)
        else:
            t.normal_(0.0, 1.0 / math.sqrt(shape[1]), generator=g)
        weights[name] = t
    return weights


def without_all_reduces(graph: Any) -> Any:
    """A copy of `graph` in which every all_reduce node is a reshape of its input to its own shape:
    a view, so the executor launches nothing for it (no NCCL, no copy) and the next node reads the
    rank's partial sum. The rest is the same nodes, names and constants."""
    from kiln.ir import Graph, Node

    new: dict[Any, Any] = {}
    for n in graph.nodes:
        inputs = tuple(new[i] for i in n.inputs)
        if n.op == "all_reduce":
            new[n] = Node(n.name, "reshape", inputs, {"shape": list(n.type.shape)}, n.type)
        else:
            new[n] = Node(n.name, n.op, inputs, dict(n.attrs), n.type)
    return Graph(f"{graph.name}_local", list(new.values()), [new[o] for o in graph.outputs], dict(graph.constants))


def _timed_steps(step: Any, tokens: Sequence[int]) -> list[float]:
    """Seconds of each call of step(token), the GPU synchronized on both sides."""
    import torch

    times = []
    for tok in tokens:
        torch.cuda.synchronize()
        start = time.perf_counter()
        step(tok)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def nccl_alone_us(n_calls: int) -> float:
    """Microseconds per all-reduce of one float16 row of NCCL_ROW elements: n_calls of them captured
    in one CUDA graph (after one eager warm-up), replayed NCCL_REPEATS times, timed by CUDA events."""
    import torch
    import torch.distributed as dist

    row = torch.ones(NCCL_ROW, dtype=torch.float16, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            dist.all_reduce(row)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n_calls):
            dist.all_reduce(row)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(NCCL_REPEATS):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3 / n_calls)
    del graph
    return statistics.median(times)


def bench_rank(rank: int, world: int, spec: dict[str, Any]) -> dict[str, Any]:
    """One rank of one count: the model (lab 5's at 1 GPU, kiln_tp's share at W), the prompt, the
    timed decode steps, then (W > 1) the same steps without the all-reduces and NCCL alone. Rank 0's
    return value is the count's result."""
    import torch
    import torch.distributed as dist

    prompt, tokens, steps = spec["prompt"], spec["tokens"], spec["steps"]
    max_seq = len(prompt) + len(tokens)
    config = make_config(max_seq)
    torch.cuda.reset_peak_memory_stats()
    weights = random_weights(config)
    own = spec.get("own_libs")
    if own:  # before the model's executors are built: they lower all_reduce to tasks 02 and 03
        from kiln_tp.own_all_reduce import use_own_all_reduce

        use_own_all_reduce(own["ring"], own["one_shot"])
    if world == 1:
        from llama.model import LlamaModel

        model = LlamaModel(config, weights, device="cuda", max_seq=max_seq)
    else:
        from kiln_tp.model import TPLlamaModel
        from kiln_tp.shard import shard_weights

        local_config, weights = shard_weights(config, weights, rank, world)  # the whole model's tensors go
        model = TPLlamaModel(local_config, weights, device="cuda", max_seq=max_seq)
    del weights  # the executors hold their own copies
    gc.collect()
    torch.cuda.empty_cache()
    model.prefill(prompt, last=True)  # compiles and captures the prompt's executor
    model.reset()
    last = model.prefill(prompt, last=True).float()  # (V,)
    first = model.decode(tokens[0]).float()
    for tok in tokens[1:WARMUP]:
        model.decode(tok)
    if world > 1:
        dist.barrier()
    times = _timed_steps(model.decode, tokens[WARMUP:])
    out: dict[str, Any] = {
        "world": world,
        "device": torch.cuda.get_device_name(),
        "steps": steps,
        "step_ms_median": 1e3 * statistics.median(times),
        "decode_tokens_per_s": steps / sum(times),
        "memory_bytes": model.memory_bytes(),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "prefill_last_logits": last,
        "first_decode_logits": first,
    }
    if world == 1:
        out["compute_ms_median"] = out["step_ms_median"]
        return out
    out["compute_ms_median"], out["all_reduces_per_step"] = compute_only_ms(model, tokens, len(prompt))
    gc.collect()  # the local graph's executor and step graphs
    dist.barrier()
    out["nccl_alone_us"] = nccl_alone_us(out["all_reduces_per_step"])
    if own:  # every rank, nothing replays the model's graphs any more
        from kiln_tp.own_all_reduce import stop_own_all_reduce

        stop_own_all_reduce()
        out["all_reduce"] = "tasks 02+03"
    return out


def compute_only_ms(model: Any, tokens: Sequence[int], start: int) -> tuple[float, int]:
    """(median milliseconds of a decode step without its all-reduces, how many all-reduces a step
    has): the rank's one-token graph built again, every all_reduce made a view, compiled sharing
    `model`'s weights and caches, captured as lab 5's step graphs and replayed from position
    `start` with `tokens`, the first WARMUP untimed."""
    import torch.distributed as dist

    import kiln_llm
    from kiln_tp.shard import build_tp_graph
    from llama.model import StepGraphs

    # the decode graph again (model.weights: their shapes only; the executor takes the model's by name)
    graph = build_tp_graph(model.config, model.weights, n_tokens=1, max_seq=model.max_seq, name="llama_tp_t1")
    local = kiln_llm.compile(without_all_reduces(graph), "cuda", use_graph=True, share_with=model.decoder)
    step = StepGraphs.capture(local)
    positions = iter(range(start, model.max_seq))

    def one(tok: int) -> None:
        step.replay(local.stream, tok, next(positions))

    for tok in tokens[:WARMUP]:
        one(tok)
    dist.barrier()
    times = _timed_steps(one, tokens[WARMUP:])
    return 1e3 * statistics.median(times), len(graph.of_op("all_reduce"))


# --- the run ---------------------------------------------------------------------------------------------


def plan(counts: Sequence[int], visible: int) -> tuple[list[int], dict[str, str]]:
    """(the counts to run, {count: why not} for the others) on a machine that shows `visible` GPUs."""
    run, skipped = [], {}
    for w in sorted(set(counts)):
        if w <= visible:
            run.append(w)
        else:
            skipped[str(w)] = f"needs {w} GPUs; this machine shows {visible}"
    return run, skipped


def run_keys(counts: Sequence[int], own: bool) -> list[str]:
    """The runs in order: each count ("2"), and with `own` each count of 2 or more again ("2 own")."""
    return [k for w in counts for k in ([str(w)] + ([f"{w}{OWN}"] if own and w > 1 else []))]


def key_order(key: str) -> tuple[int, bool]:
    """Sorts "1", "2", "2 own", "4", "4 own" so."""
    return int(key.split()[0]), key.endswith(OWN)


def own_libraries(solutions: bool) -> tuple[dict[str, str], str]:
    """({prefix: library}, "") with tasks 02 and 03 built, or ({}, why their rows are not run)."""
    from kiln_tp.ipc import SOURCES, build_libraries

    if not solutions:
        from grader import paths
        from grader.tasks.regions import untouched_regions

        for rel in SOURCES.values():
            path = paths.student_source(LAB, rel)
            if untouched_regions(path.read_text(encoding="utf-8"), str(path)):
                return {}, f"lab6/{rel} is not done yet (its TODO regions are empty)"
    libs, left_out = build_libraries(solutions)
    if left_out:
        return {}, "; ".join(f"{p} did not build: {why}" for p, why in left_out.items())
    return libs, ""


def relative_error(a: Any, b: Any) -> float:
    return float((a - b).norm() / b.norm())


def gpu_link() -> str | None:
    """What `nvidia-smi topo -m` says joins GPU0 and GPU1 (NV18, PIX, SYS, ...), or None."""
    from grader.toolchain import gpu_topology

    return gpu_topology().get((0, 1))


def run_counts(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from grader.toolchain import gpus, nvcc_version
    from kiln_tp import launch
    from kiln_tp.launch import LaunchError, gpus_visible

    visible = gpus_visible()
    counts, skipped = plan(args.gpus, visible)
    found = gpus()
    g = torch.Generator().manual_seed(1)
    prompt = [1, *torch.randint(3, SHAPE["vocab_size"], (args.prompt_len - 1,), generator=g).tolist()]
    tokens = torch.randint(3, SHAPE["vocab_size"], (WARMUP + args.steps,), generator=g).tolist()
    nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None
    results: dict[str, Any] = {
        "device": found[0].name if found else "unknown GPU",  # nvidia-smi's: no CUDA context in this process
        "gpus_visible": visible,
        "link": gpu_link() if visible > 1 else None,
        "driver": found[0].driver if found else "unknown",
        "nvcc": nvcc_version(),
        "torch": torch.__version__,
        "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
        "date": datetime.date.today().isoformat(),
        "solutions": args.solutions,
        "shape": {k: v for k, v in SHAPE.items() if k != "label"},
        "label": SHAPE["label"],
        "prompt_len": args.prompt_len,
        "steps": args.steps,
        "runs": {},
        "skipped": skipped,
    }
    spec = {"prompt": prompt, "tokens": tokens, "steps": args.steps}
    for w, why in skipped.items():
        say(f"{w} GPUs: skipped, {why}")
    own_libs, own_missing = own_libraries(args.solutions) if args.own_all_reduce else ({}, "")
    logits: dict[str, tuple[Any, Any]] = {}
    for key in run_keys(counts, args.own_all_reduce):
        w = int(key.split()[0])
        if key.endswith(OWN) and own_missing:
            results["skipped"][key] = own_missing
            say(f"{_label(key)} GPUs: skipped, {own_missing}")
            continue
        say(f"{_label(key)} GPUs: weights, compile, capture, prefill {args.prompt_len}, {args.steps} steps")
        t0 = time.perf_counter()
        try:
            r = launch(
                w,
                bench_rank,
                {**spec, "own_libs": own_libs if key.endswith(OWN) else {}},
                timeout=LAUNCH_TIMEOUT_S,
                device="cuda",
            )
        except LaunchError as e:
            if not key.endswith(OWN):
                raise
            results["skipped"][key] = f"failed: {str(e).splitlines()[0]}"  # your libraries: NCCL's rows stand
            say(f"{_label(key)} GPUs: {results['skipped'][key]}")
            continue
        logits[key] = (r.pop("prefill_last_logits"), r.pop("first_decode_logits"))
        r["seconds"] = time.perf_counter() - t0
        results["runs"][key] = r
        say(f"  {r['decode_tokens_per_s']:.1f} tok/s, {r['step_ms_median']:.2f} ms a step ({r['seconds']:.0f} s)")
    if "1" in logits:
        base = logits["1"]
        for w, (last, first) in logits.items():
            if w != "1":
                results["runs"][w]["logit_error"] = max(relative_error(last, base[0]), relative_error(first, base[1]))
    add_derived(results)
    results["goals"] = [{"goal": g, "measured": v, "met": m} for g, v, m in goals(results)]
    return results


def add_derived(results: dict[str, Any]) -> None:
    """Communication, its share per all-reduce, and the speed-up over one GPU, from the timings."""
    one = results["runs"].get("1")
    for r in results["runs"].values():
        if r["world"] > 1 and r.get("compute_ms_median") is not None:
            r["comm_ms_median"] = r["step_ms_median"] - r["compute_ms_median"]
            n = r.get("all_reduces_per_step") or 2 * results["shape"]["n_layers"]
            r["comm_us_per_all_reduce"] = 1e3 * r["comm_ms_median"] / n
        elif r["world"] == 1:
            r["comm_ms_median"] = 0.0
        r["speedup"] = r["decode_tokens_per_s"] / one["decode_tokens_per_s"] if one else None


# --- the report ------------------------------------------------------------------------------------------


def goals(results: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """(the goal, what the run measured, met: True, False, or None where it was not measured)."""
    out: list[tuple[str, str, bool | None]] = []
    for w, target in GOALS.items():
        goal = f"{w} GPUs >= {target:.1f}x one GPU's decode"
        r = results["runs"].get(str(w))
        if r is None or r.get("speedup") is None:
            why = results["skipped"].get(str(w)) or ("one GPU not measured" if r is not None else "not run")
            out.append((goal, f"not measured ({why})", None))
        else:
            out.append((goal, f"{r['speedup']:.2f}x", r["speedup"] >= target))
    return out


def _verdict(met: bool | None) -> str:
    return {True: "met", False: "**missed**", None: "not measured"}[met]


def _ms(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f} ms"


def _us(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f} µs"


def _gib(n: float | None) -> str:
    return "–" if n is None else f"{n / 2**30:.1f} GiB"


def table(results: dict[str, Any], figure: str | None = None) -> str:
    """The markdown the benchmark prints and writes into the README: the setting, one row per GPU
    count (skipped ones said), the goals, and the figure when one was drawn (`figure`: its path
    relative to the README)."""
    setting = [f"driver {results['driver']}", f"CUDA toolkit {results['nvcc']}"]
    setting += [f"torch {str(results['torch']).split('+')[0]}"]
    setting += [f"NCCL {results['nccl']}"] if results.get("nccl") else []
    setting += [results["date"]]
    link = f", GPU0-GPU1 link {results['link']}" if results.get("link") else ""  # nvidia-smi topo -m
    n_params = sum(_shape_params(results["shape"]))
    lines = [
        f"{results['device']}, {results['gpus_visible']} visible{link} ({', '.join(setting)}). "
        f"{results['label']} ({n_params / 1e9:.2f} B parameters), float16, random weights, batch 1: decode after a "
        f"{results['prompt_len']}-token prompt, {results['steps']} steps timed (median per step). One GPU is lab 5's "
        "model; W GPUs kiln_tp's, its all-reduces in the step's CUDA graphs. Compute: the same step with every "
        "all_reduce made a view (nothing launched); communication: the rest, also per all-reduce. NCCL alone: "
        "one 4096-element float16 all-reduce, 64 in one CUDA graph.",
        "",
        "| GPUs | decode tok/s | ms / step | compute | communication | per all-reduce | NCCL alone | speed-up "
        "| kiln arenas per GPU |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key in sorted({*results["runs"], *results["skipped"]}, key=key_order):
        w, label = key_order(key)[0], _label(key)
        r = results["runs"].get(key)
        if r is None:
            lines.append(f"| {label} | not run: {results['skipped'][key]} | | | | | | | |")
            continue
        comm = _ms(r.get("comm_ms_median")) if w > 1 else "–"
        speed = f"{r['speedup']:.2f}x" if r.get("speedup") is not None else "–"
        lines.append(
            f"| {label} | {r['decode_tokens_per_s']:.1f} | {_ms(r['step_ms_median'])}"
            f" | {_ms(r.get('compute_ms_median'))}"
            f" | {comm} | {_us(r.get('comm_us_per_all_reduce'))} | {_us(r.get('nccl_alone_us'))} | {speed}"
            f" | {_gib(r.get('memory_bytes'))} |"
        )
    ordered = sorted(results["runs"].items(), key=lambda kr: key_order(kr[0]))
    checked = [(k, r["logit_error"]) for k, r in ordered if "logit_error" in r]
    if checked:
        said = ", ".join(f"{_label(k)} GPUs {e:.1e}" for k, e in checked)
        lines += ["", f"Logits against one GPU's (relative L2, the prompt's last position and the first step): {said}."]
    lines += ["", "Goals (the course's, not gates):", ""]
    lines += [
        f"- {goal}: {value}" + (f", {_verdict(met)}" if met is not None else "") for goal, value, met in goals(results)
    ]
    if figure:
        lines += ["", f"![decode step time at each GPU count, compute and communication]({figure})"]
    return "\n".join(lines)


def _label(key: str) -> str:
    """A run's name in the table: "2", or "2, tasks 02+03" for its all-reduces by tasks 02 and 03."""
    return f"{key.split()[0]}, tasks 02+03" if key.endswith(OWN) else key


def _bar_label(key: str, world: int) -> str:
    gpus = f"{world} GPU{'s' * (world > 1)}"
    return f"{gpus},\ntasks 02+03" if key.endswith(OWN) else gpus


def _shape_params(shape: dict[str, Any]) -> list[int]:
    """Parameter counts of the shape: per layer's weights and norms, then the embedding, classifier, norm."""
    d, f, v, layers = shape["dim"], shape["hidden_dim"], shape["vocab_size"], shape["n_layers"]
    kv = d * shape["n_kv_heads"] // shape["n_heads"]
    layer = d * d * 2 + 2 * d * kv + 3 * d * f + 2 * d
    return [layers * layer, 2 * v * d, d]


def plot(results: dict[str, Any], path: Path) -> None:
    """Milliseconds per decode step at each GPU count, compute and communication stacked, each bar
    labelled with its tokens per second and speed-up."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted(results["runs"], key=key_order)
    runs = [results["runs"][k] for k in keys]
    labels = [_bar_label(k, r["world"]) for k, r in zip(keys, runs, strict=True)]
    compute = [r.get("compute_ms_median") or r["step_ms_median"] for r in runs]
    comm = [max(r.get("comm_ms_median") or 0.0, 0.0) for r in runs]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.bar(labels, compute, label="compute", color="#4c72b0")
    ax.bar(labels, comm, bottom=compute, label="communication (all-reduces)", color="#dd8452")
    for i, r in enumerate(runs):
        speed = f", {r['speedup']:.2f}x" if r.get("speedup") is not None else ""
        ax.annotate(
            f"{r['decode_tokens_per_s']:.0f} tok/s{speed}",
            (i, compute[i] + comm[i]),
            ha="center",
            va="bottom",
            fontsize=9,
            xytext=(0, 3),
            textcoords="offset points",
        )
    ax.set_ylabel("ms per decode step")
    ax.set_title(f"{results['label']}, float16, batch 1: {results['device']}", fontsize=10)
    ax.set_ylim(0, 1.2 * max(c + m for c, m in zip(compute, comm, strict=True)))
    ax.legend(loc="upper right", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_readme(text: str) -> None:
    """Replaces the chapter's generated block with `text`."""
    from grader.report.timings import write_bench_block

    write_bench_block(README, BEGIN, END, text)


def gate(results: dict[str, Any]) -> list[str]:
    """What keeps the reference solutions from passing: logits of a GPU count far from one GPU's."""
    return [
        f"{_label(k)} GPUs: logits {r['logit_error']:.3f} (relative L2) from one GPU's, over {MAX_LOGIT_ERROR}"
        for k, r in sorted(results["runs"].items(), key=lambda kr: key_order(kr[0]))
        if r.get("logit_error", 0.0) > MAX_LOGIT_ERROR
    ]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--solutions", action="store_true", help="time the reference solutions (and check them)")
    parser.add_argument("--gpus", type=int, nargs="+", default=list(COUNTS), help="GPU counts (default 1 2 4)")
    parser.add_argument("--steps", type=int, default=STEPS, help=f"decode steps timed (default {STEPS})")
    parser.add_argument("--prompt-len", type=int, default=PROMPT_LEN, help=f"prompt tokens (default {PROMPT_LEN})")
    parser.add_argument(
        "--own-all-reduce",
        action="store_true",
        help="also run each count of 2 or more with tasks 02 and 03's all-reduces in NCCL's place",
    )
    parser.add_argument(
        "--write-readme", action="store_true", help=f"the table and figure into {README.relative_to(ROOT)}"
    )
    args = parser.parse_args(argv)
    if args.steps < 1 or args.prompt_len < 1:
        parser.error("--steps and --prompt-len must be at least 1")
    if any(w < 1 for w in args.gpus):
        parser.error("--gpus takes GPU counts of at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    use_lab(args.solutions)
    import torch

    if not torch.cuda.is_available():
        sys.exit("bench_tp.py needs a GPU")
    results = run_counts(args)
    figure = None
    if args.write_readme and results["runs"]:
        plot(results, FIGURE)
        figure = str(FIGURE.relative_to(LAB))
        print(f"wrote {FIGURE.relative_to(ROOT)}")
    text = table(results, figure)
    print(text)
    from grader.report.timings import save_bench_results

    print(f"wrote {save_bench_results(LAB, results, args.solutions).relative_to(ROOT)}")
    problems = gate(results)
    if args.write_readme:
        cmd = "python lab6/bench_tp.py" + (" --solutions" if args.solutions else "")
        failed = f" (its check failed: {'; '.join(problems)})" if problems else ""
        write_readme(f"Measured by `{cmd}` on {results['date']}{failed}:\n\n{text}")
        print(f"wrote the table into {README.relative_to(ROOT)}")
    for p in problems:
        print(f"{'GATE' if args.solutions else 'WARNING'}: {p}", file=sys.stderr)
    return 1 if problems and args.solutions else 0


if __name__ == "__main__":
    from bench_tp import main as _main  # by its module name: the ranks find bench_rank there

    sys.exit(_main())
