"""Calling task entry points through ctypes, with the arguments checked first.

A wrong dtype, a non-contiguous tensor or a tensor on the wrong device would make a kernel read
garbage, and the student would be told their code is wrong when the harness is. So every
argument is checked against the entry point's declaration before the call.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grader.records import CheckFailure, Verdict
from grader.tasks.spec import Arg, Buffer, Scalar, torch_dtype

_CTYPES = {"i32": ctypes.c_int32, "i64": ctypes.c_int64, "u64": ctypes.c_uint64, "f32": ctypes.c_float}
_INT_RANGE = {"i32": (-(2**31), 2**31 - 1), "i64": (-(2**63), 2**63 - 1), "u64": (0, 2**64 - 1)}
_NUMPY = {"f32": "float32", "f16": "float16", "i32": "int32", "u32": "uint32", "i64": "int64", "u8": "uint8"}


class HarnessError(RuntimeError):
    """The grader itself called an entry point wrongly: a bug in a task spec, not in student code."""


class Library:
    def __init__(self, path: Path) -> None:
        try:
            self.cdll = ctypes.CDLL(str(path))
        except OSError as e:
            raise CheckFailure(Verdict.COMPILE_ERROR, f"the built library does not load: {e}") from e
        self._error_name = getattr(self.cdll, "course_error_name", None)
        if self._error_name is not None:
            self._error_name.restype = ctypes.c_char_p
            self._error_name.argtypes = [ctypes.c_int]

    def error_name(self, code: int) -> str:
        if self._error_name is None:
            return f"CUDA error {code}"
        return self._error_name(code).decode()

    def function(self, symbol: str, args: Sequence[Arg]) -> EntryPoint:
        try:
            fn = getattr(self.cdll, symbol)
        except AttributeError:
            raise CheckFailure(
                Verdict.COMPILE_ERROR,
                f"entry point `{symbol}` is missing from the library: keep its COURSE_API declaration "
                f"exactly as the skeleton gives it",
            ) from None
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p if isinstance(a, Buffer) else _CTYPES[a.ctype] for a in args]
        return EntryPoint(self, symbol, list(args), fn)


class EntryPoint:
    def __init__(self, lib: Library, symbol: str, args: list[Arg], fn: Any) -> None:
        self.lib = lib
        self.symbol = symbol
        self.args = args
        self.fn = fn

    def marshal(self, values: dict[str, Any]) -> list[Any]:
        return [_convert(arg, values.get(arg.name), self.symbol) for arg in self.args]

    def call_raw(self, marshalled: list[Any]) -> int:
        return int(self.fn(*marshalled))

    def __call__(self, values: dict[str, Any]) -> int:
        return self.call_raw(self.marshal(values))


def _convert(arg: Arg, value: Any, symbol: str) -> Any:
    if value is None:
        raise HarnessError(f"{symbol}: no value for argument `{arg.name}`")
    if isinstance(arg, Scalar):
        if arg.ctype in _INT_RANGE:
            lo, hi = _INT_RANGE[arg.ctype]
            if not isinstance(value, int) or not lo <= value <= hi:
                raise HarnessError(f"{symbol}: `{arg.name}` = {value!r} does not fit {arg.ctype}")
        return value
    if arg.host:
        import numpy as np

        if not isinstance(value, np.ndarray) or value.dtype != np.dtype(_NUMPY[arg.dtype]):
            raise HarnessError(f"{symbol}: `{arg.name}` must be a numpy {_NUMPY[arg.dtype]} array")
        if not value.flags["C_CONTIGUOUS"]:
            raise HarnessError(f"{symbol}: `{arg.name}` must be C-contiguous")
        return ctypes.c_void_p(value.ctypes.data)
    import torch

    if not isinstance(value, torch.Tensor):
        raise HarnessError(f"{symbol}: `{arg.name}` must be a torch tensor")
    if value.dtype != torch_dtype(arg.dtype):
        raise HarnessError(f"{symbol}: `{arg.name}` is {value.dtype}, declared {arg.dtype}")
    if not value.is_contiguous():
        raise HarnessError(f"{symbol}: `{arg.name}` is not contiguous")
    if value.device.type != "cuda":
        raise HarnessError(f"{symbol}: `{arg.name}` is on {value.device}, not the GPU")
    return ctypes.c_void_p(value.data_ptr())
