"""Runs a CUDA-library task in the task process: each case through ctypes, then the timing.

Inputs are seeded; the reference is computed on clones before any student code runs; outputs are
guarded (pre-filled, fenced) and judged element by element; a deterministic task runs twice and
the two runs must agree bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grader.child import devices, observe, timing
from grader.child.buffers import PREFILL, Guarded, bits, guarded, twin
from grader.child.compare import judge
from grader.child.context import RunContext, chosen_cases, returned_error
from grader.child.ffi import EntryPoint, HarnessError, Library
from grader.records import CaseRecord, CheckFailure, ChildJob, DeviceInfo, Phase, Stage, Timing, TimingMode, Verdict
from grader.tasks.seeds import seed_for
from grader.tasks.spec import Buffer, Case, CudaTask, Entry, Rng, Values, clone_values

if TYPE_CHECKING:
    from grader.child.__main__ import Recorder


def _is_cuda_error(e: BaseException) -> bool:
    text = str(e)
    return any(mark in text for mark in ("CUDA error", "CUBLAS_STATUS", "CUDNN_STATUS"))


def cuda_failure(e: BaseException, where: str) -> CheckFailure:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    hint = ""
    if "illegal memory access" in first or "illegal address" in first:
        hint = (
            ": a thread read or wrote outside its buffer — check the bounds guard and the index math;"
            " `make sanitize-labN` names the line"
        )
    elif "no kernel image" in first:
        hint = ": the library was built for another architecture than this GPU's — unset GRADER_ARCH"
    elif "misaligned" in first:
        hint = ": a vector load or store at an address that is not a multiple of its size"
    return CheckFailure(Verdict.CRASH, f"{first} during {where}{hint}")


def prepare(
    task: CudaTask, entry: Entry, inputs: dict[str, Any], shapes: dict[str, tuple[int, ...]]
) -> tuple[dict[str, Any], dict[str, Guarded]]:
    """The argument values for one call: inputs as given, outputs freshly guarded."""
    values: dict[str, Any] = {}
    outs: dict[str, Guarded] = {}
    for arg in entry.args:
        if not isinstance(arg, Buffer):
            values[arg.name] = inputs[arg.name]
            continue
        device = devices.where(arg)
        if arg.role == "in":
            t = inputs[arg.name]
            values[arg.name] = t.numpy() if arg.host else t
        else:
            g = guarded(shapes[arg.name], arg.dtype, device, inputs.get(arg.name) if arg.role == "inout" else None)
            outs[arg.name] = g
            values[arg.name] = g.data.numpy() if arg.host else g.data
    return values, outs


def check_outputs(task: CudaTask, entry: Entry, outs: dict[str, Guarded], expected: dict[str, Any], where: str) -> None:
    for arg in entry.buffers():
        if arg.role == "in":
            continue
        g = outs[arg.name]
        fence = g.fence_report()
        if fence:
            raise CheckFailure(Verdict.WRONG, f"`{arg.name}`: wrote out of bounds during {where}: {fence}")
        atol, rtol = task.tol(arg.dtype, entry)
        nw = g.never_written() if arg.role == "out" else None
        report = judge(arg.name, g.data, expected[arg.name].to(g.data.device), atol, rtol, nw)
        if report:
            raise CheckFailure(Verdict.WRONG, f"{where}: {report}")


def seeded_inputs(task: CudaTask, entries: Sequence[Entry], case: Case, draw: int = 0) -> Values:
    """One seeded draw of the case's inputs, made on the GPU; host arguments moved to the CPU, those
    of another device than 0 (a task of several GPUs) moved there."""
    inputs = task.make_inputs(case.params, Rng(seed_for(task, case.label, draw), "cuda"))
    for e in entries:
        for arg in e.buffers("in") + e.buffers("inout"):
            if arg.host:
                inputs[arg.name] = inputs[arg.name].cpu().contiguous()
    return devices.place(list(entries), inputs)


def inputs_and_reference(
    task: CudaTask, entry: Entry, case: Case, draw: int = 0
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The case's seeded inputs (host arguments moved to the CPU) and the reference computed on
    clones of them, before any student code runs."""
    inputs = seeded_inputs(task, [entry], case, draw)
    # a huge case has no room for clones; references are pure functions of their inputs anyway
    return inputs, devices.reference(task, entry, inputs, clone=not case.huge)


def run_case(task: CudaTask, entry: Entry, ep: EntryPoint, case: Case, ctx: RunContext, draw: int = 0) -> CaseRecord:
    import torch

    where = f"{entry.symbol}, case {case.label}" + (f" (random draw {draw + 1})" if draw else "")
    inputs, expected = inputs_and_reference(task, entry, case, draw)
    shapes = task.shapes(inputs, expected)
    if case.huge:  # tens of GB: no room for clones; the smaller cases check the inputs and the races
        values, outs = prepare(task, entry, inputs, shapes)
        call(ep, values, where)
        check_outputs(task, entry, outs, expected, where)
        return CaseRecord(case.label, entry.symbol)
    clones = clone_values(inputs)
    values, outs = prepare(task, entry, inputs, shapes)
    call(ep, values, where)
    for arg in entry.buffers("in"):
        if not torch.equal(inputs[arg.name], clones[arg.name]):
            changed = int((inputs[arg.name] != clones[arg.name]).sum())
            raise CheckFailure(
                Verdict.WRONG,
                f"{where}: input `{arg.name}` was modified ({changed} elements changed); inputs are read-only",
            )
    judged_after_call(lambda: check_outputs(task, entry, outs, expected, where), where)
    if task.deterministic:  # the same inputs at equally aligned addresses: only a race can differ
        # copies of the inputs the first run read (checked unchanged above), not of their clones:
        # a clone of a view one float into its buffer is contiguous and aligned
        values2, outs2 = prepare(task, entry, {k: twin(v) for k, v in inputs.items()}, shapes)
        call(ep, values2, where + " (second run)")

        def agree() -> None:
            for name, g in outs.items():
                a, b = bits(g.data, g.dtype), bits(outs2[name].data, g.dtype)
                if not torch.equal(a, b):
                    n = int((a != b).sum())
                    raise CheckFailure(
                        Verdict.WRONG,
                        f"{where}: two runs on the same inputs disagree at {n} elements of `{name}`: a race "
                        f"(a missing __syncthreads, or threads writing the same place without atomics)",
                    )

        judged_after_call(agree, where + " (second run)")
    called_again(task, entry, ep, case, draw, inputs, values, outs, shapes, where)
    return CaseRecord(case.label, entry.symbol)


REPEAT_DRAW = 1 << 20  # the draw of the inputs a repeated call gets: no case or timing round uses it


def called_again(
    task: CudaTask,
    entry: Entry,
    ep: EntryPoint,
    case: Case,
    draw: int,
    inputs: dict[str, Any],
    values: dict[str, Any],
    outs: dict[str, Guarded],
    shapes: dict[str, tuple[int, ...]],
    where: str,
) -> None:
    """The call once more with the very same arguments, its input buffers refilled in place with
    another draw and its outputs poisoned again. Code that remembers its arguments (pointers,
    sizes) and skips or replays work when they come again, or that kept a copy of an input (the
    weights) from the first call, is right the first time and wrong now: the verdict says so."""
    import torch

    fresh = seeded_inputs(task, [entry], case, REPEAT_DRAW + draw)
    for arg in entry.args:
        if not isinstance(arg, Buffer):  # the same scalars as the first call: only the buffers change
            fresh[arg.name] = inputs[arg.name]
    refilled = [a for a in entry.buffers("in") if isinstance(inputs.get(a.name), torch.Tensor)]
    expected = None
    if all(_same_layout(inputs[a.name], fresh.get(a.name)) for a in refilled):
        expected = devices.reference(task, entry, fresh)
        if task.shapes(fresh, expected) != shapes:
            expected = None  # the new draw's outputs have other shapes than the buffers the call got
    if expected is not None:
        again = dict(fresh)
        for arg in refilled:  # the same buffers, refilled
            inputs[arg.name].copy_(fresh[arg.name])
            again[arg.name] = inputs[arg.name]
    else:
        # this case's draws differ in shape (lab 4 draws a broadcast per seed): keep the first draw's
        # structure (its sizes, its integer buffers) and give each floating-point input new values
        again = dict(inputs)
        gen = torch.Generator(device="cpu").manual_seed(REPEAT_DRAW + draw)
        for arg in refilled:
            t = inputs[arg.name]
            if t.is_floating_point() and t.numel():
                new = torch.randn(t.shape, generator=gen, dtype=torch.float32)
                new = new.abs() if bool((t >= 0).all()) else new
                spread = float(t.float().std()) if t.numel() > 1 else float(t.float().abs().sum())
                t.copy_(new.mul_(spread or 1.0).to(t.device, t.dtype))
        expected = devices.reference(task, entry, again)
    for arg in entry.buffers():
        if arg.role == "out":
            bits(outs[arg.name].data, outs[arg.name].dtype).fill_(PREFILL[outs[arg.name].dtype])
        elif arg.role == "inout":
            outs[arg.name].data.copy_(again[arg.name].reshape(outs[arg.name].shape))
    if any(b.host for b in entry.buffers()):
        devices.synchronize()
    there = f"{where} (called again with the same buffers, refilled with new inputs)"
    call(ep, values, there)
    try:
        judged_after_call(lambda: check_outputs(task, entry, outs, expected, there), there)
    except CheckFailure as e:
        if e.verdict != Verdict.WRONG or STREAM_CAUSE in e.message or OTHER_DEVICE_CAUSE in e.message:
            raise
        raise CheckFailure(
            Verdict.WRONG,
            f"{e.message}\nThe first call with these buffers was right: the code recognised its arguments and "
            f"skipped or replayed work, or kept a copy of an input from an earlier call. Each call must compute "
            f"its outputs from what its inputs hold when it is made.",
        ) from None


def _same_layout(a: Any, b: Any) -> bool:
    return getattr(b, "shape", None) == a.shape and getattr(b, "dtype", None) == a.dtype


def call(ep: EntryPoint, values: dict[str, Any], where: str) -> None:
    """One call of a student entry point; an error code or a CUDA error is a crash.

    The whole device is idle before the call (the grader's inputs and poison are in place, on
    whatever stream the student uses); afterwards only torch's current stream is waited for, as
    a caller of a library would. Work the call left running elsewhere is `judged_after_call`'s.
    A task of several GPUs: every one of its devices is idle before the call, the others are then
    held busy (devices.hold_others) so that work launched there instead of on the launching device
    shows, and the call must leave device 0 current."""
    import torch

    try:
        devices.synchronize()
        devices.hold_others()
        rc = ep(values)
        devices.check_current(where)
        torch.cuda.current_stream().synchronize()
    except RuntimeError as e:
        raise cuda_failure(e, where) from None
    if rc != 0:
        raise CheckFailure(Verdict.CRASH, returned_error(ep.lib, ep.symbol, rc, where))


STREAM_CAUSE = (
    "the work ran on a stream the grader does not wait on (a private non-blocking stream?): launch on the "
    "default stream"
)
OTHER_DEVICE_CAUSE = (
    "the work ran on another device than the launching one, device 0 (a kernel launched after cudaSetDevice(1)?), "
    "or on a stream the grader does not wait on: launch on device 0's default stream"
)


def stream_failure(where: str) -> CheckFailure:
    if devices.count() > 1:
        return CheckFailure(
            Verdict.WRONG,
            f"{where}: the outputs are right only when the grader waits for every GPU of the task, not for "
            f"device 0's stream: {OTHER_DEVICE_CAUSE}",
        )
    return CheckFailure(
        Verdict.WRONG,
        f"{where}: the outputs are right only when the grader waits for the whole device, not for its own "
        f"stream: {STREAM_CAUSE}",
    )


def judged_after_call(judge: Callable[[], None], where: str) -> None:
    """Runs `judge` (which raises a CheckFailure) after `call`, which waited for torch's stream
    only. A wrong verdict is judged again once the whole device is idle: right then means the
    work ran on a stream nobody waits on, and the student is told that instead of a mismatch."""

    try:
        judge()
    except CheckFailure as first:
        if first.verdict != Verdict.WRONG:
            raise
        try:
            devices.synchronize()
        except RuntimeError as e:
            raise cuda_failure(e, where) from None
        judge()  # still wrong: this (settled) report is the one to show
        raise stream_failure(where) from None


def time_entry(
    task: CudaTask, entry: Entry, ep: EntryPoint, case: Case, budget: timing.Budget, limits: timing.Limits
) -> Timing:
    """The entry point on the timing case against its torch baseline, over rotating buffer sets
    (grader/child/ladder.py, which times ladders the same way)."""
    from grader.child.ladder import time_case  # builds on this module

    baselines = {"torch": entry.baseline} if entry.baseline is not None else {}
    (row,) = time_case(task, [(entry, ep)], baselines, case, budget, limits)
    return row


def device_info() -> DeviceInfo:
    import torch

    props = torch.cuda.get_device_properties(0)
    return DeviceInfo(
        name=props.name,
        cc=f"{props.major}.{props.minor}",
        sms=props.multi_processor_count,
        l2_bytes=getattr(props, "L2_cache_size", None),
        torch=torch.__version__,
        torch_cuda=torch.version.cuda,
    )


def card_skips(task: CudaTask) -> dict[str, str]:
    """The task's entry points that this process's GPU (device 0) cannot run, each with the reason:
    an entry built for another compute capability (Entry.min_cc, max_cc; lab 2's rung 4 is sm_90's)."""
    import torch

    props = torch.cuda.get_device_properties(0)
    return task.skipped((props.major, props.minor))


def skip_notes(skipped: dict[str, str]) -> list[str]:
    return [f"{why}: `{symbol}` is skipped here (neither checked, timed nor scored)" for symbol, why in skipped.items()]


def run(task: CudaTask, job: ChildJob, rec: Recorder) -> None:
    import torch

    if not torch.cuda.is_available():
        rec.set(
            verdict=Verdict.SKIPPED,
            message="torch sees no CUDA GPU (torch.version.cuda = "
            f"{torch.version.cuda}): install a CUDA build of torch, or run on a GPU machine",
        )
        return
    devices.use(task.gpus)
    if torch.cuda.device_count() < task.gpus:  # the grading process counted otherwise: say so, do not fail
        rec.set(
            verdict=Verdict.SKIPPED,
            message=f"{task.task_id} needs {task.gpus} GPUs; the task process sees {torch.cuda.device_count()}",
        )
        return
    rec.set(device=device_info())
    torch.cuda.init()
    skipped = card_skips(task)
    if skipped and len(skipped) == len(task.entries):
        rec.set(verdict=Verdict.SKIPPED, message="; ".join(skipped.values()), skipped=skipped)
        return
    entries = [e for e in task.entries if e.symbol not in skipped]  # the ones this card runs
    rec.set(skipped=skipped)
    assert job.lib is not None, "a CUDA task's job names its built library"
    # what the build recorded about the task's kernels, read before any of the task's code loads
    facts = observe.read_facts(Path(job.lib)) if observe.observed_rules(task) else None
    lib = Library(Path(job.lib))
    ctx = RunContext(task, lib)
    ctx.notes += skip_notes(skipped)
    eps = {e.symbol: lib.function(e.symbol, e.args) for e in task.entries}
    report = rec.report
    try:
        for check in task.checks:
            rec.at(Stage.CHECKING, f"check {check.__name__}")
            check(ctx)
        for case in chosen_cases(task.cases, job):
            draws = task.seeds if case.small and not job.sanitize else 1
            for entry in entries:
                for draw in range(draws):
                    rec.at(Stage.CHECKING, f"{entry.symbol}, case {case.label}")
                    report.cases.append(run_case(task, entry, eps[entry.symbol], case, ctx, draw))
        ladder = job.timing == TimingMode.LADDER and task.ladder is not None
        timed = task.timed_cases(bench=job.timing == TimingMode.LADDER)  # ladder: make bench-labN
        if job.timing != TimingMode.OFF and not job.sanitize and (timed or ladder):
            budget = timing.QUICK if job.timing == TimingMode.QUICK else timing.BENCH
            rec.at(Stage.TIMING, "measuring the card's limits (copy and read bandwidth)")
            limits = timing.measure_limits()
            scored = {task.timing_case, *(p.case for p in task.perf)}
            for case in timed:
                # a sweep case is for the throughput plot: an entry without a baseline has no line there
                swept = [e for e in entries if e.symbol in task.sweep_entries or not task.sweep_entries]
                timed_here = entries if case.label in scored else [e for e in swept if e.baseline is not None]
                for entry in timed_here:
                    rec.at(Stage.TIMING, f"timing {entry.symbol}, case {case.label}")
                    row = time_entry(task, entry, eps[entry.symbol], case, budget, limits)
                    row.sweep = case.label not in scored
                    report.timings.append(row)
            if ladder:
                from grader.child.ladder import run_ladder

                report.timings += run_ladder(task, eps, limits, rec, budget, skipped)
        # the rules on what a call launched: once per task, after the timing, which the profiler
        # (CUPTI) must not disturb
        if observe.observed_rules(task):
            rec.at(Stage.OBSERVING, "observing one call of each entry point the rules name (torch.profiler)")
            observe.check(task, job, facts, eps, ctx.notes, skipped)
    except CheckFailure as f:
        rec.set(verdict=f.verdict, message=f.message.replace("sanitize-labN", f"sanitize-{task.lab}"), notes=ctx.notes)
        return
    except RuntimeError as e:
        # a CUDA error is the student's crash; any other error is the grader's own bug
        if isinstance(e, HarnessError) or not _is_cuda_error(e):
            raise
        message = cuda_failure(e, str(report.phase)).message.replace("sanitize-labN", f"sanitize-{task.lab}")
        rec.set(verdict=Verdict.CRASH, message=message, notes=ctx.notes)
        return
    rec.set(verdict=Verdict.PASS, message="", notes=ctx.notes, phase=Phase(Stage.DONE))
