"""kiln_llm's code generator: one CUDA kernel written for each `fused` node (given code).

The fusion pass (kiln_llm/fusion.py, task 04) replaces a group of pointwise nodes by one node

    %t9 = fused(%x, %scale, %shift) {program = "mul $0 $1; add $3 $2; silu $4"} : f16[4, 64]

whose `program` lists the group's operations in order over numbered values: $0 .. $(n-1) are the
node's n inputs, and instruction i's result is $(n+i); the last instruction's result is the
output. Every input is broadcast to the output's shape (numpy's rule), every value is computed in
float32, and the output is rounded to the inputs' dtype once, at the end: a chain of five f16
operations costs one read of each input, one write and one rounding, where five kernels would pay
five of each. The program is a string so that the text form (kiln/text.py) prints and parses it.

This file gives the operator three things:
  - its OpDef (shape inference: the program is checked, the output shape is the inputs' broadcast);
  - its CPU kernel, which runs the program with torch in float32 (the reference);
  - its CUDA lowering: `kernel_source(node)` writes a kernel for the node's STRUCTURE (program,
    dtype, number of inputs and which of them broadcast), `compile_fused` builds it with the
    course's cached nvcc build (grader/build/nvcc.py) and loads it, and a compilation cache in
    this process maps each structure to its loaded kernel, so the 32 layers of a model that share
    one pattern compile it once. Names, values and shapes are not part of the key: shapes and
    strides reach the kernel at run time, in its meta array.

The generated entry point (one per structure; KEY is a hash of the structure):

    kiln_fused_KEY(void* out, const void* const* ins, const int64_t* meta, cudaStream_t stream)

`ins` is a HOST array of the n input pointers (device memory), `meta` a HOST array of 4 + 4n
int64: the output's shape padded to 4 dims, then each input's strides in elements along those 4
dims (0 where it broadcasts), as lab 4's kiln_binary takes them. Both are copied into a struct
passed to the kernel by value, so a captured CUDA graph keeps them.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kiln import ops
from kiln.cpu import register_cpu
from kiln.ir import DType, Node, TensorType
from kiln.runtime import KilnRunError
from kiln.shapes import ShapeError, broadcast_shapes, make_type, require_float, same_dtype

RANK = 4  # shapes reach the kernel padded to 4 dims with leading 1s, as in lab 4
MAX_INPUTS = 32  # the kernel's argument struct holds the pointers and strides: 4 KiB allows ~100
THREADS = 256
MAX_BLOCKS = 4096  # a grid-stride loop covers the rest (lab 4's pointwise.cu explains why)


# --- the operations a program may use ------------------------------------------------------------


@dataclass(frozen=True)
class PointwiseOp:
    """One operation of a program: its number of arguments, its CUDA expression over float
    arguments `{0}`, `{1}`, and the torch function the CPU kernel applies to float32 tensors."""

    arity: int
    cuda: str
    torch_fn: Callable[..., torch.Tensor]


POINTWISE: dict[str, PointwiseOp] = {
    "add": PointwiseOp(2, "{0} + {1}", torch.add),
    "sub": PointwiseOp(2, "{0} - {1}", torch.sub),
    "mul": PointwiseOp(2, "{0} * {1}", torch.mul),
    "neg": PointwiseOp(1, "-{0}", torch.neg),
    # relu and silu as lab 4's kernels write them (pointwise.cu)
    "relu": PointwiseOp(1, "({0} > 0.0f ? {0} : 0.0f)", torch.relu),
    "silu": PointwiseOp(1, "{0} / (1.0f + expf(-{0}))", torch.nn.functional.silu),
    "exp": PointwiseOp(1, "expf({0})", torch.exp),
}

# (operation, the value numbers it reads)
Instr = tuple[str, tuple[int, ...]]


def format_program(program: Sequence[Instr]) -> str:
    """[("mul", (0, 1)), ("silu", (2,))] -> "mul $0 $1; silu $2" (the `program` attribute)."""
    return "; ".join(" ".join([op, *(f"${a}" for a in args)]) for op, args in program)


def parse_program(text: Any, n_inputs: int) -> list[Instr]:
    """The instructions of a program over `n_inputs` inputs; ShapeError naming the first problem:
    an unknown operation, a wrong number of arguments, a value read before it exists, an input
    no instruction reads."""
    if not isinstance(text, str) or not text.strip():
        raise ShapeError(f'program = {text!r}: a fused node\'s program is a string such as "mul $0 $1; silu $2"')
    program: list[Instr] = []
    for i, part in enumerate(text.split(";")):
        op, *refs = part.split()
        if op not in POINTWISE:
            raise ShapeError(f"program instruction {i} ({part.strip()!r}): unknown operation {op!r} "
                             f"(a program uses {', '.join(POINTWISE)})")  # fmt: skip
        if len(refs) != POINTWISE[op].arity:
            raise ShapeError(f"program instruction {i} ({part.strip()!r}): {op} takes {POINTWISE[op].arity} values")
        args = []
        for r in refs:
            if not (r.startswith("$") and r[1:].isdigit()):
                raise ShapeError(f"program instruction {i} ({part.strip()!r}): {r!r} is not a value ($0, $1, ...)")
            a = int(r[1:])
            if a >= n_inputs + i:
                raise ShapeError(
                    f"program instruction {i} ({part.strip()!r}) reads ${a}: only $0..${n_inputs + i - 1} exist there"
                    f" ({n_inputs} inputs, then one value per earlier instruction)"
                )
            args.append(a)
        program.append((op, tuple(args)))
    unread = sorted(set(range(n_inputs)) - {a for _, args in program for a in args})
    if unread:
        raise ShapeError(f"program {text!r} never reads input(s) {', '.join(f'${a}' for a in unread)}")
    return program


def program_of(node: Node) -> list[Instr]:
    return parse_program(node.attrs["program"], len(node.inputs))


# --- the operator --------------------------------------------------------------------------------


def _infer_fused(inputs: Sequence[TensorType], attrs: Mapping[str, Any]) -> TensorType:
    if not 1 <= len(inputs) <= MAX_INPUTS:
        raise ShapeError(f"a fused node takes 1 to {MAX_INPUTS} inputs, got {len(inputs)}")
    same_dtype(inputs)
    require_float(inputs[0])
    parse_program(attrs["program"], len(inputs))
    shape: tuple[int, ...] = inputs[0].shape
    for t in inputs[1:]:
        shape = broadcast_shapes(shape, t.shape)
    return make_type(shape, inputs[0].dtype)


ops.register(
    ops.OpDef(
        "fused",
        None,  # variadic: one or more inputs
        _infer_fused,
        attrs=("program",),
        doc="a pointwise program over broadcast inputs, computed in f32, rounded once (kiln_llm/codegen.py)",
    )
)


@register_cpu("fused")
def fused_cpu(node: Node, args: Sequence[torch.Tensor]) -> torch.Tensor:
    """The reference: the program with torch, every value float32 at the output's shape."""
    shape = node.type.shape
    values = [torch.broadcast_to(a, shape).float() for a in args]
    for op, refs in program_of(node):
        values.append(POINTWISE[op].torch_fn(*(values[r] for r in refs)))
    return values[-1].to(args[0].dtype).contiguous()


# --- the CUDA source ------------------------------------------------------------------------------

# element type, load as float, store from float (round to nearest even)
_CTYPES: dict[DType, tuple[str, str, str]] = {
    DType.float32: ("float", "v", "v"),
    DType.float16: ("__half", "__half2float(v)", "__float2half_rn(v)"),
    DType.bfloat16: ("__nv_bfloat16", "__bfloat162float(v)", "__float2bfloat16_rn(v)"),
}


def pad4(shape: Sequence[int]) -> list[int]:
    return [1] * (RANK - len(shape)) + list(shape)


@dataclass(frozen=True)
class Structure:
    """What the generated code depends on, and nothing else: the compilation cache's key."""

    program: str  # normalized (format_program of the parsed program)
    dtype: DType
    dense: tuple[bool, ...]  # per input: of the output's shape (read at the flat index, no strides)

    @property
    def key(self) -> str:
        text = f"{self.program}|{self.dtype.short}|{''.join('d' if d else 'b' for d in self.dense)}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def symbol(self) -> str:
        return f"kiln_fused_{self.key}"


def structure_of(node: Node) -> Structure:
    out = pad4(node.type.shape)
    return Structure(
        format_program(program_of(node)), node.type.dtype, tuple(pad4(i.type.shape) == out for i in node.inputs)
    )


def fused_meta(out_shape: Sequence[int], in_shapes: Sequence[Sequence[int]]) -> list[int]:
    """The kernel's meta: out's shape padded to 4 | per input, its strides along those 4 dims in
    elements, 0 where it broadcasts (size 1 under a larger output size)."""
    out = pad4(out_shape)
    meta = list(out)
    for shape in in_shapes:
        full = pad4(shape)
        strides, step = [0] * RANK, 1
        for d in range(RANK - 1, -1, -1):
            strides[d] = 0 if full[d] == 1 and out[d] != 1 else step
            step *= full[d]
        meta += strides
    return meta


def kernel_source(node: Node) -> str:
    """The CUDA source of the kernel for `node`'s structure (its entry point is structure_of(node).symbol)."""
    return source_file([structure_of(node)])


# the headers each dtype needs: a file includes only those of its kernels (cuda_bf16.h alone
# costs nvcc about a second)
_HEADERS = {DType.float32: (), DType.float16: ("cuda_fp16.h",), DType.bfloat16: ("cuda_bf16.h",)}


def source_file(structures: Sequence[Structure]) -> str:
    """One .cu with a kernel and an entry point per structure: a model's kernels, one nvcc run."""
    headers = sorted({h for s in structures for h in _HEADERS[s.dtype]})
    lines = [
        "// Generated by lab5/kiln_llm/codegen.py for fused nodes: do not edit.",
        "#include <cstdint>",
        "",
        *(f"#include <{h}>" for h in headers),
        "",
        '#include "course.h"',
    ]
    return "\n".join(lines) + "\n" + "".join(_kernel(s) for s in structures)


def _kernel(s: Structure) -> str:
    n = len(s.dense)
    ctype, load, store = _CTYPES[s.dtype]
    program = parse_program(s.program, n)
    body: list[str] = []
    if not all(s.dense):
        # the element's 4-D index, last dimension fastest: only a broadcast input needs it
        body += [
            "        int64_t rest = i;",
            "        const int64_t i3 = rest % a.shape[3]; rest /= a.shape[3];",
            "        const int64_t i2 = rest % a.shape[2]; rest /= a.shape[2];",
            "        const int64_t i1 = rest % a.shape[1]; rest /= a.shape[1];",
            "        const int64_t i0 = rest;",
        ]
    for k, dense in enumerate(s.dense):
        strided = " + ".join(f"i{d} * a.stride[{k}][{d}]" for d in range(RANK))
        body.append(f"        const float v{k} = load(a.in[{k}][{'i' if dense else strided}]);")
    for j, (op, refs) in enumerate(program):
        expr = POINTWISE[op].cuda.format(*(f"v{r}" for r in refs))
        body.append(f"        const float v{n + j} = {expr};  // {op}")
    body.append(f"        a.out[i] = store(v{n + len(program) - 1});")
    dense = " ".join("dense" if d else "broadcast" for d in s.dense)
    return f"""
// ---- {s.symbol}
// program: {s.program}
// dtype: {s.dtype.short}; inputs: {dense}
namespace fused_{s.key} {{

typedef {ctype} T;
__device__ __forceinline__ float load(T v) {{ return {load}; }}
__device__ __forceinline__ T store(float v) {{ return {store}; }}

// the launch's arguments, passed by value: a captured CUDA graph keeps them
struct Args {{
    T* out;
    const T* in[{n}];
    int64_t shape[4];        // the output's, padded with leading 1s
    int64_t stride[{n}][4];  // per input, in elements; 0 along a dimension it broadcasts
}};

__global__ void __launch_bounds__({THREADS}) kernel(Args a) {{
    const int64_t n = a.shape[0] * a.shape[1] * a.shape[2] * a.shape[3];
    const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {{
{chr(10).join(body)}
    }}
}}

}}  // namespace fused_{s.key}

COURSE_API cudaError_t {s.symbol}(void* out, const void* const* ins, const int64_t* meta, cudaStream_t stream) {{
    using namespace fused_{s.key};
    Args a;
    a.out = static_cast<T*>(out);
    for (int k = 0; k < {n}; ++k) a.in[k] = static_cast<const T*>(ins[k]);
    for (int d = 0; d < 4; ++d) a.shape[d] = meta[d];
    for (int k = 0; k < {n}; ++k)
        for (int d = 0; d < 4; ++d) a.stride[k][d] = meta[4 + 4 * k + d];
    const int64_t n = a.shape[0] * a.shape[1] * a.shape[2] * a.shape[3];
    if (n < 1) return cudaErrorInvalidValue;
    const int64_t blocks = (n + {THREADS} - 1) / {THREADS};
    kernel<<<static_cast<unsigned int>(blocks < {MAX_BLOCKS} ? blocks : {MAX_BLOCKS}), {THREADS}, 0, stream>>>(a);
    return cudaGetLastError();
}}
"""


# --- compiling, and the cache ----------------------------------------------------------------------

_P = ctypes.c_void_p
FusedFn = Any  # a ctypes function: (out, ins, meta, stream) -> cudaError_t
_CACHE: dict[Any, tuple[ctypes.CDLL, FusedFn]] = {}  # cache_key(node) -> (library, entry point)
_STATS = {"hits": 0, "misses": 0}


def cache_key(node: Node) -> Structure:
    """What the in-process cache files a node's kernel under: its structure (see Structure)."""
    return structure_of(node)


def cache_stats() -> tuple[int, int]:
    """(hits, misses) of the in-process compilation cache since the last clear_cache()."""
    return _STATS["hits"], _STATS["misses"]


def clear_cache() -> None:
    """Forget every loaded kernel and zero the counters (the build folder keeps the libraries,
    so the next miss loads from disk instead of running nvcc again)."""
    _CACHE.clear()
    _STATS["hits"] = _STATS["misses"] = 0


def source_dir() -> Path:
    from grader import paths

    return paths.BUILD / "lab5" / "fused"


def compile_fused(node: Node) -> FusedFn:
    """The loaded kernel of a `fused` node: from the cache, or generated, built and loaded."""
    return compile_many([node])[0]


def compile_many(nodes: Sequence[Node]) -> list[FusedFn]:
    """compile_fused for several nodes: the missing kernels go into one source file, one nvcc run
    (a model's distinct structures cost the time of one build, not one build each)."""
    from grader.build import BuildError, shared_library

    keys = [cache_key(n) for n in nodes]
    todo: dict[Any, Node] = {}  # key -> a node to generate its kernel from
    for key, node in zip(keys, nodes, strict=True):
        if key in _CACHE or key in todo:
            _STATS["hits"] += 1
        else:
            _STATS["misses"] += 1
            todo[key] = node
    if todo:
        built = {key: structure_of(node) for key, node in todo.items()}
        structures = sorted(set(built.values()), key=lambda s: s.key)  # one set, one file: the disk cache hits
        stem = "kiln_fused_" + hashlib.sha256("".join(s.key for s in structures).encode()).hexdigest()[:16]
        folder = source_dir()
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{stem}.cu"
        _write_if_changed(path, source_file(structures))
        try:
            lib_path = shared_library(f"{len(structures)} fused kernel(s)", [path], group="lab5/fused", stem=stem)
        except BuildError as e:
            what = ", ".join(f"%{n.name} (fused) {n.attrs['program']!r}" for n in todo.values())
            raise KilnRunError(f"{what}: {e}") from None
        lib = ctypes.CDLL(str(lib_path))
        for key, s in built.items():
            fn = getattr(lib, s.symbol)
            fn.argtypes = [_P, ctypes.POINTER(_P), ctypes.POINTER(ctypes.c_int64), _P]
            fn.restype = ctypes.c_int
            _CACHE[key] = (lib, fn)  # the library stays loaded as long as the cache holds it
    return [_CACHE[k][1] for k in keys]


def _write_if_changed(path: Path, text: str) -> None:
    """Atomically, and only when different: two processes may generate the same kernel at once."""
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# --- the CUDA lowering -------------------------------------------------------------------------------


def _register_cuda() -> None:
    """kiln.cuda imports torch's CUDA side lazily; registering there costs nothing without a GPU."""
    from kiln.cuda import CudaExecutor, Launch, host_meta, ptr, register_cuda

    @register_cuda("fused")
    def lower_fused(ex: CudaExecutor, node: Node) -> Launch:
        if cache_key(node) not in _CACHE:
            # the first fused node of a graph builds the kernels of all of them, in one nvcc run
            missing = {cache_key(n): n for n in ex.graph.nodes if n.op == "fused" and cache_key(n) not in _CACHE}
            compile_many(list(missing.values()))
        fn = compile_fused(node)
        out = ptr(ex.tensors[node])
        ins = (_P * len(node.inputs))(*(ex.tensors[i].data_ptr() for i in node.inputs))
        meta = host_meta(fused_meta(node.type.shape, [i.type.shape for i in node.inputs]))
        stream = ex.stream_handle
        return lambda: fn(out, ins, meta, stream)  # the closure keeps ins and meta alive


_register_cuda()

__all__ = [
    "MAX_INPUTS",
    "POINTWISE",
    "Instr",
    "Structure",
    "cache_key",
    "cache_stats",
    "clear_cache",
    "compile_fused",
    "compile_many",
    "format_program",
    "fused_cpu",
    "fused_meta",
    "kernel_source",
    "parse_program",
    "program_of",
    "source_file",
    "structure_of",
]
