"""Declaring tasks: what a spec file imports.

from grader.tasks import CudaTask, Case, Entry, In, Out, Int, NO_LIBRARIES
"""

from grader.records import Verdict
from grader.tasks.rules import NO_LIBRARIES, uses_shared_memory, uses_syncthreads
from grader.tasks.spec import (
    Case,
    CudaTask,
    Entry,
    Float,
    HostIn,
    HostOut,
    In,
    InOut,
    Int,
    Out,
    PerfTarget,
    Rule,
    Size,
    Task,
)

__all__ = [
    "NO_LIBRARIES",
    "Case",
    "CudaTask",
    "Entry",
    "Float",
    "HostIn",
    "HostOut",
    "In",
    "InOut",
    "Int",
    "Out",
    "PerfTarget",
    "Rule",
    "Size",
    "Task",
    "Verdict",
    "uses_shared_memory",
    "uses_syncthreads",
]
