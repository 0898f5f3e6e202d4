"""Verdicts and the result of grading one task."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


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


@dataclass
class KernelResources:
    kernel: str
    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    smem_bytes: int


@dataclass
class TaskResult:
    lab: str
    number: str
    title: str
    source: str
    verdict: Verdict
    message: str = ""
    cases: list[dict[str, Any]] = field(default_factory=list)
    timings: list[Timing] = field(default_factory=list)
    kernels: list[KernelResources] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    points: float = 0.0
    max_points: float = 0.0

    @property
    def task_id(self) -> str:
        return f"{self.lab}/{self.number}"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["verdict"] = str(self.verdict)
        d["task"] = self.task_id
        return d
