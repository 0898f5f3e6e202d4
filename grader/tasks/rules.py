"""Rules a task can state about the student's code.

These judge what was compiled, not how the source is spelled: a library reached through a
macro-spelled `#include` and a namespace alias is still a library, and a `__shared__` array that
is declared but never used is no shared memory. They are judged after the build, in the grading
process (grader/parent/static_checks.py, `check_build`), from the record the build keeps
(grader/build/nvcc.py): the headers the preprocessor read, the libraries and library symbols the
.so needs, and per kernel the shared memory and barriers ptxas reports and the PTX uses.
Rule("forbid" | "require", regex, why) still judges the source text, before the build.
"""

from __future__ import annotations

from grader.tasks.spec import Rule

# Lab 1 and 2 are about writing kernels by hand: libraries would do the lesson for the student.
# Judged from every header the build read (thrust/, cub/, cutlass/, cute/, torch/, ATen/, c10/,
# cublas*, cudnn*, cufft*, curand*, cusparse*, cusolver*: grader/build/packages.py) and from the
# .so's needed libraries and undefined symbols.
NO_LIBRARIES = Rule(
    "no_libraries",
    "",
    "this lab is about writing kernels by hand: cuBLAS, cuDNN, Thrust, CUB, CUTLASS and other "
    "libraries are not allowed here (only the CUDA runtime)",
)


def uses_shared_memory(why: str, kernels: str = "") -> Rule:
    """A kernel must use shared memory (static, as ptxas allocates it, or dynamic, as its PTX
    reaches it). `kernels`, a regex on the kernels' names, makes every matching kernel comply
    (and at least one must match); without it one kernel of the task is enough."""
    return Rule("shared_memory", kernels, why)


def uses_syncthreads(why: str, kernels: str = "") -> Rule:
    """A kernel must contain a block-wide barrier (__syncthreads(), a cooperative-groups block
    sync, ...) that survived compilation. `kernels` as for uses_shared_memory."""
    return Rule("barrier", kernels, why)
