"""What the student's compiled objects reference and what their kernels execute, for the rules.

Host side: each object's symbol table and relocations (`readelf`). Every source is compiled with
`-ffunction-sections -fdata-sections`, so each function and each data object has a section of its
own, and a section's relocations are what that code refers to: the functions it calls, the data
it reads (a vtable or a table of function pointers, whose own relocations go on), the library
functions it leaves undefined. From each C entry point (an exported, unmangled function: the
`COURSE_API` ones) the grader follows these references to the library calls and the kernels the
entry point can reach. A helper nothing calls, or a second entry point, does not count for this
one. A pointer to a function is followed too, so the reach is never smaller than what can run.

Run-time symbol lookups (`dlopen`, `dlsym`, `cuGetProcAddress` ...) are read from the objects,
never from the linked library: the CUDA runtime that nvcc links statically uses them itself.

Device side: `cuobjdump -sass` of the linked library, the machine instructions per kernel (a
kernel's section holds the device functions it calls): HMMA/HGMMA are tensor-core instructions.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# host compiler flags that give each function its own section, so its relocations are its own
SECTION_FLAGS = ["-Xcompiler", "-ffunction-sections,-fdata-sections"]

# run-time symbol lookups: each reaches code the linker never saw (a library a task forbids,
# found in the process because torch loaded it)
LOOKUPS = (
    "dlopen",
    "dlmopen",
    "dlsym",
    "dlvsym",
    "cudaGetDriverEntryPoint",
    "cudaGetDriverEntryPointByVersion",
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
    "cuGetExportTable",
    "cudaGetExportTable",
)

# SASS opcodes that execute on the tensor cores: HMMA (fp16/bf16/tf32 warp MMA), HGMMA (Hopper's
# wgmma), IMMA/IGMMA (integer), QMMA/QGMMA (fp8), DMMA (fp64), BMMA (binary), UTC*MMA (Blackwell)
TENSOR_CORE_OPCODES = re.compile(r"^(?:HMMA|HGMMA|IMMA|IGMMA|QMMA|QGMMA|DMMA|BMMA|BGMMA|UTC\w*MMA\w*|OMMA)(?:\.|$)")


@dataclass
class EntryReach:
    """What one C entry point can reach through the code its objects compiled."""

    calls: list[str] = field(default_factory=list)  # external (undefined) functions and data it refers to
    kernels: list[str] = field(default_factory=list)  # kernels (mangled) whose launch code it reaches


@dataclass
class ObjectFacts:
    undefined: dict[str, list[str]]  # source (repo-relative) -> the symbols its object leaves undefined
    reach: dict[str, EntryReach]  # C entry point -> what it reaches
    # source -> lookup symbol (dlsym ...) -> the functions whose code refers to it
    lookups: dict[str, dict[str, list[str]]] = field(default_factory=dict)


# NVTX's own functions (nvtx3/nvtxDetail/nvtxInit.h, which Thrust and CUB include too) load the
# profiler's injection library with dlopen and dlsym: they reach no library a task forbids
NVTX_FUNCTION = re.compile(r"^(?:_ZL\d+)?nvtx\w*_v\d+\w*$")


def nvtx_only(functions: Iterable[str], headers: Iterable[str]) -> bool:
    """Whether every function that refers to a lookup is NVTX's, and the build read NVTX's headers."""
    names = list(functions)
    return bool(names) and all(NVTX_FUNCTION.match(n) for n in names) and any("/nvtx3/" in h for h in headers)


# The cuDNN frontend (a header library lab 3 builds against) asks the runtime for the driver's
# cuCtxGetCurrent and kin by version, to make a context current before it executes a plan
CUDNN_FRONTEND_FUNCTION = re.compile(r"^_ZNK?14cudnn_frontend")
DRIVER_ENTRY_POINTS = {"cudaGetDriverEntryPoint", "cudaGetDriverEntryPointByVersion"}


# The course's own (grader/include/course_mma.h): course_tensor_map_2d asks the runtime for the
# driver's cuTensorMapEncodeTiled, by name, to describe a matrix to TMA (lab 2's Hopper GEMM rung),
# and for nothing else, so that no task links libcuda. Its mangled name, signature and all: an
# overload of the same name is the student's own code, and gets no exemption.
COURSE_TENSOR_MAP_FUNCTION = re.compile(
    r"^_Z20course_tensor_map_2dP14CUtensorMap_st24CUtensorMapDataType_enumPKvmmmjj23CUtensorMapSwizzle_enum$"
)
COURSE_TENSOR_MAP_HEADER = "course_mma.h"  # the course's, in grader/include


def library_lookup(symbol: str, functions: Iterable[str], headers: Iterable[str]) -> bool:
    """Whether a lookup is a header library's own, not the student's: NVTX's loader, the cuDNN
    frontend's driver entry points or the course's tensor-map helper, called only from the
    library's own functions, in a build that read that library's headers."""
    names = list(functions)
    if nvtx_only(names, headers):
        return True
    if symbol not in DRIVER_ENTRY_POINTS or not names:
        return False
    heads = list(headers)
    if all(CUDNN_FRONTEND_FUNCTION.match(n) for n in names) and any("/cudnn_frontend" in h for h in heads):
        return True
    course = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "include")
    header = os.path.join(course, COURSE_TENSOR_MAP_HEADER)
    return all(COURSE_TENSOR_MAP_FUNCTION.match(n) for n in names) and any(os.path.normpath(h) == header for h in heads)


# --- readelf ------------------------------------------------------------------------------------

_SECTION = re.compile(r"^\s*\[\s*(\d+)\]\s+(\S+)\s+([A-Z_]+)\s+(.*)$", re.M)
_SYMBOL = re.compile(r"^\s*\d+:\s+[0-9a-fA-F]+\s+\d+\s+(\w+)\s+(\w+)\s+(\w+)\s+(\w+)(?:[ \t]+(\S+))?[ \t]*$", re.M)
# readelf cuts the name in this header at 256 characters, whatever -W says (a CUTLASS template's
# section is longer): the header's offset names the relocation section, whose sh_info is the
# index of the section it relocates
_RELA_HEAD = re.compile(r"^Relocation section '([^']+)' at offset 0x([0-9a-fA-F]+)", re.M)
_RELA = re.compile(r"^[0-9a-fA-F]+\s+[0-9a-fA-F]+\s+R_\w+\s+[0-9a-fA-F]+\s+(\S+)", re.M)


@dataclass
class _Object:
    sections: dict[int, str]
    symbols: list[tuple[str, str, str, str]]  # (name, type, bind, section index or UND/ABS/COM)
    relocations: dict[str, list[str]]  # section -> the names its relocations refer to


def _readelf(obj: Path) -> _Object | None:
    readelf = shutil.which("readelf")
    if readelf is None:
        return None
    out = subprocess.run([readelf, "-W", "-S", "-s", "-r", str(obj)], capture_output=True, text=True).stdout
    return parse_readelf(out)


def parse_readelf(text: str) -> _Object:
    """Sections, the symbol table and the relocations of one object, from `readelf -W -S -s -r`."""
    sections: dict[int, str] = {}
    relocates: dict[int, str] = {}  # file offset of a relocation section -> the section it relocates
    rela_info: list[tuple[int, int]] = []
    for m in _SECTION.finditer(text):
        if m[1] == "0":
            continue
        sections[int(m[1])] = m[2]
        if m[3] in ("RELA", "REL"):  # Address Off Size ES [Flg] Lk Inf Al
            rest = m[4].split()
            rela_info.append((int(rest[1], 16), int(rest[-2])))
    for offset, info in rela_info:
        if info in sections:
            relocates[offset] = sections[info]
    symtab = text.find("Symbol table '.symtab'")
    symbols: list[tuple[str, str, str, str]] = []
    if symtab >= 0:
        end = text.find("\n\n", symtab)
        for m in _SYMBOL.finditer(text, symtab, end if end >= 0 else len(text)):
            symbols.append((m[5] or "", m[1], m[2], m[4]))
    relocations: dict[str, list[str]] = {}
    heads = list(_RELA_HEAD.finditer(text))
    for i, h in enumerate(heads):
        stop = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        section = relocates.get(int(h[2], 16)) or (
            h[1].removeprefix(".rela").removeprefix(".rel") if h[1].startswith(".rel") else h[1]
        )
        relocations.setdefault(section, []).extend(m[1] for m in _RELA.finditer(text, h.end(), stop))
    return _Object(sections, symbols, relocations)


def undefined_symbols(obj: Path) -> list[str] | None:
    """The symbols `obj` leaves undefined (mangled): what its code calls or reads from elsewhere;
    None when readelf is missing or the object is not there."""
    if not obj.is_file():
        return None
    o = _readelf(obj)
    if o is None:
        return None
    return sorted({name for name, _, _, where in o.symbols if where == "UND" and name})


def object_facts(objects: Sequence[tuple[str, Path]], kernels: Iterable[str]) -> ObjectFacts | None:
    """The undefined symbols of each object (named by its source) and, per C entry point, the
    external symbols and kernels it reaches; None when readelf is missing."""
    parsed: list[tuple[str, _Object]] = []
    for source, obj in objects:
        o = _readelf(obj)
        if o is None:
            return None
        parsed.append((source, o))
    return analyse(parsed, set(kernels))


Node = tuple[int, str]  # (object, section): one function or data object's code


def device_name(host_symbol: str) -> str:
    """The kernel's own (device) name for its host launch stub. nvcc gives a template kernel's
    stub internal linkage, and the mangling marks that with an `L` before the function's name
    (`_ZN7cutlassL6KernelI...` for the kernel `_ZN7cutlass6KernelI...`); other names come back
    unchanged."""
    if host_symbol.startswith("_ZL") and host_symbol[3:4].isdigit():
        return "_Z" + host_symbol[3:]
    if not host_symbol.startswith("_ZN"):
        return host_symbol
    i = 3
    while i < len(host_symbol) and host_symbol[i] in "KVr":  # cv-qualifiers of a member function
        i += 1
    while i < len(host_symbol):
        c = host_symbol[i]
        if c == "L" and host_symbol[i + 1 : i + 2].isdigit():
            return host_symbol[:i] + host_symbol[i + 1 :]
        if host_symbol.startswith("St", i):
            i += 2
        elif c.isdigit():
            j = i
            while j < len(host_symbol) and host_symbol[j].isdigit():
                j += 1
            i = j + int(host_symbol[i:j])
        else:
            break
    return host_symbol


def analyse(parsed: Sequence[tuple[str, _Object]], kernels: set[str]) -> ObjectFacts:
    """From the parsed objects of one build (each named by its source): the undefined symbols per
    object, and per C entry point what its sections refer to, followed to the end."""
    undefined: dict[str, list[str]] = {}
    defined_global: dict[str, list[Node]] = {}
    local: list[dict[str, Node]] = []
    in_section: dict[Node, list[str]] = {}
    entries: dict[str, list[Node]] = {}
    lookups: dict[str, dict[str, list[str]]] = {}
    for i, (source, o) in enumerate(parsed):
        names: dict[str, Node] = {name: (i, name) for name in o.sections.values()}
        und: list[str] = []
        for name, kind, bind, ndx in o.symbols:
            if not name or kind in ("FILE", "SECTION"):
                continue
            if ndx == "UND":
                und.append(name)
                continue
            if not ndx.isdigit() or int(ndx) not in o.sections:
                continue
            node = (i, o.sections[int(ndx)])
            in_section.setdefault(node, []).append(name)
            if bind in ("GLOBAL", "WEAK"):
                defined_global.setdefault(name, []).append(node)
                if kind == "FUNC" and not name.startswith("_Z") and not name.startswith("_"):
                    entries.setdefault(name, []).append(node)
            else:  # a static function or object: only this object's relocations reach it
                names[name] = node
        local.append(names)
        undefined[source] = sorted(set(und))
        for section, refs in o.relocations.items():
            for name in set(refs) & set(LOOKUPS):
                if name in und:
                    sites = in_section.get((i, section)) or [section.removeprefix(".text.")]
                    lookups.setdefault(source, {}).setdefault(name, []).extend(sites)
    defined = set(defined_global)

    def targets(node: Node) -> Iterable[Node | str]:
        i, section = node
        for name in parsed[i][1].relocations.get(section, ()):
            if name in local[i]:
                yield local[i][name]
            elif name in defined_global:
                yield from defined_global[name]
            else:
                yield name  # external: a library's function or data

    reach: dict[str, EntryReach] = {}
    for entry, starts in sorted(entries.items()):
        seen: set[Node] = set()
        external: set[str] = set()
        todo: list[Node] = list(starts)
        while todo:
            node = todo.pop()
            if node in seen:
                continue
            seen.add(node)
            for t in targets(node):
                if isinstance(t, str):
                    if t not in defined and not t.startswith("."):  # .LC0: an assembler label
                        external.add(t)
                else:
                    todo.append(t)
        names_reached = {device_name(n) for node in seen for n in in_section.get(node, ())}
        reach[entry] = EntryReach(sorted(external), sorted(names_reached & kernels))
    return ObjectFacts(undefined, reach, {s: {k: sorted(set(v)) for k, v in d.items()} for s, d in lookups.items()})


# --- SASS ---------------------------------------------------------------------------------------


@functools.cache
def find_cuobjdump() -> str | None:
    """cuobjdump: beside nvcc in the toolkit, on PATH, or the copy Triton's wheel ships."""
    candidates: list[str | None] = [os.environ.get("CUOBJDUMP")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(os.path.realpath(nvcc)).parent / "cuobjdump"))
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            candidates.append(str(Path(home) / "bin" / "cuobjdump"))
    candidates.append(shutil.which("cuobjdump"))
    try:
        import triton  # noqa: F401 - only where it is installed: its wheel bundles cuobjdump

        candidates.append(str(Path(sys.modules["triton"].__file__ or "").parent / "backends/nvidia/bin/cuobjdump"))
    except ImportError:
        pass
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    return None


_FUNCTION = re.compile(r"^\s*Function : (\S+)\s*$", re.M)
_OPCODE = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T\d]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)", re.M)


def parse_sass(text: str) -> dict[str, list[str]]:
    """The distinct opcodes (with their modifiers: HMMA.16816.F32.BF16) of each function, by its
    mangled name, from `cuobjdump -sass` (several architectures: their union)."""
    found: dict[str, set[str]] = {}
    starts = list(_FUNCTION.finditer(text))
    for i, m in enumerate(starts):
        stop = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        # the next fatbin's header ends this function too
        header = text.find("Fatbin", m.end(), stop)
        body = text[m.end() : header if header >= 0 else stop]
        found.setdefault(m[1], set()).update(o[1] for o in _OPCODE.finditer(body))
    return {name: sorted(ops) for name, ops in found.items()}


def sass(lib: Path) -> dict[str, list[str]] | None:
    """Opcodes per kernel of a built library; None when cuobjdump is missing or fails."""
    tool = find_cuobjdump()
    if tool is None:
        return None
    run = subprocess.run([tool, "-sass", str(lib)], capture_output=True, text=True)
    if run.returncode != 0:
        return None
    return parse_sass(run.stdout)


def tensor_core_opcodes(opcodes: Iterable[str]) -> list[str]:
    return sorted({op for op in opcodes if TENSOR_CORE_OPCODES.match(op)})
