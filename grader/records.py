"""Typed records shared by the grading process and the task process, and what a grade says.

The task process (grader/child) sends a `ChildReport` as it goes, over a signed pipe (or to a
file, for a profiler's run); the grading process (grader/parent) reads it back. Both sides use these classes, so
a field is spelt once. `TaskResult` is what the runner yields per task, points included.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar


class Verdict(str, Enum):
    PASS = "pass"
    WRONG = "wrong"
    NOT_STARTED = "not started"
    COMPILE_ERROR = "compile error"
    CRASH = "crash"
    TIMEOUT = "timeout"
    SANITIZER = "sanitizer"
    RULE = "rule violation"
    SKIPPED = "skipped"
    ENVIRONMENT = "environment"  # this machine lacks something the task needs: not the student's fault
    GRADER_ERROR = "grader error"  # a bug in the grader or a task spec: please report it

    def __str__(self) -> str:
        return self.value


class TimingMode(str, Enum):
    """How a graded run times the entry points."""

    OFF = "off"  # checks only
    QUICK = "quick"  # a few calls per timed case: make test-labN
    BENCH = "bench"  # the benchmark's many calls: make grade, make bench-labN
    LADDER = "ladder"  # bench, then the task's ladder of rungs and baselines: make bench-labN

    def __str__(self) -> str:
        return self.value


class CheckFailure(Exception):  # noqa: N818 - a verdict, not an error of the grader
    """Raised inside a check to end the task with a verdict and a message for the student."""

    def __init__(self, verdict: Verdict, message: str) -> None:
        super().__init__(message)
        self.verdict = verdict
        self.message = message


@dataclass
class Timing:
    """One timed entry point (or ladder rung) on one case, with every metric it declares."""

    entry: str
    case: str
    median_ms: float
    q1_ms: float
    q3_ms: float
    min_ms: float
    n: int
    baseline_median_ms: float | None = None
    speedup: float | None = None  # baseline / student: > 1 means faster than torch
    gbps: float | None = None
    copy_gbps: float | None = None
    share_of_copy: float | None = None
    gflops: float | None = None
    share_of_peak: float | None = None  # of the card's FLOP/s or DRAM limit, where one applies
    baseline: str = "torch"  # what `speedup` compares against
    rung: str = ""  # the ladder rung, for ladders: the entry point's symbol, or a baseline's name
    ladder: str = ""  # the ladder's name for its rows (whose entry is "" for a baseline); "" otherwise
    vs: dict[str, float] = field(default_factory=dict)  # baseline name -> its time / this time (> 1: faster)
    read_gbps: float | None = None  # the card's measured read-only bandwidth, in the same run
    peak_gbps: float | None = None  # theoretical DRAM bandwidth: memory clock x bus width x 2
    peak_gflops: float | None = None  # FP32 FLOP/s for fp32 entries; none for tensor ones (Limits.rated_gflops)
    sweep: bool = False  # a case timed by `make bench` for a throughput plot only: no target reads it

    @property
    def headline(self) -> bool:
        """Whether reports list this row with the task (ladder rows go to the lab's README tables,
        sweep rows to its plots)."""
        return not self.ladder and not self.sweep


@dataclass
class KernelResources:
    kernel: str
    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    smem_bytes: int


@dataclass
class CaseRecord:
    """A case that ran to the end of its checks."""

    case: str
    entry: str
    ok: bool = True


@dataclass
class TestOutcome:
    """One pytest test run inside the task process (Python-module and notebook tasks)."""

    name: str
    outcome: str  # passed | failed | skipped | error
    points: float
    message: str = ""


@dataclass
class DeviceInfo:
    name: str
    cc: str
    sms: int
    l2_bytes: int | None = None
    torch: str = ""
    torch_cuda: str | None = None


@dataclass
class SanitizerRun:
    """How one compute-sanitizer tool went: `clean`, `findings`, or `not run` with the reason."""

    tool: str
    status: str
    detail: str = ""


class Stage(str, Enum):
    """What a task process is doing, for the grading process to reason about (a timeout while
    building is not a hung kernel)."""

    STARTING = "starting"  # before the job: imports, CUDA set-up
    BUILDING = "building"  # in the task process: a PyTorch extension, a staged package
    CHECKING = "checking"  # the cases, the checks, the tests, a notebook's cells
    TIMING = "timing"  # the card's limits, the timed calls, a ladder
    OBSERVING = "observing"  # one observed call per entry point (torch.profiler)
    DONE = "done"

    def __str__(self) -> str:
        return self.value


@dataclass
class Phase:
    """Where a task process is: its stage, and what it does there in words ("saxpy, case n=4097")."""

    stage: Stage = Stage.STARTING
    what: str = ""

    def __str__(self) -> str:
        return self.what or str(self.stage)


@dataclass
class ChildReport:
    """What the task process tells the grading process. Written often, so a killed child still
    leaves behind the phase it was in."""

    verdict: Verdict | None = None
    phase: Phase = field(default_factory=Phase)
    message: str = ""
    cases: list[CaseRecord] = field(default_factory=list)
    timings: list[Timing] = field(default_factory=list)
    tests: list[TestOutcome] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    device: DeviceInfo | None = None
    sandbox: list[str] = field(default_factory=list)  # what the sandbox held, when the task ran in one
    build_seconds: float | None = None  # what the task process built (a PyTorch extension), when it built
    # entry points this card cannot run (Entry.min_cc, max_cc) -> why: left out, neither passed nor failed
    skipped: dict[str, str] = field(default_factory=dict)
    # where the task process spent its time: "stage: step" (the phase's words before its first comma,
    # so every case of one op adds up under one key) -> seconds; make bench-grader prints it
    step_seconds: dict[str, float] = field(default_factory=dict)

    def dump(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(to_jsonable(self)))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> ChildReport:
        """The report at `path`; an empty one when the child never wrote it (or wrote garbage)."""
        try:
            return cls.from_json(path.read_text())
        except OSError:
            return cls()

    @classmethod
    def from_json(cls, text: str) -> ChildReport:
        try:
            return from_jsonable(cls, json.loads(text))
        except (ValueError, TypeError, KeyError, AttributeError):  # not a report of this format
            return cls()


@dataclass
class ChildJob:
    """What the grading process asks of one task process: which spec, which files stand for the
    student's (relative path in the lab -> file to grade), and how to run them."""

    spec: str
    sources: dict[str, str]
    lib: str | None = None  # the library nvcc built, for CUDA tasks
    timing: TimingMode = TimingMode.QUICK
    sanitize: bool = False  # small cases only, no timing
    huge: bool = False  # also the cases past 2^31 elements
    variant: str = "student"  # student | solution | a broken variant's name: keeps build caches apart
    profile: bool = False  # each entry point once on the timing case, for a profiler (grader/child/profiling.py)
    seed: str = ""  # this task's key (grader/child/context.py): the secret seed never reaches the task process

    def to_line(self) -> str:
        return json.dumps(to_jsonable(self)) + "\n"

    @classmethod
    def from_line(cls, line: str) -> ChildJob:
        return from_jsonable(cls, json.loads(line))


@dataclass
class ForkRequest:
    """A grading process asks the fork server (grader/child/forkserver.py) for one task process:
    its arguments, environment, output files and sandbox. The report pipe travels beside it."""

    argv: list[str]
    env: dict[str, str]
    stdout: str
    stderr: str
    sandbox: str | None = None  # the sandbox's Policy as JSON (grader/parent/sandbox.py)


@dataclass
class Forked:
    """The fork server's first answer: the task process's pid."""

    pid: int


@dataclass
class Exited:
    """The fork server's second answer: the task process's exit status, negative for a signal."""

    returncode: int


def to_line(record: Any) -> bytes:
    """A record as one JSON line, for a socket or a pipe."""
    return json.dumps(to_jsonable(record)).encode() + b"\n"


def from_line(cls: type[T], line: bytes | str) -> T:
    return from_jsonable(cls, json.loads(line))


@dataclass
class TaskResult:
    lab: str
    number: str
    title: str
    source: str
    verdict: Verdict
    message: str = ""
    cases: list[CaseRecord] = field(default_factory=list)
    timings: list[Timing] = field(default_factory=list)
    tests: list[TestOutcome] = field(default_factory=list)
    kernels: list[KernelResources] = field(default_factory=list)
    sanitizer: list[SanitizerRun] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sandbox: list[str] = field(default_factory=list)  # what held, when it ran in the sandbox
    seconds: float = 0.0
    build_seconds: float | None = None  # the build's seconds when this run built it; None: cached, or none
    points: float = 0.0
    max_points: float = 0.0
    # entry points this card cannot run (Entry.min_cc, max_cc) -> why: not checked, timed or scored here
    skipped: dict[str, str] = field(default_factory=dict)
    step_seconds: dict[str, float] = field(default_factory=dict)  # the task process's, by step (ChildReport)

    @property
    def task_id(self) -> str:
        return f"{self.lab}/{self.number}"

    def headline(self) -> str:
        """The message in one line, for summaries: its first line, and for a grader error (whose
        message is a traceback) the exception at its end as well."""
        lines = [x for x in (self.message or "").strip().splitlines() if x.strip()]
        if not lines:
            return ""
        if self.verdict == Verdict.GRADER_ERROR and len(lines) > 1:
            return f"{lines[0].rstrip(':')}: {lines[-1].strip()}"
        return lines[0]

    def to_dict(self) -> dict[str, Any]:
        d = to_jsonable(self)
        d["task"] = self.task_id
        return d


# --- JSON round trip for the dataclasses above ----------------------------------------------

T = TypeVar("T")


def to_jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {k: to_jsonable(v) for k, v in asdict(obj).items()} | _enums(obj)
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, list | tuple):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_jsonable(v) for k, v in obj.items()}
    return obj


def _enums(obj: Any) -> dict[str, Any]:
    """asdict keeps Enum members; JSON wants their values."""
    return {
        f.name: getattr(obj, f.name).value for f in dataclasses.fields(obj) if isinstance(getattr(obj, f.name), Enum)
    }


def from_jsonable(cls: type[T], data: Any) -> T:
    """Rebuilds dataclass `cls` from `to_jsonable` output; unknown keys are an error."""
    hints = typing.get_type_hints(cls)
    kwargs = {name: _convert(hints[name], value) for name, value in data.items()}
    return cls(**kwargs)


def _convert(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _convert(args[0], value) if len(args) == 1 else value
    if origin is list:
        (inner,) = typing.get_args(tp)
        return [_convert(inner, v) for v in value]
    if isinstance(tp, type) and issubclass(tp, Enum):
        return tp(value)
    if dataclasses.is_dataclass(tp):
        return from_jsonable(tp, value)
    return value
