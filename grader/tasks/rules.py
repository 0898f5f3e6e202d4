"""Rules a task can state about the student's code, judged before anything runs."""

from __future__ import annotations

from grader.tasks.spec import Rule

# Lab 1 and 2 are about writing kernels by hand: libraries would do the lesson for the student.
NO_LIBRARIES = Rule(
    "forbid",
    r"#\s*include\s*[<\"](cublas|cublasLt|cudnn|cufft|curand|cusparse|cusolver|thrust/|cub/|cutlass/"
    r"|cute/|torch/|ATen/|c10/)|\b(thrust|cub|cutlass|cute)::|\bcublas\w*\s*\(",
    "this lab is about writing kernels by hand: cuBLAS, cuDNN, Thrust, CUB, CUTLASS and other "
    "libraries are not allowed here (only the CUDA runtime)",
)


def uses_shared_memory(why: str) -> Rule:
    return Rule("require", r"__shared__", why)


def uses_syncthreads(why: str) -> Rule:
    return Rule("require", r"__syncthreads\s*\(", why)
