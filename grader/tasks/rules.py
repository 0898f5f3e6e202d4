"""Rules a task can state about the student's code.

These judge what was compiled and what ran, not how the source is spelled: a library reached
through a macro-spelled `#include` and a namespace alias is still a library, a `__shared__` array
that is declared but never used is no shared memory, a call in a helper that nothing calls is no
call, and a tensor-core kernel that a call never launches multiplies nothing.

Two places judge them:

- After the build, in the grading process (grader/parent/static_checks.py, `check_build`), from
  the record the build keeps (grader/build/nvcc.py, grader/build/objects.py): the headers the
  preprocessor read, the libraries and library symbols the .so needs, what each C entry point's
  code reaches (library calls, kernels), and per kernel the shared memory and barriers ptxas
  reports, the PTX's inline-asm instructions and the SASS opcodes. This works without a GPU.
- On a GPU, in the task process (grader/child/observe.py): after the cases pass, one call of
  each entry point a rule names, on one case, under torch.profiler: the kernels it launched
  (their names, and whether the task's library or another library holds them), the CUDA runtime
  calls it made (cudaGraphLaunch, cudaMemcpyAsync, cudaMalloc ...) and the copies' kind (pinned or
  pageable host memory). Where the profiler cannot observe, the report says the rule was not
  checked there; it never passes silently.

Every CUDA task also obeys one rule it does not state: no run-time symbol lookup (`dlopen`,
`dlsym`, `cudaGetDriverEntryPoint`, `cuGetProcAddress` ...) in the student's objects, unless the
task says `allows_symbol_lookup`: code found that way escapes every rule above (the cuBLAS that
torch already loaded is one `dlsym` away). The course's own `course_tensor_map_2d`
(grader/include/course_mma.h: the driver's cuTensorMapEncodeTiled, for TMA) is exempt.

A rule that names entry points judges only those the build's target can run: an entry that runs
on some cards only (`Entry.min_cc`, `max_cc`) is left out of every rule on a build for another
card, and a rule that names only such entries is not judged there.

Rule("forbid" | "require", regex, why) still judges the source text, before the build: keep it
for what only the spelling shows (a C++ function the task's lesson replaces by inline PTX).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from grader.tasks.spec import Rule


@dataclass(frozen=True)
class CompiledRule(Rule):
    """A rule on the build (and, where `observed`, on one call of each entry point at run time).

    `entries` are the C entry points it speaks of: () means any of the task's. `pattern` is the
    rule's own: a regex on symbols (calls), on kernel names (tensor_cores, kernel_named), on
    inline-asm instructions (inline_ptx), on library names (no_library), on runtime calls
    (no_runtime_calls); unused by the others. `count` is the number of kernels a call launches
    (kernels)."""

    kind: str  # type: ignore[assignment] - the kinds below, beyond the source rules' two
    entries: tuple[str, ...] = ()
    count: int = 0
    kernels: str = ""  # executes: a regex on the names of the kernels it speaks of ("": any)
    case: str = ""  # the case of its observed call ("": the one grader/child/observe.py picks)

    @property
    def observed(self) -> bool:
        """Whether the task process also judges it on an observed call (GPU)."""
        return self.kind in OBSERVED_KINDS


# kinds with a run-time part (grader/child/observe.py); the others are judged on the build only
OBSERVED_KINDS = frozenset(
    {
        "calls_each_time",
        "kernel_named",
        "tensor_cores",
        "no_tensor_cores",
        "inline_ptx",
        "sass",
        "no_sass",
        "kernels",
        "library_kernels",
        "graph_replay",
        "pinned_copies",
        "no_runtime_calls",
    }
)

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


def _entries(entries: str | Sequence[str]) -> tuple[str, ...]:
    return (entries,) if isinstance(entries, str) else tuple(entries)


def uses_shared_memory(why: str, kernels: str = "") -> Rule:
    """A kernel must use shared memory (static, as ptxas allocates it, or dynamic, as its PTX
    reaches it). `kernels`, a regex on the kernels' names, makes every matching kernel comply
    (and at least one must match); without it one kernel of the task is enough."""
    return Rule("shared_memory", kernels, why)


def uses_syncthreads(why: str, kernels: str = "") -> Rule:
    """A kernel must contain a block-wide barrier (__syncthreads(), a cooperative-groups block
    sync, ...) that survived compilation. `kernels` as for uses_shared_memory."""
    return Rule("barrier", kernels, why)


def no_library(libraries: str, why: str) -> Rule:
    """The library rule for some libraries only (`libraries`, a regex on the names
    grader/build/packages.py gives: cublas, cudnn, thrust, cutlass ...): no header of theirs read,
    no library of theirs linked, no symbol of theirs called."""
    return CompiledRule("no_library", libraries, why)


def allows_symbol_lookup(why: str) -> Rule:
    """Lifts the run-time symbol lookup rule (dlopen, dlsym, cuGetProcAddress ...) for a task
    whose lesson needs one."""
    return CompiledRule("allow_lookup", "", why)


def calls(symbols: str, why: str, entries: str | Sequence[str] = ()) -> Rule:
    """The code each of `entries` reaches calls a function matching `symbols` (a regex matched
    against the whole symbol: "cudaMallocHost|cudaHostAlloc"); a call in a helper the entry point
    never reaches does not count. Judged on the build only: right for what happens once (creating
    a stream, allocating pinned memory, instantiating a graph)."""
    return CompiledRule("calls", symbols, why, entries=_entries(entries))


def never_calls(symbols: str, why: str, entries: str | Sequence[str] = ()) -> Rule:
    """No code the entry points reach (with no `entries`: no object of the build at all) calls a
    function matching `symbols`: the compiled form of a forbid, whatever macro spells the call."""
    return CompiledRule("never_calls", symbols, why, entries=_entries(entries))


def never_references(names: str, why: str) -> Rule:
    """A PyTorch-extension task's own objects (its C++/CUDA files as compiled, not the course's)
    leave no symbol undefined whose demangled name matches `names` at its start (a regex:
    "at::|torch::|cblas_"): the compiled form of "no torch, no BLAS here", whatever an include
    macro, a namespace alias or a wrapper spells. Judged in the task process, after its build."""
    return CompiledRule("never_references", names, why)


def calls_each_time(api: str, why: str, entries: str | Sequence[str] = ()) -> Rule:
    """As `calls`, and on a GPU the observed call of each of `entries` makes a CUDA runtime call
    matching `api` (cudaMemcpyAsync, cudaGraphLaunch ...)."""
    return CompiledRule("calls_each_time", api, why, entries=_entries(entries))


def no_runtime_calls(api: str, why: str, entries: str | Sequence[str] = ()) -> Rule:
    """On a GPU, the observed call of each of `entries` makes no CUDA runtime call matching `api`
    (cudaMalloc, cudaFree, cudaMemcpy, cudaDeviceSynchronize ...). One-time work done by an
    earlier call (a buffer allocated once) is no part of the observed call."""
    return CompiledRule("no_runtime_calls", api, why, entries=_entries(entries))


def replays_graph(why: str, entries: str | Sequence[str] = ()) -> Rule:
    """The entry point's code reaches cudaGraphLaunch; on a GPU its observed call (of a size an
    earlier call already ran) launches a graph and launches no kernel outside it."""
    return CompiledRule("graph_replay", "", why, entries=_entries(entries))


def pinned_copies(why: str, entries: str | Sequence[str] = ()) -> Rule:
    """The code allocates or registers pinned host memory (cudaMallocHost, cudaHostAlloc,
    cudaHostRegister); on a GPU every host-device copy of the observed call moves pinned memory."""
    return CompiledRule("pinned_copies", "", why, entries=_entries(entries))


def uses_tensor_cores(why: str, entries: str | Sequence[str] = (), kernels: str = "", case: str = "") -> Rule:
    """A kernel the entry points reach (named like `kernels`, a regex, if given) executes
    tensor-core instructions (SASS: HMMA, HGMMA ...); on a GPU, one the observed call launched
    does. `case` names the case of that call where the path depends on the shape (a GEMM beside
    a GEMV for one row)."""
    return CompiledRule("tensor_cores", kernels, why, entries=_entries(entries), case=case)


def uses_cuda_cores(why: str, entries: str | Sequence[str] = (), kernels: str = "") -> Rule:
    """No kernel the entry points reach (named like `kernels`, if given) executes a tensor-core
    instruction; on a GPU, none the observed call launched from the task's files does."""
    return CompiledRule("no_tensor_cores", kernels, why, entries=_entries(entries))


def uses_inline_ptx(instruction: str, why: str, entries: str | Sequence[str] = ()) -> Rule:
    """A kernel the entry points reach has, in an asm statement whose result is used (the
    compiler drops one whose result is not), an instruction matching `instruction` (a regex on
    "mnemonic %special": "fma\\.rn\\.f32", "mov\\.u32 %laneid"); on a GPU, one the observed call
    launched does."""
    return CompiledRule("inline_ptx", instruction, why, entries=_entries(entries))


def executes(
    opcode: str, why: str, entries: str | Sequence[str] = (), kernels: str = "", each_call: bool = True
) -> Rule:
    """A kernel the entry points reach (named like `kernels`, if given) executes a SASS
    instruction matching `opcode` (a regex on the opcode with its modifiers: "SHFL\\.DOWN",
    "LDG(\\.\\w+)*\\.128" for a 16-byte load); with `each_call`, on a GPU one the observed call
    launched does too (leave it off where the kernel a call picks depends on the shape: an aligned
    float4 path beside a scalar one). The compiled form of "uses a warp shuffle" or "loads float4":
    however the source spells it."""
    kind = "sass" if each_call else "sass_reached"
    return CompiledRule(kind, opcode, why, entries=_entries(entries), kernels=kernels)


def never_executes(opcode: str, why: str, entries: str | Sequence[str] = (), kernels: str = "") -> Rule:
    """No kernel the entry points reach (named like `kernels`, if given) has a SASS instruction
    matching `opcode`; on a GPU, none the observed call launched from the task's files has. The
    compiled form of "no divergent branch" (BSSY/BSYNC: the reconvergence a divergent branch
    needs; a branch the compiler turned into predicated or selected instructions has none)."""
    return CompiledRule("no_sass", opcode, why, entries=_entries(entries), kernels=kernels)


def launches_kernel(kernels: str, why: str, entries: str | Sequence[str] = ()) -> Rule:
    """A kernel named like `kernels` (a regex on the demangled name: CUTLASS's
    `cutlass::gemm::kernel::Gemm<...LinearCombinationRelu...>`) is compiled and reached by the
    entry points; on a GPU the observed call launched one."""
    return CompiledRule("kernel_named", kernels, why, entries=_entries(entries))


def launches(count: int, why: str, entries: str | Sequence[str] = ()) -> Rule:
    """On a GPU, the observed call of each of `entries` launches exactly `count` kernels (a fused
    kernel: 1), whichever library holds them."""
    return CompiledRule("kernels", "", why, entries=_entries(entries), count=count)


def library_does_the_product(why: str, entries: str | Sequence[str] = (), only: bool = False) -> Rule:
    """On a GPU, the observed call of each of `entries` launches at least one kernel that the
    task's own library does not hold (cuBLAS's, cuDNN's): the product ran in the library. With
    `only`, it launches no kernel of the task's own either (a ReLU fused into the library's
    graph, not added by a kernel of the student's)."""
    return CompiledRule("library_kernels", "", why, entries=_entries(entries), count=-1 if only else 0)


# the rule kinds that read a kernel's machine instructions (the build then runs cuobjdump), and
# those of them judged on the observed call too
SASS_RULES = ("tensor_cores", "no_tensor_cores", "sass", "sass_reached", "no_sass")
OBSERVED_SASS_RULES = ("tensor_cores", "no_tensor_cores", "sass", "no_sass")


def shown(pattern: str) -> str:
    """A rule's regex as a student reads it: cudaStreamCreate* or cudaHostAlloc, fma.rn.f32."""
    return re.sub(r"\\w[*+]", "*", pattern).replace("\\", "").replace("|", " or ")


def opcodes_matching(pattern: str, opcodes: Sequence[str] | None) -> list[str]:
    """The distinct SASS opcodes (with modifiers) that `pattern` matches at their start: what a
    never_executes rule forbids, on the build and on the observed call alike."""
    return sorted({op for op in opcodes or () if re.match(pattern, op)})


def symbol_matches(pattern: str, symbol: str) -> bool:
    """`pattern` names the function; the runtime's per-thread-stream and versioned spellings of it
    (cudaMemcpyAsync_ptsz, cuGetProcAddress_v2) count as it."""
    return re.fullmatch(rf"(?:{pattern})(?:_ptsz|_ptds|_v\d+)?", symbol) is not None
