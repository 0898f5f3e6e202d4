"""Lab 6's peer benchmark: every pair of GPUs, its link, its copy bandwidth and its round-trip latency.

    python lab6/bench_peer.py                   # every ordered pair of the GPUs this process sees
    python lab6/bench_peer.py --write-readme    # and the table into lab6/README.md (section 1)

Needs 2 GPUs or more (with fewer it says so and exits 0). For each ordered pair, GPU i reading GPU
j's memory:

- link: what `nvidia-smi topo -m` prints between them (NV18: 18 bonded NVLinks; PIX, PXB, PHB,
  NODE, SYS: PCIe paths, chapter section 1);
- rated: that link's rated speed in one direction (rated_gb_s): NVLinks times the rate of one
  link of the card's NVLink generation, or for a PCIe path the slower GPU's PCIe generation and
  width as nvidia-smi reports them;
- copy: COPY_BYTES copied from GPU j's memory into GPU i's by the copy engines (torch's
  dst.copy_(src), with peer access, which torch enables at its first such copy), timed with CUDA
  events on GPU i, the median of REPS; GB/s of one direction;
- round trip: peer_latency.cu (given, built by the grader's nvcc build): one thread on each GPU
  passing a flag back and forth through each other's memory ROUNDS times; the median of REPS
  calls, per round trip. Half of it is one crossing of the link: what each barrier of tasks 02 and
  03 waits for, at least.

Prints a markdown table and writes lab6/results/my-peer.json; --write-readme writes peer.json
instead and the block between `<!-- bench-peer:begin -->` and `<!-- bench-peer:end -->` in
lab6/README.md (section 1).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

LAB = Path(__file__).resolve().parent
ROOT = LAB.parent
README = LAB / "README.md"
RESULTS = LAB / "results"  # peer.json with --write-readme (committed with the chapter), else my-peer.json
BEGIN, END = "<!-- bench-peer:begin -->", "<!-- bench-peer:end -->"
LATENCY_SOURCE = "peer_latency.cu"
COPY_BYTES = 256 << 20
REPS = 10
ROUNDS = 10_000


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def smi_index(ordinal: int) -> int:
    """nvidia-smi's index of CUDA device `ordinal`: through CUDA_VISIBLE_DEVICES where it lists
    indices, else the same number (CUDA orders identical GPUs by PCI bus, as nvidia-smi does)."""
    visible = [x.strip() for x in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
    if ordinal < len(visible) and visible[ordinal].isdigit():
        return int(visible[ordinal])
    return ordinal


def latency_library() -> ctypes.CDLL:
    from grader.build import shared_library

    path = shared_library(LATENCY_SOURCE, [LAB / LATENCY_SOURCE], group="lab6", stem="peer_latency")
    lib = ctypes.CDLL(str(path))
    lib.peer_round_trip.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_float)]
    lib.peer_round_trip.restype = ctypes.c_int
    return lib


def round_trip_us(lib: ctypes.CDLL, i: int, j: int) -> float:
    """Microseconds per round trip of a flag between GPUs i and j: the median of REPS calls."""
    times = []
    for _ in range(REPS):
        us = ctypes.c_float()
        err = lib.peer_round_trip(i, j, ROUNDS, ctypes.byref(us))
        if err:
            from grader.build import cuda_error_string

            raise RuntimeError(f"peer_round_trip({i}, {j}) returned {cuda_error_string(err)}")
        times.append(us.value)
    return statistics.median(times)


def copy_gb_s(i: int, j: int) -> float:
    """GB/s of COPY_BYTES copied from GPU j's memory into GPU i's by the copy engines, one direction."""
    import torch

    n = COPY_BYTES // 4
    src = torch.ones(n, device=f"cuda:{j}")
    dst = torch.empty(n, device=f"cuda:{i}")
    with torch.cuda.device(i):
        dst.copy_(src)  # the first: torch enables peer access here
        torch.cuda.synchronize(i)
        torch.cuda.synchronize(j)
        times = []
        for _ in range(REPS):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
    if not bool((dst[:: 1 << 20] == 1).all()):
        raise RuntimeError(f"the copy from GPU {j} into GPU {i} did not arrive")
    return COPY_BYTES / (statistics.median(times) * 1e-3) / 1e9


def measure() -> dict[str, Any]:
    import torch

    from grader.toolchain import gpu_topology, gpus, link_rated_gb_s, nvcc_version, pcie_links

    count = torch.cuda.device_count()
    found = gpus()
    topo, pcie = gpu_topology(), pcie_links()
    major = torch.cuda.get_device_capability(0)[0]
    lib = latency_library()
    pairs = []
    for i in range(count):
        for j in range(count):
            if i == j:
                continue
            link = topo.get((smi_index(i), smi_index(j)))
            row: dict[str, Any] = {
                "reader": i,
                "source": j,
                "link": link,
                "rated_gb_s": link_rated_gb_s(link, major, [pcie.get(smi_index(k)) for k in (i, j)]),
                "peer_access": torch.cuda.can_device_access_peer(i, j),
            }
            say(f"GPU {i} <- GPU {j} ({link or 'link unknown'})")
            row["copy_gb_s"] = copy_gb_s(i, j)
            row["round_trip_us"] = round_trip_us(lib, i, j) if row["peer_access"] else None
            pairs.append(row)
    return {
        "device": found[0].name if found else torch.cuda.get_device_name(0),
        "driver": found[0].driver if found else "unknown",
        "nvcc": nvcc_version(),
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "gpus_visible": count,
        "copy_bytes": COPY_BYTES,
        "reps": REPS,
        "rounds": ROUNDS,
        "pairs": pairs,
    }


def beyond_the_link(results: dict[str, Any]) -> list[str]:
    """Copies past their link's rated speed (5% allowed for the rating's rounding): a timing gone
    wrong, never a result."""
    return [
        f"GPU {p['reader']} <- GPU {p['source']}: {p['copy_gb_s']:.0f} GB/s past the {p['link']} link's rated "
        f"{p['rated_gb_s']:.0f} GB/s"
        for p in results["pairs"]
        if p.get("rated_gb_s") and p["copy_gb_s"] > 1.05 * p["rated_gb_s"]
    ]


def table(results: dict[str, Any]) -> str:
    """The markdown the bench prints and writes into the chapter."""
    setting = f"driver {results['driver']}, CUDA toolkit {results['nvcc']}, torch {str(results['torch']).split('+')[0]}"
    lines = [
        f"{results['device']} x {results['gpus_visible']} ({setting}, {results['date']}). Copy: "
        f"{results['copy_bytes'] >> 20} MB by the copy engines into the reader's memory, the median of "
        f"{results['reps']}; round trip: a flag passed back and forth {results['rounds']} times between one "
        "thread on each GPU, the median of "
        f"{results['reps']} runs. Rated: one direction of the link (NVLinks x the generation's rate a link).",
        "",
        "| reader <- source | link | rated | copy | of rated | round trip | one way |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p in results["pairs"]:
        rated = p.get("rated_gb_s")
        share = f"{100 * p['copy_gb_s'] / rated:.0f}%" if rated else "–"
        rt = p.get("round_trip_us")
        trip = "no peer access" if rt is None else f"{rt:.2f} µs"
        half = "–" if rt is None else f"{rt / 2:.2f} µs"
        lines.append(
            f"| GPU {p['reader']} <- GPU {p['source']} | {p.get('link') or '?'} | "
            f"{'–' if rated is None else f'{rated:.0f} GB/s'} | {p['copy_gb_s']:.0f} GB/s | {share} | {trip} | {half} |"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--write-readme", action="store_true", help=f"the table into {README.relative_to(ROOT)} (section 1)"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import torch

    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if seen < 2:
        print(f"bench_peer.py: needs 2 GPUs to measure a pair; this machine shows {seen}: nothing to do")
        return 0
    results = measure()
    text = table(results)
    print(text)
    impossible = beyond_the_link(results)
    if impossible:
        print("\n".join(["bench_peer.py: figures no link can carry, nothing written:", *impossible]), file=sys.stderr)
        return 1
    out = RESULTS / ("peer.json" if args.write_readme else "my-peer.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out.relative_to(ROOT)}")
    if args.write_readme:
        from grader.report.timings import write_bench_block

        said = f"Measured by `python lab6/bench_peer.py` on {results['date']}:\n\n{text}"
        write_bench_block(README, BEGIN, END, said)
        print(f"wrote the table into {README.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
