"""Per-run time of a 200-node model on kiln's CUDA executor: one CUDA graph per run against eager.

    python lab4/bench_graph.py                               # your kiln (tasks 01 and 03-07 done)
    python lab4/bench_graph.py --solutions --write-readme    # the reference; rewrites the chapter's table

The models: the MLP of the chapter's section 1 (7 launches), chains of 100 and 1000 small adds,
and a chain of 200 pointwise nodes (mul, add, silu, relu + a skip) on small (4, 64) float32
tensors. Every kernel finishes in a few microseconds, so a run's time is almost all launch
overhead, which is what the CUDA graph removes. Each executor is run WARMUP times, then RUNS
times, each run timed alone (torch.cuda.synchronize before and after) and the median kept. It
prints the chapter's table (section 7, "What it saves, measured"), with a caption naming the card,
driver and torch; --write-readme puts both between the chapter's `<!-- bench-lab4:begin -->` and
`<!-- bench-lab4:end -->` markers (`make bench-lab4 SOLUTIONS=1` does). Timing is not graded
(tasks 06-07 check results only).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

LAB = Path(__file__).resolve().parent
README = LAB / "README.md"
BEGIN, END = "<!-- bench-lab4:begin -->", "<!-- bench-lab4:end -->"
NODES = 200
SHAPE = (4, 64)
WARMUP = 20
RUNS = 300


def mlp_graph():
    """The MLP of the chapter's section 1: x (4, 16), two linear layers, a residual; 7 launches."""
    import torch

    import kiln

    g = torch.Generator().manual_seed(0)
    b = kiln.Builder("mlp")
    x = b.input("x", (4, 16), "float32")
    w1 = b.constant("fc1.weight", torch.randn(32, 16, generator=g))
    b1 = b.constant("fc1.bias", torch.zeros(32))
    w2 = b.constant("fc2.weight", torch.randn(16, 32, generator=g))
    h = (x @ w1.permute(1, 0) + b1).relu()  # (4, 32)
    b.output(x + h @ w2.permute(1, 0))  # (4, 16)
    return b.graph


def median_us(fn: Callable[[], object]) -> float:
    import torch

    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(RUNS):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def measure(graph) -> tuple[int, float, float]:
    """(launches per run, eager us per run, graph us per run); the two must agree bit for bit."""
    import torch

    from kiln.cuda import CudaExecutor

    inputs = {n.attrs["name"]: torch.randn(n.type.shape, device="cuda") for n in graph.inputs}
    eager = CudaExecutor(graph, use_graph=False)
    captured = CudaExecutor(graph, use_graph=True)
    for a, b in zip(eager.run(inputs), captured.run(inputs), strict=True):
        if not torch.equal(a, b):
            sys.exit(f"{graph.name}: the graph and eager runs differ: fix tasks 06-07 before timing them")
    return len(eager.launches), median_us(lambda: eager.run(inputs)), median_us(lambda: captured.run(inputs))


def write_readme(text: str) -> None:
    """Replaces the chapter's generated block with `text`."""
    from grader.report.timings import rewrite_marked

    try:
        rewrite_marked(README, BEGIN, END, text)
    except ValueError as e:
        sys.exit(str(e))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--solutions", action="store_true", help="time the reference solutions")
    parser.add_argument("--write-readme", action="store_true", help="write the table into lab4/README.md")
    args = parser.parse_args()
    sys.path.insert(0, str(LAB.parent))  # the grader: it stages the packages and builds the kernels
    from grader.staging import use_packages

    use_packages(LAB, ["kiln"], solutions=args.solutions)
    import torch

    if not torch.cuda.is_available():
        sys.exit("bench_graph.py needs a GPU")
    from kiln.models import adds, chain

    name = torch.cuda.get_device_name()
    models = [
        ("the MLP of [§1](#1-the-ir-a-graph-you-can-print), as written", mlp_graph()),
        ("a chain of 100 small `add`s", adds(100, SHAPE)),
        (
            f"a chain of {NODES} small pointwise nodes (`*`, `+`, `silu`, `relu` and skips;"
            f" {SHAPE[0]} × {SHAPE[1]} float32)",
            chain(NODES, SHAPE),
        ),
        ("a chain of 1000 small `add`s", adds(1000, SHAPE)),
    ]
    lines = [
        "| graph | launches per run | launches, time per run | one graph, time per run | speed-up |",
        "| --- | --- | --- | --- | --- |",
    ]
    for label, graph in models:
        launches, t_eager, t_graph = measure(graph)
        lines.append(f"| {label} | {launches} | {t_eager:.1f} µs | {t_graph:.1f} µs | {t_eager / t_graph:.1f}× |")
        print(lines[-1], flush=True)
    from grader.toolchain import nvcc_version

    driver = _driver()
    caption = (
        f"*{name}, driver {driver}, CUDA toolkit {nvcc_version()}, torch {torch.__version__.split('+')[0]}:"
        f" `python lab4/bench_graph.py"
        f"{' --solutions' if args.solutions else ''}`, {'the reference solutions' if args.solutions else 'your kiln'},"
        f" median of {RUNS} runs each. Written by `make bench-lab4 SOLUTIONS=1`: do not edit by hand.*"
    )
    text = "\n".join([*lines, "", caption])
    print(f"\n{text}")
    if args.write_readme:
        write_readme(text)
        print(f"wrote the table into {README.relative_to(LAB.parent)}")


def _driver() -> str:
    """The NVIDIA driver's version as nvidia-smi gives it, for the caption beside the card."""
    from grader.toolchain import gpus

    found = gpus()
    return found[0].driver if found else "unknown"


if __name__ == "__main__":
    main()
