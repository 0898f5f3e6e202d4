"""Your kernels of tasks 01-05, built into one shared library and declared for ctypes (given).

The five task files sit beside this package (lab7/01_cross_entropy.cu ... lab7/05_adamw.cu; where
the grader runs task 06, the files it grades: yours, or the references with --solutions). They are
built through the grader's cached nvcc build, once per change of any of them (the grader builds
what it staged for a run from a copy named by the files' content: grader.build.shared_library),
with cuBLAS and cuBLASLt linked for task 03. Every entry
point returns a cudaError_t, which `check` turns into an exception that names the call.

    lib() -> ctypes.CDLL      the library, built on first use, each entry's argtypes declared
    ptr(t) -> c_void_p        a tensor's device address
    stream() -> c_void_p      torch's current stream on the current device (the caller's stream)
    check(rc, what)           raises KernelError("<what>: <CUDA error>") when rc != 0
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import sys
from pathlib import Path

import torch

LAB = Path(__file__).resolve().parent.parent  # lab7/, or the grader's staging folder
SOURCES = (
    "01_cross_entropy.cu",
    "02_norm_backward.cu",
    "03_matmul_backward.cu",
    "04_attention_backward.cu",
    "05_adamw.cu",
)

P, I32, I64, F32, SIZE = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float, ctypes.c_size_t
SIGNATURES: dict[str, list[type]] = {
    # (logits, target, dloss, loss, dlogits, rows, V, ignore_index, stream)
    "cross_entropy_bf16": [P, P, P, P, P, I32, I32, I64, P],
    # (dy, x, weight, mean, rstd, dx, dweight, dbias, scratch, scratch_floats, rows, C, stream)
    "layernorm_backward_bf16": [P, P, P, P, P, P, P, P, P, SIZE, I32, I32, P],
    # (x, W, dy, dx, dW, db, N, K, M, stream)
    "linear_backward_bf16": [P, P, P, P, P, P, I32, I32, I32, P],
    # (a, h, W, dy, dh, dW, db, dbh, N, K, M, stream)
    "gelu_linear_backward_bf16": [P, P, P, P, P, P, P, P, I32, I32, I32, P],
    # (Q, K, V, O, dO, LSE, dQ, dK, dV, dQ32, Delta, BH, T, D, causal, stream)
    "attention_backward_bf16": [P, P, P, P, P, P, P, P, P, P, P, I32, I32, I32, I32, P],
    # (master, grads, exp_avg, exp_avg_sq, weights, offsets, sizes, n, lr, beta1, beta2, eps, wd, step, stream)
    "adamw_bf16_master": [P, P, P, P, P, P, P, I32, F32, F32, F32, F32, F32, I32, P],
}
MAX_PARTIALS = 512  # task 02: partial rows of the column sums, at most (norm_scratch_floats)


class KernelError(RuntimeError):
    """An entry point returned a CUDA error, or the library could not be built."""


def _find_grader() -> None:
    """`python -m gpt.train` from lab7/: the grader is the repository's, one folder up."""
    if importlib.util.find_spec("grader") is None:
        sys.path.insert(0, str(LAB.parent))


@functools.cache
def lib() -> ctypes.CDLL:
    """The five task files in one library (grader.build's cache: built once per change)."""
    _find_grader()
    from grader.build import BuildError, shared_library

    sources = [LAB / name for name in SOURCES]
    missing = [s.name for s in sources if not s.is_file()]
    if missing:
        raise KernelError(f"the task files {', '.join(missing)} are not in {LAB}")
    try:
        path = shared_library(
            "lab 7's kernels", sources, group="lab7", stem="gpt_kernels", include_dirs=[LAB],
            libraries=("cublas", "cublasLt"),  # task 03: cuBLASLt, and cuBLAS for its status names
        )  # fmt: skip
    except BuildError as e:
        raise KernelError(str(e)) from None
    found = ctypes.CDLL(str(path))
    for name, argtypes in SIGNATURES.items():
        fn = getattr(found, name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
    return found


def ptr(t: torch.Tensor | None) -> ctypes.c_void_p:
    """A tensor's device address as a kernel argument (None: a null pointer)."""
    return ctypes.c_void_p(None if t is None else t.data_ptr())


def stream() -> ctypes.c_void_p:
    """The caller's stream: torch's current stream on the current device, as a cudaStream_t."""
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


def error_string(rc: int) -> str:
    """`invalid argument (cudaError 1)`: the runtime's words for a cudaError_t, or its number."""
    _find_grader()
    from grader.build import cuda_error_string

    return cuda_error_string(rc)


def check(rc: int, what: str) -> None:
    """Raises KernelError naming `what` when an entry point returned an error."""
    if rc != 0:
        raise KernelError(f"{what}: {error_string(rc)}")


def norm_scratch_floats(rows: int, cols: int) -> int:
    """Task 02's scratch for a layer norm backward of (rows, cols): two partial rows per block."""
    return 2 * cols * min(rows, MAX_PARTIALS)
