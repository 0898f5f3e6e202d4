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
    # CUTLASS's kernels nest templates past c++filt's default recursion limit, which then leaves
    # the name mangled; an older c++filt without the option fails, and the default is tried
    for flags in (["--no-recurse-limit"], []):
        run = subprocess.run(["c++filt", *flags], input="\n".join(names), capture_output=True, text=True)
        out = run.stdout.splitlines()
        if run.returncode == 0 and len(out) == len(names):
            return out
    return list(names)


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
# nvcc writes the callee on the line after `call.uni (retval0),`
_CALL = re.compile(r"\bcall(?:\.uni)?\s+(?:\([^)]*\)\s*,\s*)?(?P<name>[A-Za-z_$][\w$]*)")


_INLINE_ASM = re.compile(r"^[ \t]*// begin inline asm[ \t]*\n(.*?)^[ \t]*// end inline asm", re.M | re.S)
# a PTX special register (%laneid, %tid.x, %clock64): not a virtual register (%r12, %rd3, %f1, %p2)
_SPECIAL = re.compile(r"%(?![a-z]{1,3}\d)([a-z_][a-z_0-9]*(?:\.[xyz])?)")


def inline_asm(body: str) -> list[str]:
    """The instructions of the inline-asm statements in a function's PTX, nvcc marks them with
    `// begin inline asm`, each written as its mnemonic and the special registers it names:
    "fma.rn.f32", "mov.u32 %laneid"."""
    found: list[str] = []
    for block in _INLINE_ASM.finditer(body):
        for statement in block[1].split(";"):
            text = re.sub(r"//[^\n]*|\{|\}", " ", statement).strip()
            text = re.sub(r"^@!?%\w+\s+", "", text)  # a predicate guard
            if not text or text.startswith(".") or text.endswith(":"):
                continue  # a declaration (.reg) or a label
            mnemonic, _, operands = text.partition(" ")
            specials = [f"%{s}" for s in _SPECIAL.findall(operands)]
            found.append(" ".join([mnemonic, *specials]))
    return found


@dataclass
class PtxFacts:
    """What one kernel's PTX does, counting the functions it calls."""

    shared: bool  # reads, writes or takes the address of shared memory (static or dynamic)
    barrier: bool  # has a block-wide barrier
    inline_asm: tuple[str, ...] = ()  # its inline-asm instructions (and its callees'), distinct


def parse_ptx(ptx: str) -> dict[str, PtxFacts]:
    """Facts per kernel (`.entry`), by mangled name."""
    starts = list(_FUNCTION.finditer(ptx))
    direct: dict[str, tuple[bool, bool, set[str]]] = {}
    asm: dict[str, list[str]] = {}
    entries: list[str] = []
    for i, m in enumerate(starts):
        body = ptx[m.end() : starts[i + 1].start() if i + 1 < len(starts) else len(ptx)]
        if ".extern" in m.group(0):
            continue  # a prototype of a function defined in another module: no body here
        name = m["name"]
        if ".entry" in m.group(0):
            entries.append(name)
        calls = {c["name"] for c in _CALL.finditer(body)} - {name}
        asm.setdefault(name, []).extend(inline_asm(body))
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
        instructions: dict[str, None] = {}
        while todo:
            f = todo.pop()
            if f in seen or f not in direct:
                continue
            seen.add(f)
            s, b, calls = direct[f]
            shared, barrier = shared or s, barrier or b
            instructions.update(dict.fromkeys(asm.get(f, ())))
            todo.extend(calls)
        facts[name] = PtxFacts(shared, barrier, tuple(instructions))
    return facts
