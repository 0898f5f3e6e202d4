"""Declaring tasks: what a spec file imports.

from grader.tasks import CudaTask, Case, Entry, In, Out, Int, NO_LIBRARIES
from grader.tasks import PythonTask, NotebookTask, NotebookCheck
from grader.tasks import TorchExtensionTask, TorchOp, Case
from grader.tasks import Ladder   (several versions of one kernel timed side by side)
"""

from grader.records import Verdict
from grader.tasks.ladder import Ladder
from grader.tasks.notebook import NotebookCheck, NotebookTask
from grader.tasks.python import PythonTask
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
from grader.tasks.torch_ext import TorchExtensionTask, TorchOp

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
    "Ladder",
    "NotebookCheck",
    "NotebookTask",
    "Out",
    "PerfTarget",
    "PythonTask",
    "Rule",
    "Size",
    "Task",
    "TorchExtensionTask",
    "TorchOp",
    "Verdict",
    "uses_shared_memory",
    "uses_syncthreads",
]
