"""The rules' run-time half: what one call of an entry point actually did, judged on a GPU.

After a CUDA task's cases pass, each entry point that an observed rule names (grader/tasks/rules.py:
CompiledRule.observed) is called twice on one case, the second call under torch.profiler:

- the kernels it launched, by name; a kernel the task's own library holds (the build record
  beside the library lists them: grader/build/nvcc.py) is the student's, any other came from a
  library (cuBLAS, cuDNN);
- the CUDA runtime and driver calls it made (cudaLaunchKernel, cudaGraphLaunch, cudaMemcpyAsync,
  cudaStreamBeginCapture, cudaMalloc ...), from CUPTI's API trace, kept to the call's own span;
- its copies between host and device, with the kind of host memory each one moved (Kineto names
  them "Memcpy HtoD (Pinned -> Device)").

The first call is not observed: work that belongs to a first call of a size (allocating once,
capturing a graph) is done by then, so the second call shows what every later call does. The
case is the timing case, or the last case when the timing case is the first one the cases ran,
so a graph built for the first call's size only is not mistaken for one built per size.

The rules then judge the launched kernels with the build's facts about them: their SASS (tensor
cores), their inline PTX, their names (CUTLASS's Gemm types). When the profiler cannot observe
(it fails to start, or it records no activity at all), each rule that needed it is reported as
not checked, in the task's notes: it never passes silently.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grader.build.ptxas import demangle
from grader.child import devices
from grader.records import CheckFailure, ChildJob, Verdict
from grader.tasks.rules import OBSERVED_SASS_RULES, opcodes_matching, shown, symbol_matches
from grader.tasks.spec import Case, CudaTask

if TYPE_CHECKING:
    from grader.build.nvcc import BuildFacts, KernelFacts
    from grader.child.ffi import EntryPoint
    from grader.tasks.rules import CompiledRule

WINDOW = "grader::observed_call"  # the record_function span around the student's call
# runtime and driver calls that launch a kernel (not cudaLaunchHostFunc: that runs on the host)
_LAUNCH = re.compile(
    r"^(?:cudaLaunch(?:Kernel|KernelExC|CooperativeKernel|CooperativeKernelMultiDevice)"
    r"|cuLaunch(?:Kernel|KernelEx|CooperativeKernel|CooperativeKernelMultiDevice|Grid|GridAsync))$"
)
# rebuilding a graph: a call that does this for a size it already ran is not replaying one
_GRAPH_BUILD = re.compile(
    r"^(?:cudaStreamBeginCapture|cudaGraphInstantiate\w*|cudaGraphAdd\w*Node|cuStreamBeginCapture)"
)
_API = re.compile(r"^cu(?:da)?[A-Z]\w*$")


@dataclass
class Observation:
    """What one call of an entry point did, as the profiler saw it."""

    entry: str
    case: str
    kernels: list[str] = field(default_factory=list)  # launched, in order, demangled
    api: list[str] = field(default_factory=list)  # CUDA runtime/driver calls, in order, without _v2/_ptsz
    copies: list[str] = field(default_factory=list)  # "Memcpy HtoD (Pinned -> Device)", ...

    def launches(self) -> list[str]:
        return [a for a in self.api if _LAUNCH.match(a)]


def api_name(name: str) -> str:
    """cudaMemcpyAsync_ptsz, cuLaunchKernel_v2 and the like under their plain names."""
    return re.sub(r"(?:_ptsz|_ptds|_v\d+)+$", "", name)


def _squash(name: str) -> str:
    return re.sub(r"\s+", "", name)


def own_kernel(facts: BuildFacts, launched: str) -> KernelFacts | None:
    """The compiled kernel of the task's library that the profiler names `launched`; None for a
    kernel of another library."""
    squashed = _squash(launched)
    for k in facts.kernels:
        if squashed in (_squash(k.kernel), _squash("void " + k.kernel), k.mangled):
            return k
    base = launched.split("(")[0].strip()
    if "<" not in base:  # a plain name: the profiler may leave out the parameters
        for k in facts.kernels:
            if k.kernel.split("(")[0].strip() == base:
                return k
    return None


def _case(task: CudaTask, label: str) -> Case:
    found = [c for c in task.cases if c.label == label]
    assert found, f"{task.task_id}: a rule names case {label!r}, which the task does not have"
    return found[0]


def observed_case(task: CudaTask, job: ChildJob) -> Case | None:
    from grader.child.context import chosen_cases

    cases = [c for c in chosen_cases(task.cases, job) if not c.huge]
    if not cases:
        return None
    timing = [c for c in cases if c.label == task.timing_case]
    if timing and timing[0] is not cases[0]:
        return timing[0]
    return cases[-1]


# --- observing ----------------------------------------------------------------------------------


def profile_call(call: Callable[[], Any]) -> tuple[list[str], list[str], list[str]]:
    """(kernels, API calls, copies) of one `call`, under torch.profiler. Raises what the profiler
    raises; the caller turns that into "not checked"."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function(WINDOW):
            call()
        torch.cuda.synchronize()  # outside the window: the kernels finish inside the profile
    events = list(prof.events())
    window = [e for e in events if e.name == WINDOW and e.device_type == DeviceType.CPU]
    start, end = (window[0].time_range.start, window[0].time_range.end) if window else (float("-inf"), float("inf"))
    kernels: list[tuple[float, str]] = []
    api: list[tuple[float, str]] = []
    copies: list[tuple[float, str]] = []
    for e in events:
        name = getattr(e, "trace_name", None) or e.name
        begin = e.time_range.start
        kind = category(getattr(e, "activity_type", None), name, e.device_type == DeviceType.CUDA)
        if kind == "gpu_memcpy":
            copies.append((begin, name))
        elif kind == "kernel":
            kernels.append((begin, name))
        elif kind == "api" and start <= begin and e.time_range.end <= end:
            api.append((begin, api_name(name)))
    calls = [n for _, n in sorted(api)]
    if not window and calls and calls[-1] == "cudaDeviceSynchronize":
        calls.pop()  # no window to keep it out: the grader's own wait after the call
    return [n for _, n in sorted(kernels)], calls, [n for _, n in sorted(copies)]


# what Kineto calls the device's own records that are no kernel: waits on events and streams
_SYNC_NAMES = ("Event Sync", "Stream Wait Event", "Context Sync", "Stream Sync")


# Kineto's activity types (its trace's "cat"), checked in this order, and what each counts as here
_CATEGORIES = (
    ("gpu_memcpy", "gpu_memcpy"),
    ("gpu_memset", ""),
    ("cuda_sync", ""),
    ("cuda_runtime", "api"),
    ("cuda_driver", "api"),
    ("kernel", "kernel"),
)


def category(activity: object, name: str, on_device: bool) -> str:
    """ "kernel", "gpu_memcpy", "api" (a CUDA runtime or driver call) or "" (anything else: memsets,
    waits, the profiler's own records), from the event's activity type where this torch gives
    one, else from where it ran and its name."""
    text = str(activity or "").lower()
    for kind, said in _CATEGORIES:
        if kind in text:
            return said
    if text and not text.isdigit():
        return ""  # a type this grader does not judge: user annotations, the profiler's own records
    if name == WINDOW:
        return ""  # record_function's span, which Kineto also draws on the device's timeline
    if on_device:
        if name.startswith("Memcpy"):
            return "gpu_memcpy"
        if name.startswith("Memset") or name in _SYNC_NAMES or text == "cuda_sync":
            return ""
        return "kernel"
    return "api" if _API.match(name) else ""


def observe(task: CudaTask, ep: EntryPoint, case: Case) -> Observation:
    from grader.child.cudalib import call, prepare, seeded_inputs

    entry = task.entry(ep.symbol)
    inputs = seeded_inputs(task, [entry], case)
    shapes = task.shapes(inputs, None if task.output_shapes else devices.reference(task, entry, inputs))
    values, _ = prepare(task, entry, inputs, shapes)
    where = f"{entry.symbol}, case {case.label} (observed call)"
    call(ep, values, where)  # the first call of this size does its one-time work here
    kernels, api, copies = profile_call(lambda: ep(values))
    # the profiler leaves a long template kernel's name mangled (CUTLASS's): named as the build
    # record names it, and as a rule's pattern reads it
    return Observation(entry.symbol, case.label, demangle(kernels), api, copies)


# --- judging ------------------------------------------------------------------------------------


def _list(names: Sequence[str], limit: int = 6) -> str:
    shown = [n.split("(")[0] if len(n) < 120 else n[:117] + "..." for n in names[:limit]]
    return ", ".join(shown) + (f", and {len(names) - limit} more" if len(names) > limit else "")


def _kernels_said(o: Observation) -> str:
    n = len(o.kernels)
    if n == 0:
        return "the call launched no kernel"
    return f"the call launched {n} kernel{'s' if n != 1 else ''}: {_list(o.kernels)}"


def judge(rule: CompiledRule, o: Observation, facts: BuildFacts) -> str | None:
    """The violation message for `rule` on observation `o`, or None when the call complies."""

    at = f"`{o.entry}` on case {o.case}"
    own = [k for name in o.kernels if (k := own_kernel(facts, name)) is not None]
    foreign = [name for name in o.kernels if own_kernel(facts, name) is None]
    if rule.kind == "calls_each_time":
        if not any(symbol_matches(rule.pattern, a) for a in o.api):
            made = sorted(set(o.api)) or ["none"]
            wanted = shown(rule.pattern)
            return f"{at}: the call never called {wanted} (its CUDA calls: {_list(made, 10)}): {rule.why}"
    elif rule.kind == "no_runtime_calls":
        bad = [a for a in o.api if symbol_matches(rule.pattern, a)]
        if bad:
            return f"{at}: the call made {_list(sorted(set(bad)))} ({len(bad)} calls): {rule.why}"
    elif rule.kind == "kernels":
        if len(o.kernels) != rule.count:
            count = "one" if rule.count == 1 else str(rule.count)
            return f"{at}: {_kernels_said(o)}; the task asks for {count}: {rule.why}"
    elif rule.kind == "library_kernels":
        if not foreign:
            return f"{at}: {_kernels_said(o)}, all of them your own: no library kernel did the product: {rule.why}"
        if rule.count == -1 and own:  # library_does_the_product(only=True)
            mine = _list([k.kernel for k in own])
            return f"{at}: {_kernels_said(o)}; your own {mine} ran beside the library's: {rule.why}"
    elif rule.kind == "graph_replay":
        graphs = [a for a in o.api if a in ("cudaGraphLaunch", "cuGraphLaunch")]
        rebuilt = [a for a in o.api if _GRAPH_BUILD.match(a)]
        outside = o.launches()
        if not graphs:
            said = f"{_kernels_said(o)}, with {len(outside)} direct launches"
            return f"{at}: the call launched no CUDA graph ({said}): {rule.why}"
        if rebuilt:
            return (
                f"{at}: the call rebuilt its graph ({_list(sorted(set(rebuilt)))}) although the same size ran just "
                f"before: a graph is built once per size and replayed: {rule.why}"
            )
        if outside:
            return (
                f"{at}: beside its cudaGraphLaunch the call launched {len(outside)} kernels directly "
                f"({_list(outside)}): the graph must do the work: {rule.why}"
            )
    elif rule.kind == "pinned_copies":
        host = [c for c in o.copies if "HtoD" in c or "DtoH" in c]
        pageable = [c for c in host if "Pageable" in c]
        if not host:
            return f"{at}: the call copied nothing between host and device: {rule.why}"
        if pageable:
            share = f"{len(pageable)} of the call's {len(host)} host-device copies"
            return f"{at}: {share} moved pageable memory ({pageable[0]}): {rule.why}"
    elif rule.kind in ("tensor_cores", "no_tensor_cores", "inline_ptx", "kernel_named", "sass", "no_sass"):
        return _judge_kernels(rule, o, own, at)
    return None


def _judge_kernels(rule: CompiledRule, o: Observation, own: list[KernelFacts], at: str) -> str | None:
    if rule.kind == "kernel_named":
        if not any(re.search(rule.pattern, name) for name in o.kernels):
            return f"{at}: {_kernels_said(o)}, none named like `{shown(rule.pattern)}`: {rule.why}"
        return None
    if not own:
        return f"{at}: {_kernels_said(o)}, none of them compiled from your files: {rule.why}"
    chosen = [k for k in own if rule.kind == "inline_ptx" or not rule.pattern or re.search(rule.pattern, k.kernel)]
    names = _list([k.kernel for k in chosen or own])
    if rule.kind == "inline_ptx":
        if not any(re.search(rule.pattern, i) for k in own for i in k.inline_asm):
            asm = sorted({i for k in own for i in k.inline_asm})
            return (
                f"{at}: no kernel the call launched ({names}) has `{shown(rule.pattern)}` in an asm statement "
                f"(their inline PTX: {', '.join(asm) or 'none'}): {rule.why}"
            )
        return None
    if rule.kind == "no_sass":
        for k in (k for k in own if not rule.kernels or re.search(rule.kernels, k.kernel)):
            found = opcodes_matching(rule.pattern, k.sass)
            if found:
                name = k.kernel.split("(")[0]
                return f"{at}: the call launched {name}, whose SASS has {', '.join(found[:3])}: {rule.why}"
        return None
    if rule.kind == "sass":
        named = [k for k in own if not rule.kernels or re.search(rule.kernels, k.kernel)]
        if not any(re.match(rule.pattern, op) for k in named for op in k.sass or ()):
            ran = _list([k.kernel for k in named or own])
            return f"{at}: no kernel the call launched ({ran}) executes {shown(rule.pattern)} (SASS): {rule.why}"
        return None
    if rule.kind == "tensor_cores":
        if not any(k.tensor_core_opcodes for k in chosen):
            return (
                f"{at}: no kernel the call launched ({names}) executes a tensor-core instruction (its SASS has no "
                f"HMMA or HGMMA): {rule.why}"
            )
        return None
    users = [k for k in chosen if k.tensor_core_opcodes]  # no_tensor_cores
    if users:
        ops = ", ".join(users[0].tensor_core_opcodes[:3])
        users_named = _list([k.kernel for k in users])
        return f"{at}: the call launched {users_named}, which runs on the tensor cores ({ops}): {rule.why}"
    return None


def observed_rules(task: CudaTask) -> list[CompiledRule]:
    return [r for r in task.rules if getattr(r, "observed", False)]  # type: ignore[misc]


def read_facts(lib: Path) -> BuildFacts | None:
    """The build's record beside the library (the task process reads it before the library
    loads, so nothing the library does at load time can change what it says)."""
    from grader.build.nvcc import read_record

    return read_record(lib)


def check(
    task: CudaTask,
    job: ChildJob,
    facts: BuildFacts | None,
    eps: Mapping[str, EntryPoint],
    notes: list[str],
    skipped: Collection[str] = (),
) -> None:
    """Observes the entry points the task's run-time rules name and judges those rules (`facts`:
    the build's record, from read_facts); raises CheckFailure(rule violation) for the first one
    broken. Notes what could not be checked. The entry points in `skipped` (this card cannot run
    them) are neither called nor judged, and a rule that names only such entries is not judged."""
    every = [x.symbol for x in task.entries if x.symbol not in skipped]

    def named(rule: CompiledRule) -> list[str]:
        return [e for e in rule.entries if e not in skipped] if rule.entries else every

    rules = [r for r in observed_rules(task) if named(r)]
    if not rules:
        return
    what = ", ".join(sorted({r.why.split(":")[0][:60] for r in rules}))
    if job.sanitize:
        return  # compute-sanitizer runs the cases only; the normal run judges these
    default = observed_case(task, job)
    if facts is None or default is None:
        why = "the build left no record beside the library" if facts is None else "no case to observe"
        notes.append(f"rules on the observed run not checked ({why}): {what}")
        return

    def case_of(rule: CompiledRule) -> Case:
        return _case(task, rule.case) if rule.case else default

    calls = list(dict.fromkeys((e, case_of(r).label) for r in rules for e in named(r)))
    seen: dict[tuple[str, str], Observation] = {}
    for symbol, label in calls:
        try:
            seen[symbol, label] = observe(task, eps[symbol], _case(task, label))
        except CheckFailure:
            raise
        except Exception as e:  # the profiler is the grader's tool: its failure is no verdict
            notes.append(f"rules on the observed run not checked: torch.profiler failed ({type(e).__name__}: {e})")
            return
    if all(not o.kernels and not o.api for o in seen.values()):
        notes.append(f"rules on the observed run not checked: the profiler recorded no CUDA activity here: {what}")
        return
    for rule in rules:
        for symbol in named(rule):
            o = seen[symbol, case_of(rule).label]
            if rule.kind in OBSERVED_SASS_RULES and any(
                k.sass is None for n in o.kernels if (k := own_kernel(facts, n)) is not None
            ):
                notes.append(f"not checked (no cuobjdump at the build): {rule.why}")
                continue
            if rule.kind in ("calls_each_time", "no_runtime_calls", "graph_replay") and not o.api:
                notes.append(f"not checked (the profiler recorded no CUDA API calls here): {rule.why}")
                continue
            message = judge(rule, o, facts)
            if message:
                raise CheckFailure(Verdict.RULE, message)
    for label in dict.fromkeys(label for _, label in seen):
        said = "; ".join(
            f"`{o.entry}`: {_kernels_said(o).removeprefix('the call ')}" for o in seen.values() if o.case == label
        )
        notes.append(f"observed on case {label}: {said}")
