"""What the compiler says about each kernel: `-Xptxas -v` output (registers, spills, stack, static
shared memory, block barriers) and the PTX itself (shared memory reached through a pointer, as
dynamic shared memory is, and barriers in functions a kernel calls).

The rules that judge compiled code (grader/tasks/rules.py) read these, never the source's spelling.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

from grader.records import KernelResources

_ENTRY = re.compile(r"Compiling entry function '(?P<name>[^']+)'")
_FRAME = re.compile(r"(?P<stack>\d+) bytes stack frame, (?P<st>\d+) bytes spill stores, (?P<ld>\d+) bytes spill loads")
_USED = re.compile(r"Used (?P<regs>\d+) registers(?:.*?(?P<smem>\d+) bytes smem)?")
_BARRIERS = re.compile(r"used (?P<n>\d+) barriers")


@dataclass
class PtxasKernel:
    """One kernel as ptxas reported it, under its mangled name (as PTX names it too)."""

    mangled: str
    resources: KernelResources  # kernel: the mangled name until demangled
    barriers: int | None  # "used N barriers"; None where this ptxas does not say


def parse_entries(log: str) -> list[PtxasKernel]:
    kernels: list[PtxasKernel] = []
    current: dict[str, int | str] | None = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current = {"kernel": m["name"], "stack": 0, "st": 0, "ld": 0}
        elif current is not None and (m := _FRAME.search(line)):
            current.update(stack=int(m["stack"]), st=int(m["st"]), ld=int(m["ld"]))
        elif current is not None and (m := _USED.search(line)):
            name = str(current["kernel"])
            resources = KernelResources(
                kernel=name,
                registers=int(m["regs"]),
                spill_stores=int(current["st"]),
                spill_loads=int(current["ld"]),
                stack_bytes=int(current["stack"]),
                smem_bytes=int(m["smem"] or 0),
            )
            bars = _BARRIERS.search(line)
            kernels.append(PtxasKernel(name, resources, int(bars["n"]) if bars else None))
            current = None
    return kernels


def parse_ptxas(log: str) -> list[KernelResources]:
    """Registers, spills, stack and static shared memory per kernel, names demangled."""
    kernels = [k.resources for k in parse_entries(log)]
    for k, name in zip(kernels, demangle([k.kernel for k in kernels]), strict=True):
        k.kernel = name
    return kernels


def demangle(names: list[str]) -> list[str]:
    """C++ names as a reader writes them; the mangled ones where c++filt is missing."""
    if not names or not shutil.which("c++filt"):
        return list(names)
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return out if len(out) == len(names) else list(names)


# --- PTX --------------------------------------------------------------------------------------

_FUNCTION = re.compile(
    r"^[ \t]*(?:\.(?:visible|weak|extern)[ \t]+)*\.(?:entry|func)[ \t]+(?:\([^)]*\)[ \t]*)?(?P<name>[\w$]+)",
    re.M,
)
# an instruction (not a declaration: those start with a dot) in the shared state space:
# ld/st/atom/red/cvta/cp.async/ldmatrix/mbarrier... .shared(::cta|::cluster)
_SHARED_OP = re.compile(r"^[ \t]*(?:@!?%\w+[ \t]+)?[a-z][^\n;]*?\.shared\b", re.M)
# a block-wide barrier: bar.sync, bar.red, bar.arrive, barrier.sync, barrier.cta.* (bar.warp.sync is a warp's)
_BARRIER_OP = re.compile(r"^[ \t]*(?:@!?%\w+[ \t]+)?(?:bar|barrier)(?:\.cta)?\.(?:sync|red|arrive)\b", re.M)
_CALL = re.compile(r"\bcall(?:\.uni)?[ \t]+(?:\([^)]*\)[ \t]*,[ \t]*)?(?P<name>[A-Za-z_$][\w$]*)")


@dataclass
class PtxFacts:
    """What one kernel's PTX does, counting the functions it calls."""

    shared: bool  # reads, writes or takes the address of shared memory (static or dynamic)
    barrier: bool  # has a block-wide barrier


def parse_ptx(ptx: str) -> dict[str, PtxFacts]:
    """Facts per kernel (`.entry`), by mangled name."""
    starts = list(_FUNCTION.finditer(ptx))
    direct: dict[str, tuple[bool, bool, set[str]]] = {}
    entries: list[str] = []
    for i, m in enumerate(starts):
        body = ptx[m.end() : starts[i + 1].start() if i + 1 < len(starts) else len(ptx)]
        if ".extern" in m.group(0):
            continue  # a prototype of a function defined in another module: no body here
        name = m["name"]
        if ".entry" in m.group(0):
            entries.append(name)
        calls = {c["name"] for c in _CALL.finditer(body)} - {name}
        shared, barrier, known = direct.get(name, (False, False, set()))
        direct[name] = (
            shared or bool(_SHARED_OP.search(body)),
            barrier or bool(_BARRIER_OP.search(body)),
            known | calls,
        )
    facts: dict[str, PtxFacts] = {}
    for name in entries:
        seen: set[str] = set()
        todo = [name]
        shared = barrier = False
        while todo:
            f = todo.pop()
            if f in seen or f not in direct:
                continue
            seen.add(f)
            s, b, calls = direct[f]
            shared, barrier = shared or s, barrier or b
            todo.extend(calls)
        facts[name] = PtxFacts(shared, barrier)
    return facts
