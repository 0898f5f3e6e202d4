"""Lab 6's all-reduce benchmark: task 02's ring, task 03's one-shot and NCCL, time and bus bandwidth by size.

    python lab6/bench_allreduce.py                              # your 02_ring.cu and 03_one_shot.cu
    python lab6/bench_allreduce.py --solutions --write-readme   # the references: JSON and README block
    python lab6/bench_allreduce.py --world 4 --sizes 8K 64K 256M

Needs 2 GPUs or more (--world, default 2). Builds 02_ring.cu and 03_one_shot.cu (the student's,
or with --solutions the references) into shared libraries with the grader's nvcc build, starts
--world ranks with kiln_tp.launch (device="cuda": rank r on GPU r, one process group) and on each
times, per size of float32 message: the ring, the one-shot and torch.distributed.all_reduce
(NCCL). Each is timed as a decode step runs it: ITERS calls captured in one CUDA graph, replayed
REPS times between CUDA events on rank 0, the median replay over ITERS. Every rank feeds new inputs
before each size; the values do not matter to the time, and the graders check them
(lab6/tests/test_02_ring.py, test_03_one_shot.py), not this script. A library that does not build
or set up (an untouched skeleton) is left out and said so.

Bus bandwidth is NCCL's measure: bytes / time · 2(W - 1) / W (chapter section 2.2). The course's
goals (GOALS), shown met or missed, never asserted: the ring at >= 80% of NCCL's bus bandwidth at
256 MB, the one-shot at >= 1.0x NCCL's speed (NCCL's time over its own) at 64 KB, both at W = 2.

Prints a markdown table; writes lab6/results/reference-allreduce.json (--solutions) or
my-allreduce.json; --write-readme replaces the block between `<!-- bench-allreduce:begin -->` and
`<!-- bench-allreduce:end -->` in lab6/README.md (section 2.6).
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

LAB = Path(__file__).resolve().parent
ROOT = LAB.parent
README = LAB / "README.md"
BEGIN, END = "<!-- bench-allreduce:begin -->", "<!-- bench-allreduce:end -->"
PACKAGES = ["kiln_tp", "../lab5/kiln_llm", "../lab5/llama", "../lab4/kiln"]
# bytes of float32: the decode step's 8 KB to 256 KB, then up to the ring's 256 MB
SIZES = ["8K", "16K", "32K", "64K", "128K", "256K", "1M", "4M", "16M", "64M", "256M"]
ITERS = 20  # calls in one graph
REPS = 10  # timed replays
LAUNCH_TIMEOUT_S = 900.0
# the course's goals at W = 2: (what, size, target); shown, never a gate
GOALS = [("ring bus bandwidth over NCCL's", "256M", 0.80), ("one-shot speed over NCCL's", "64K", 1.0)]


def parse_size(text: str) -> int:
    """ "64K" -> 65536 bytes; K, M, G are powers of 1024; a whole number of float32s."""
    m = re.fullmatch(r"(\d+)([KMG]?)B?", text.strip().upper())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 8K, 64K, 256M)")
    size = int(m[1]) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m[2]]
    if size < 4 or size % 4:
        raise argparse.ArgumentTypeError(f"{text}: a size is a whole number of float32s (a multiple of 4 bytes)")
    return size


def size_label(size: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def bus_bandwidth(size: int, us: float, world: int) -> float:
    """GB/s: NCCL's bus bandwidth of an all-reduce of `size` bytes taking `us` microseconds on `world` ranks."""
    return size / (us * 1e-6) * 2 * (world - 1) / world / 1e9


def use_lab(solutions: bool) -> None:
    """The grader, lab 6's kiln_tp and the labs it imports on sys.path (the ranks start from it)."""
    for folder in (ROOT, ROOT / "lab4", ROOT / "lab5", LAB):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    if solutions:
        from grader.staging import use_packages

        use_packages(LAB, PACKAGES, solutions=True)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from grader.toolchain import gpu_topology, gpus, link_rated_gb_s, nvcc_version, pcie_links
    from kiln_tp import launch
    from kiln_tp.ipc import build_libraries, time_all_reduce

    libs, left_out = build_libraries(args.solutions)
    found = gpus()
    nccl = torch.cuda.nccl.version()
    link, pcie = gpu_topology().get((0, 1)), pcie_links()
    major = int(found[0].compute_capability.split(".")[0]) if found else 0
    times = launch(args.world, time_all_reduce, libs, args.sizes, ITERS, REPS, timeout=LAUNCH_TIMEOUT_S, device="cuda")
    for prefix in libs:
        if prefix not in times:
            left_out[prefix] = "it did not set up (an untouched skeleton returns cudaErrorNotYetImplemented)"
    return {
        "device": found[0].name if found else "unknown GPU",
        "driver": found[0].driver if found else "unknown",
        "nvcc": nvcc_version(),
        "torch": torch.__version__,
        "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
        "date": datetime.date.today().isoformat(),
        "solutions": args.solutions,
        "world": args.world,
        "iters": ITERS,
        "reps": REPS,
        "times_us": {name: {str(size): us for size, us in per.items()} for name, per in times.items()},
        "left_out": left_out,
        "link": link,
        "rated_gb_s": link_rated_gb_s(link, major, [pcie.get(0), pcie.get(1)]) if found else None,
    }


def beyond_the_link(results: dict[str, Any]) -> list[str]:
    """Bus bandwidths past the link's rated speed in one direction (5% allowed for the rating's
    rounding): a figure no link can carry is a timing that went wrong, and stops the run."""
    rated = results.get("rated_gb_s")
    if not rated:
        return []
    return [
        f"{name} at {size_label(int(size))}: {bus:.0f} GB/s of bus bandwidth, past the {results['link']} link's "
        f"rated {rated:.0f} GB/s one way"
        for name, per in sorted(results["times_us"].items())
        for size, us in per.items()
        if (bus := bus_bandwidth(int(size), us, results["world"])) > 1.05 * rated
    ]


def goals(results: dict[str, Any]) -> list[str]:
    """Each goal of GOALS, met or missed, where this run measured it (W = 2 only)."""
    t = results["times_us"]
    lines = []
    for (what, size, target), prefix in zip(GOALS, ("ring", "one_shot"), strict=True):
        key = str(parse_size(size))
        if results["world"] != 2 or key not in t.get(prefix, {}) or key not in t.get("nccl", {}):
            lines.append(f"- {what} at {size_label(int(key))}, 2 GPUs, >= {target:g}x: not measured in this run")
            continue
        ratio = t["nccl"][key] / t[prefix][key]  # bus bandwidths and speeds alike: NCCL's time over this one's
        verdict = "met" if ratio >= target else "**missed**"
        lines.append(f"- {what} at {size_label(int(key))}, 2 GPUs, >= {target:g}x: {ratio:.2f}x, {verdict}")
    return lines


def table(results: dict[str, Any]) -> str:
    """The markdown the benchmark prints and writes into the README."""
    w = results["world"]
    t = results["times_us"]
    names = [n for n in ("ring", "one_shot", "nccl") if n in t]
    title = {"ring": "ring (02)", "one_shot": "one-shot (03)", "nccl": "NCCL"}
    torch_version = str(results["torch"]).split("+")[0]
    lines = [
        f"{results['device']} x {w} (driver {results['driver']}, CUDA toolkit {results['nvcc']}, torch "
        f"{torch_version}, NCCL {results['nccl']}, {results['date']}). float32 sum, in place; "
        f"{results['iters']} calls in one CUDA graph, the median of {results['reps']} replays, per call. "
        "Bus bandwidth: bytes / time x 2(W - 1)/W.",
        "",
        "| size | " + " | ".join(f"{title[n]} time | {title[n]} bus bw" for n in names) + " |",
        "| --- |" + " ---: | ---: |" * len(names),
    ]
    sizes = sorted({int(s) for per in t.values() for s in per})
    for size in sizes:
        cells = []
        for n in names:
            us = t[n].get(str(size))
            cells += ["–", "–"] if us is None else [f"{us:.1f} µs", f"{bus_bandwidth(size, us, w):.1f} GB/s"]
        lines.append(f"| {size_label(size)} | " + " | ".join(cells) + " |")
    if results.get("rated_gb_s"):
        lines += ["", f"GPU0-GPU1 link {results['link']}: rated {results['rated_gb_s']:.0f} GB/s one way."]
    for prefix, why in sorted(results.get("left_out", {}).items()):
        lines.append(f"\n{title[prefix]} left out: {why}")
    lines += ["", "Goals (the course's, not gates):", "", *goals(results)]
    return "\n".join(lines)


def write_readme(text: str) -> None:
    """Replaces the chapter's generated block with `text`."""
    from grader.report.timings import write_bench_block

    write_bench_block(README, BEGIN, END, text)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--solutions", action="store_true", help="time the reference solutions")
    parser.add_argument("--world", type=int, default=2, help="ranks, one GPU each (default 2)")
    parser.add_argument("--sizes", type=parse_size, nargs="+", default=[parse_size(s) for s in SIZES])
    parser.add_argument("--write-readme", action="store_true", help="put the table into lab6/README.md")
    args = parser.parse_args(argv)
    if args.world < 2:
        parser.error("--world is 2 or more: an all-reduce over one GPU is a no-op")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    use_lab(args.solutions)
    import torch

    if torch.cuda.device_count() < args.world:  # make bench-lab6 goes on to its other parts
        seen = torch.cuda.device_count()
        print(f"bench_allreduce.py: skipped, it needs {args.world} GPUs; this machine shows {seen}")
        return 0
    results = run(args)
    text = table(results)
    print(text)
    impossible = beyond_the_link(results)
    if impossible:
        said = ["bench_allreduce.py: figures no link can carry, nothing written:", *impossible]
        print("\n".join(said), file=sys.stderr)
        return 1
    out = LAB / "results" / ("reference-allreduce.json" if args.solutions else "my-allreduce.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out.relative_to(ROOT)}")
    if args.write_readme:
        cmd = "python lab6/bench_allreduce.py" + (" --solutions" if args.solutions else "")
        write_readme(f"Measured by `{cmd}` on {results['date']}:\n\n{text}")
        print(f"wrote the table into {README.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
