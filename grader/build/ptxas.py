"""Reads `-Xptxas -v` output: registers, spills, stack and shared memory per kernel."""

from __future__ import annotations

import re
import shutil
import subprocess

from grader.records import KernelResources

_ENTRY = re.compile(r"Compiling entry function '(?P<name>[^']+)'")
_FRAME = re.compile(r"(?P<stack>\d+) bytes stack frame, (?P<st>\d+) bytes spill stores, (?P<ld>\d+) bytes spill loads")
_USED = re.compile(r"Used (?P<regs>\d+) registers(?:.*?(?P<smem>\d+) bytes smem)?")


def parse_ptxas(log: str) -> list[KernelResources]:
    kernels: list[KernelResources] = []
    current: dict[str, int | str] | None = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current = {"kernel": m["name"], "stack": 0, "st": 0, "ld": 0}
        elif current is not None and (m := _FRAME.search(line)):
            current.update(stack=int(m["stack"]), st=int(m["st"]), ld=int(m["ld"]))
        elif current is not None and (m := _USED.search(line)):
            kernels.append(
                KernelResources(
                    kernel=str(current["kernel"]),
                    registers=int(m["regs"]),
                    spill_stores=int(current["st"]),
                    spill_loads=int(current["ld"]),
                    stack_bytes=int(current["stack"]),
                    smem_bytes=int(m["smem"] or 0),
                )
            )
            current = None
    return _demangled(kernels)


def _demangled(kernels: list[KernelResources]) -> list[KernelResources]:
    if not kernels or not shutil.which("c++filt"):
        return kernels
    names = subprocess.run(
        ["c++filt"], input="\n".join(k.kernel for k in kernels), capture_output=True, text=True
    ).stdout.splitlines()
    if len(names) == len(kernels):
        for k, name in zip(kernels, names, strict=True):
            k.kernel = name
    return kernels
