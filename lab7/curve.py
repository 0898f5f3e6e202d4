"""Lab 7's loss curve (task 06): your training step against PyTorch's, 300 steps from one seed.

    python lab7/curve.py                              # your gpt/ package and kernels
    python lab7/curve.py --solutions --write-readme   # the reference's, into lab7/README.md and a figure

Needs a GPU. Task 06's spec judges this curve (lab7/tests/test_06_gpt_step.py,
test_loss_curve_matches_pytorch); this script draws it. The small GPT of gpt/model.py's defaults
is trained for TrainConfig().steps steps twice, from the same initial weights on the same batches of
lab 5's stories: by task 06's Trainer (every operator yours) and by the spec's Reference, the same
model in plain PyTorch (F.layer_norm, F.linear, F.scaled_dot_product_attention, F.cross_entropy,
bf16 weights, a float32 master and torch's fused AdamW). The figure shows both losses and their
relative difference at every step against the spec's allowance (CURVE_RTOL, 1%).

Writes lab7/results/loss-curve.json (--solutions: reference-curve.json) and prints the summary;
--write-readme draws lab7/figures/loss-curve.png and replaces the block between
`<!-- bench-lab7-curve:begin -->` and `<!-- bench-lab7-curve:end -->` in lab7/README.md. Exits
non-zero when a loss is not finite or a step's loss is past the allowance: the spec's verdict.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

LAB = Path(__file__).resolve().parent
ROOT = LAB.parent
README = LAB / "README.md"
FIGURE = LAB / "figures" / "loss-curve.png"
SPEC = LAB / "tests" / "test_06_gpt_step.py"
BEGIN, END = "<!-- bench-lab7-curve:begin -->", "<!-- bench-lab7-curve:end -->"


def spec() -> Any:
    """Task 06's spec as a module: its Reference trainer and its allowance, CURVE_RTOL."""
    found = importlib.util.spec_from_file_location("lab7_spec_06", SPEC)
    assert found is not None and found.loader is not None
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module


def train(solutions: bool) -> dict[str, Any]:
    """Both runs, one after the other on this GPU; the losses of every step."""
    sys.path.insert(0, str(LAB))
    from bench_gpt import use_lab  # gpt/ and the kernels, as the GPT-2 bench stages them

    use_lab(solutions)
    import torch

    if not torch.cuda.is_available():
        sys.exit("curve.py needs an NVIDIA GPU: none is visible (torch.cuda.is_available() is False)")
    from gpt import data
    from gpt.model import GPTConfig
    from gpt.train import TrainConfig, Trainer

    s = spec()
    cfg, tc = GPTConfig(), TrainConfig()
    stream, _ = data.tokens()
    batches = data.Batches(stream, tc.batch, cfg.context, tc.seed)
    trainer = Trainer(cfg, tc)
    yours = [trainer.step(*batches[k]) for k in range(tc.steps)]
    del trainer
    ref = s.Reference(cfg, tc)
    pytorch = [ref.step(*batches[k]) for k in range(tc.steps)]
    return {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(),
        "solutions": solutions,
        "model": {"n_layer": cfg.n_layer, "n_head": cfg.n_head, "d_model": cfg.d_model, "context": cfg.context},
        "batch": tc.batch,
        "allowed": s.CURVE_RTOL,
        "yours": yours,
        "pytorch": pytorch,
    }


def summary(results: dict[str, Any]) -> dict[str, Any]:
    """The largest relative difference and where, and the ends of both curves."""
    yours, pytorch = results["yours"], results["pytorch"]
    rel = [abs(a - b) / abs(b) if math.isfinite(a) and b else math.inf for a, b in zip(yours, pytorch, strict=True)]
    worst = max(range(len(rel)), key=rel.__getitem__)
    return {"steps": len(yours), "worst_step": worst + 1, "worst": rel[worst], "relative": rel}


def problems(results: dict[str, Any]) -> list[str]:
    """What fails the curve, as the spec fails it."""
    s = summary(results)
    out = []
    if not all(math.isfinite(v) for v in results["yours"]):
        out.append("a loss of yours is not finite")
    elif s["worst"] > results["allowed"]:
        out.append(
            f"step {s['worst_step']}: loss {results['yours'][s['worst_step'] - 1]:.4f}, PyTorch's"
            f" {results['pytorch'][s['worst_step'] - 1]:.4f} ({100 * s['worst']:.2f}% off; allowed"
            f" {100 * results['allowed']:g}%)"
        )
    return out


def text(results: dict[str, Any], figure: str | None = None) -> str:
    s = summary(results)
    m = results["model"]
    line = (
        f"{m['n_layer']} layers × {m['d_model']} ({m['n_head']} heads), {results['batch']} × {m['context']} tokens a"
        f" step: loss {results['yours'][0]:.4f} → {results['yours'][-1]:.4f} in {s['steps']} steps through your"
        f" kernels, {results['pytorch'][0]:.4f} → {results['pytorch'][-1]:.4f} through PyTorch; the largest"
        f" difference {100 * s['worst']:.3f}% at step {s['worst_step']} (allowed {100 * results['allowed']:g}%)."
    )
    return line + (f"\n\n![the two loss curves and their difference]({figure})" if figure else "")


def plot(results: dict[str, Any], path: Path) -> None:
    """The two curves above, their relative difference below with the allowance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = summary(results)
    steps = range(1, s["steps"] + 1)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5), sharex=True, height_ratios=[3, 2])
    top.plot(steps, results["pytorch"], color="#888888", linewidth=2.5, label="PyTorch (F.*, fused AdamW)")
    top.plot(steps, results["yours"], color="#1f77b4", linewidth=1.0, label="your kernels (task 06's Trainer)")
    top.set_ylabel("training loss")
    top.legend(fontsize=9)
    top.set_title(f"Task 06's GPT, {s['steps']} steps from one seed, {results['device']}", fontsize=10)
    bottom.plot(steps, [100 * r for r in s["relative"]], color="#1f77b4", linewidth=1.0)
    bottom.axhline(100 * results["allowed"], color="#d62728", linestyle="--", linewidth=1.0, label="allowed")
    bottom.set_ylabel("|yours − PyTorch's|, %")
    bottom.set_xlabel("step")
    bottom.set_ylim(0, 1.25 * 100 * max(results["allowed"], min(s["worst"], 10 * results["allowed"])))
    bottom.legend(fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--solutions", action="store_true", help="train with the reference solutions")
    parser.add_argument(
        "--write-readme", action="store_true", help=f"the figure and summary into {README.relative_to(ROOT)}"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    results = train(args.solutions)
    out = LAB / "results" / ("reference-curve.json" if args.solutions else "loss-curve.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")
    figure = None
    if args.write_readme:
        plot(results, FIGURE)
        figure = str(FIGURE.relative_to(LAB))
        print(f"wrote {FIGURE.relative_to(ROOT)}")
    body = text(results, figure)
    print(body)
    failed = problems(results)
    if args.write_readme:
        from grader.report.timings import write_bench_block

        cmd = "python lab7/curve.py" + (" --solutions" if args.solutions else "")
        verdict = f" (the spec's check failed: {'; '.join(failed)})" if failed else ""
        write_bench_block(
            README, BEGIN, END, f"Measured by `{cmd}` on {results['date']}, {results['device']}{verdict}:\n\n{body}"
        )
        print(f"wrote the summary into {README.relative_to(ROOT)}")
    for p in failed:
        print(f"ERROR: {p}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
