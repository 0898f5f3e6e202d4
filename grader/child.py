"""The child process that runs one task's checks on the GPU.

It is the only place where student code runs, so a crash, an illegal address or a hang ends
this process alone; the parent turns that into a verdict and goes on with the next task. The
result is a JSON file, rewritten as the run goes, so even a killed child leaves behind which
case it was in.

    python -m grader.child --spec lab1/tests/test_01_vector_add.py --lib build.so --result r.json
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path
from typing import Any

from grader import timing
from grader.buffers import Guarded, bits, guarded
from grader.compare import judge
from grader.context import RunContext, returned_error, seed_for
from grader.ffi import EntryPoint, HarnessError, Library
from grader.loader import load_task
from grader.spec import Buffer, Case, Entry, Rng, Task, clone_values
from grader.verdict import CheckFailure, Verdict


class Recorder:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {"verdict": None, "phase": "starting", "cases": [], "timings": [], "notes": []}

    def set(self, **kw: Any) -> None:
        self.data.update(kw)
        self.flush()

    def flush(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data))
        tmp.replace(self.path)


def _is_cuda_error(e: BaseException) -> bool:
    text = str(e)
    return any(mark in text for mark in ("CUDA error", "CUBLAS_STATUS", "CUDNN_STATUS"))


def cuda_failure(e: BaseException, where: str) -> CheckFailure:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    hint = ""
    if "illegal memory access" in first or "illegal address" in first:
        hint = (
            ": a thread read or wrote outside its buffer — check the bounds guard and the index math;"
            " `make sanitize-lab1` names the line"
        )
    elif "no kernel image" in first:
        hint = ": the library was built for another architecture than this GPU's — unset GRADER_ARCH"
    elif "misaligned" in first:
        hint = ": a vector load or store at an address that is not a multiple of its size"
    return CheckFailure(Verdict.CRASH, f"{first} during {where}{hint}")


def prepare(
    task: Task, entry: Entry, inputs: dict[str, Any], shapes: dict[str, tuple[int, ...]]
) -> tuple[dict[str, Any], dict[str, Guarded]]:
    """The argument values for one call: inputs as given, outputs freshly guarded."""
    values: dict[str, Any] = {}
    outs: dict[str, Guarded] = {}
    for arg in entry.args:
        if not isinstance(arg, Buffer):
            values[arg.name] = inputs[arg.name]
            continue
        device = "cpu" if arg.host else "cuda"
        if arg.role == "in":
            t = inputs[arg.name]
            values[arg.name] = t.numpy() if arg.host else t
        else:
            g = guarded(shapes[arg.name], arg.dtype, device, inputs.get(arg.name) if arg.role == "inout" else None)
            outs[arg.name] = g
            values[arg.name] = g.data.numpy() if arg.host else g.data
    return values, outs


def check_outputs(task: Task, entry: Entry, outs: dict[str, Guarded], expected: dict[str, Any], where: str) -> None:
    for arg in entry.buffers():
        if arg.role == "in":
            continue
        g = outs[arg.name]
        fence = g.fence_report()
        if fence:
            raise CheckFailure(Verdict.WRONG, f"`{arg.name}`: wrote out of bounds during {where}: {fence}")
        atol, rtol = task.tol(arg.dtype)
        nw = g.never_written() if arg.role == "out" else None
        report = judge(arg.name, g.data, expected[arg.name].to(g.data.device), atol, rtol, nw)
        if report:
            raise CheckFailure(Verdict.WRONG, f"{where}: {report}")


def inputs_and_reference(task: Task, entry: Entry, case: Case, draw: int = 0) -> tuple[dict[str, Any], dict[str, Any]]:
    """The case's seeded inputs (host arguments moved to the CPU) and the reference computed on
    clones of them, before any student code runs."""
    inputs = task.make_inputs(case.params, Rng(seed_for(task, case.label, draw), "cuda"))
    for arg in entry.buffers("in") + entry.buffers("inout"):
        if arg.host:
            inputs[arg.name] = inputs[arg.name].cpu().contiguous()
    return inputs, entry.reference(clone_values(inputs))


def run_case(task: Task, entry: Entry, ep: EntryPoint, case: Case, ctx: RunContext, draw: int = 0) -> dict[str, Any]:
    import torch

    where = f"{entry.symbol}, case {case.label}" + (f" (random draw {draw + 1})" if draw else "")
    inputs, expected = inputs_and_reference(task, entry, case, draw)
    clones = clone_values(inputs)
    shapes = task.output_shapes(inputs)
    values, outs = prepare(task, entry, inputs, shapes)
    try:
        rc = ep(values)
        torch.cuda.synchronize()
    except RuntimeError as e:
        raise cuda_failure(e, where) from None
    if rc != 0:
        raise CheckFailure(Verdict.CRASH, returned_error(ep.lib, entry.symbol, rc, f"case {case.label}"))
    for arg in entry.buffers("in"):
        if not torch.equal(inputs[arg.name], clones[arg.name]):
            changed = int((inputs[arg.name] != clones[arg.name]).sum())
            raise CheckFailure(
                Verdict.WRONG,
                f"{where}: input `{arg.name}` was modified ({changed} elements changed); inputs are read-only",
            )
    check_outputs(task, entry, outs, expected, where)
    if task.deterministic:
        values2, outs2 = prepare(task, entry, clones, shapes)
        try:
            rc = ep(values2)
            torch.cuda.synchronize()
        except RuntimeError as e:
            raise cuda_failure(e, where + " (second run)") from None
        for name, g in outs.items():
            a, b = bits(g.data, g.dtype), bits(outs2[name].data, g.dtype)
            if not torch.equal(a, b):
                n = int((a != b).sum())
                raise CheckFailure(
                    Verdict.WRONG,
                    f"{where}: two runs on the same inputs disagree at {n} elements of `{name}`: a race "
                    f"(a missing __syncthreads, or threads writing the same place without atomics)",
                )
    return {"case": case.label, "entry": entry.symbol, "ok": True}


def time_entry(
    task: Task, entry: Entry, ep: EntryPoint, case: Case, budget: timing.Budget, copy_gbps: float
) -> dict[str, Any]:
    import torch

    inputs, expected = inputs_and_reference(task, entry, case)
    shapes = task.output_shapes(inputs)
    values, outs = prepare(task, entry, inputs, shapes)
    marshalled = ep.marshal(values)
    fns: dict[str, Any] = {"student": lambda: ep.call_raw(marshalled)}
    if entry.baseline is not None:
        base_outs = {k: torch.empty(s, dtype=outs[k].data.dtype, device=outs[k].data.device) for k, s in shapes.items()}
        fns["torch"] = lambda: entry.baseline(inputs, base_outs)
    stats = timing.Timer(host=entry.host).compare(fns, budget)
    torch.cuda.synchronize()
    check_outputs(task, entry, outs, expected, f"{entry.symbol}, case {case.label}, re-checked after timing")
    s = stats["student"]
    row: dict[str, Any] = {
        "entry": entry.symbol,
        "case": case.label,
        "median_ms": s.median_ms,
        "q1_ms": s.q1_ms,
        "q3_ms": s.q3_ms,
        "min_ms": s.min_ms,
        "n": s.n,
        "copy_gbps": copy_gbps,
    }
    if "torch" in stats:
        row["baseline_median_ms"] = stats["torch"].median_ms
        row["speedup"] = stats["torch"].median_ms / s.median_ms
    if entry.bytes_moved is not None:
        row["gbps"] = entry.bytes_moved(inputs) / (s.median_ms * 1e-3) / 1e9
        row["share_of_copy"] = row["gbps"] / copy_gbps
    if entry.flops is not None:
        row["gflops"] = entry.flops(inputs) / (s.median_ms * 1e-3) / 1e9
    return row


def run(spec: Path, lib_path: str, rec: Recorder, timing_mode: str, sanitize: bool) -> None:
    import torch

    task = load_task(spec)
    if not torch.cuda.is_available():
        rec.set(
            verdict=str(Verdict.SKIPPED),
            message="torch sees no CUDA GPU (torch.version.cuda = "
            f"{torch.version.cuda}): install a CUDA build of torch, or run on a GPU machine",
        )
        return
    props = torch.cuda.get_device_properties(0)
    rec.set(
        device={
            "name": props.name,
            "cc": f"{props.major}.{props.minor}",
            "sms": props.multi_processor_count,
            "l2_bytes": getattr(props, "L2_cache_size", None),
            "torch": torch.__version__,
            "torch_cuda": torch.version.cuda,
        }
    )
    torch.cuda.init()
    lib = Library(Path(lib_path))
    ctx = RunContext(task, lib)
    eps = {e.symbol: lib.function(e.symbol, e.args) for e in task.entries}
    try:
        for check in task.checks:
            rec.set(phase=f"check {check.__name__}")
            check(ctx)
        for case in task.cases:
            if sanitize and not case.small:
                continue
            draws = task.seeds if case.small and not sanitize else 1
            for entry in task.entries:
                for draw in range(draws):
                    rec.set(phase=f"{entry.symbol}, case {case.label}")
                    rec.data["cases"].append(run_case(task, entry, eps[entry.symbol], case, ctx, draw))
        if timing_mode != "off" and not sanitize and task.timing_case:
            case = next(c for c in task.cases if c.label == task.timing_case)
            budget = timing.BENCH if timing_mode == "bench" else timing.QUICK
            rec.set(phase="measuring copy bandwidth")
            copy = timing.copy_bandwidth_gbps()
            for entry in task.entries:
                rec.set(phase=f"timing {entry.symbol}, case {case.label}")
                rec.data["timings"].append(time_entry(task, entry, eps[entry.symbol], case, budget, copy))
    except CheckFailure as f:
        rec.set(verdict=str(f.verdict), message=f.message, notes=ctx.notes)
        return
    except RuntimeError as e:
        # a CUDA error is the student's crash; any other error is the grader's own bug
        if isinstance(e, HarnessError) or not _is_cuda_error(e):
            raise
        rec.set(verdict=str(Verdict.CRASH), message=cuda_failure(e, rec.data["phase"]).message, notes=ctx.notes)
        return
    rec.set(verdict=str(Verdict.PASS), message="", notes=ctx.notes, phase="done")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grader.child")
    p.add_argument("--spec", type=Path, required=True)
    p.add_argument("--lib", required=True, help="the built library, or - to read its path from stdin")
    p.add_argument("--result", type=Path, required=True)
    p.add_argument("--timing", choices=["off", "quick", "bench"], default="quick")
    p.add_argument("--sanitize", action="store_true", help="small cases only, no timing")
    a = p.parse_args(argv)
    rec = Recorder(a.result)
    rec.flush()
    lib = a.lib
    if lib == "-":  # started before the build finished: torch and CUDA start up while nvcc runs
        import torch

        if torch.cuda.is_available():
            torch.cuda.init()
        lib = sys.stdin.readline().strip()
        if not lib:
            return 0
    try:
        run(a.spec, lib, rec, a.timing, a.sanitize)
    except CheckFailure as f:
        rec.set(verdict=str(f.verdict), message=f.message)
    except Exception:
        rec.set(verdict="grader error", message=traceback.format_exc())
        return 3
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
