"""Lab 4 task 06 · the CUDA executor: every node lowered to one launch of your kernels, in one arena.

Implement: `broadcast_meta`, `matmul_batches`, `strided_meta`, the lowerings of the core operators
           (registered in CUDA_LOWERINGS with `@register_cuda`), `launch_all` and
           `CudaExecutor.run`, in the TODO regions. The chapter's sections "Task 06: the CUDA
           executor" and "Lowering a node to a launch" explain them.
Contract:  `CudaExecutor(graph, use_graph=False)` (given code) checks the graph, plans its memory
           with kiln/planner.py (task 01), allocates ONE arena on the GPU and gives every node a
           typed view of it (`ex.tensors[node]`, a view's is its owner's memory), copies the
           constants in, zeroes the buffers and makes one stream (`ex.stream`). It then lowers
           every node: a lowering `fn(ex, node)` returns a `Launch`, a callable without arguments
           that queues the node's kernel on `ex.stream` through `ex.lib` (the kernels of tasks
           03-05, loaded by `load_kernels`) and returns its cudaError_t as an int; or None for a
           node that needs no launch (reshape: a view). All arguments (pointers into the arena,
           host meta arrays) are fixed at lowering time; a launch computes nothing on the host.
           Data is float32; the one int64 tensor a launch may read is slice_update's offsets,
           which it copies (on the device, on `ex.stream`) into a 4-element device array
           the kernel reads when it runs.
           `launch_all()` calls every launch in order and raises KilnRunError("%name (op): <CUDA
           error string>") on the first that fails; with `debug=True` it also synchronizes after
           every launch and names the node whose kernel failed.
           `run({"x": cuda_tensor, ...})` checks its inputs (kiln.runtime.check_inputs) before
           anything is queued, copies them into their arena slots on `ex.stream` (after the
           caller's current stream), launches every node (or replays `ex.cuda_graph`, task 07),
           returns the outputs as new tensors (clones: the arena is reused by the next run) and
           synchronizes `ex.stream`; a CUDA error found there is raised as KilnRunError.
           `kiln.compile(graph, device="cuda" | "cpu", fold=True, **kw)` folds the graph's
           constants (task 08's pass) and picks the executor (given).
Test:      make test-lab4 TASK=06
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from kiln import ops
from kiln.ir import SOURCES, DType, Graph, Node, TensorType
from kiln.planner import plan_memory
from kiln.runtime import KilnRunError, check_inputs, check_shared, torch_dtype
from kiln.shapes import check_graph

KERNELS = Path(__file__).parent / "kernels"
RANK = 4  # every kernel sees shapes padded to 4 dims with leading 1s (kiln_kernels.h)

# a Launch queues one node's kernel(s) on the executor's stream and returns a cudaError_t (0: success)
Launch = Callable[[], int]
Lowering = Callable[["CudaExecutor", Node], Launch | None]
CUDA_LOWERINGS: dict[str, Lowering] = {}

_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_META = ctypes.POINTER(ctypes.c_int64)
# the five entry points of kiln/kernels/kiln_kernels.h: (argtypes), every one returns cudaError_t (int)
SIGNATURES: dict[str, list[Any]] = {
    "kiln_unary": [ctypes.c_int, _P, _P, _I64, _P],
    "kiln_binary": [ctypes.c_int, _P, _P, _P, _META, _P],
    "kiln_matmul": [_P, _P, _P, _I64, _I64, _I64, _I64, _I64, _I64, _P],
    "kiln_strided_copy": [_P, _P, _META, _P],
    "kiln_slice_update": [_P, _P, _P, _META, _P],
}


# --- given: loading the kernels, error strings, the lowering registry ----------------------------


def build_kernels(
    folder: Path,
    *,
    name: str,
    group: str,
    stem: str,
    signatures: Mapping[str, list[Any]],
    split_compile: bool = False,
) -> ctypes.CDLL:
    """Every `folder/*.cu` built into one shared library through the grader's cached nvcc build,
    loaded, and each entry point of `signatures` (name -> argtypes) declared as returning a
    cudaError_t. The sources include their header as "<package>/kernels/<header>.h": the include
    folder is the one above the package. Lab 5's kernels are built the same way, with
    `split_compile` (nvcc spreads each large file over every core: grader.build.shared_library)."""
    from grader.build import BuildError, shared_library

    sources = sorted(folder.glob("*.cu"))
    if not sources:
        raise KilnRunError(f"no CUDA sources in {folder}")
    try:
        path = shared_library(
            name, sources, group=group, stem=stem, include_dirs=[folder.parent.parent], split_compile=split_compile
        )
    except BuildError as e:
        raise KilnRunError(str(e)) from None
    lib = ctypes.CDLL(str(path))
    missing = [entry for entry in signatures if not hasattr(lib, entry)]
    if missing:
        raise KilnRunError(f"{name}: the library defines no {', '.join(missing)} (see the header in {folder.name}/)")
    for entry, argtypes in signatures.items():
        fn = getattr(lib, entry)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
    return lib


@functools.cache
def load_kernels() -> ctypes.CDLL:
    """Every kiln/kernels/*.cu built into one shared library (the grader's cached nvcc build)."""
    return build_kernels(KERNELS, name="kiln's kernels", group="lab4", stem="kiln_kernels", signatures=SIGNATURES)


def error_string(rc: int) -> str:
    """`invalid argument (cudaError 1)`: the runtime's words for a cudaError_t, or its number."""
    from grader.build import cuda_error_string

    return cuda_error_string(rc)


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """No garbage collection inside: for a CUDA graph capture, which a collection could break by
    freeing another executor's graph (executors sit in reference cycles with their launches)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


# @register_cuda("op"): the CUDA lowering of operator `op` (one per operator); lab 5 adds its own
register_cuda = ops.registrar(CUDA_LOWERINGS, "CUDA lowering")


def ptr(t: torch.Tensor) -> ctypes.c_void_p:
    """A tensor's device address, as a kernel argument."""
    return ctypes.c_void_p(t.data_ptr())


def host_meta(values: Sequence[int]) -> ctypes.Array:
    """A HOST int64 array for a kernel's meta: keep it referenced (the launch closure does) for as
    long as the launch may be called."""
    return (ctypes.c_int64 * len(values))(*values)


def pad4(shape: Sequence[int]) -> list[int]:
    """A shape padded to RANK dims with leading 1s: (3, 5) -> [1, 1, 3, 5]."""
    return [1] * (RANK - len(shape)) + list(shape)


def contiguous_strides(shape: Sequence[int]) -> list[int]:
    """Row-major strides in elements: (2, 3, 4) -> [12, 4, 1]."""
    strides, step = [0] * len(shape), 1
    for d in range(len(shape) - 1, -1, -1):
        strides[d] = step
        step *= shape[d]
    return strides


# --- the meta arrays: pure functions of shapes, checked on the CPU too -----------------------------


def broadcast_meta(out_shape: Sequence[int], a_shape: Sequence[int], b_shape: Sequence[int]) -> list[int]:
    """kiln_binary's 12 int64: out's shape padded to 4 | a's strides | b's strides (in elements),
    each operand's stride 0 along an axis it broadcasts. Shapes align on the RIGHT (numpy):
    (2, 3, 4) + (3, 1) -> [1, 2, 3, 4,  24, 12, 4, 1,  3, 0, 1, 0]. Along an axis where out has
    size 1 the index is always 0, so any stride works there (these are the contiguous ones)."""
    # TODO(lab4/06) begin: strides, 0 where an operand broadcasts; see the chapter's section "Lowering"
    out = pad4(out_shape)
    meta = list(out)
    for shape in (a_shape, b_shape):
        full = pad4(shape)  # leading 1s: a lower-rank operand lines up with out's LAST axes
        strides = contiguous_strides(full)
        # a size-1 axis under a larger out axis is read again for every index: stride 0
        meta += [0 if full[d] == 1 and out[d] != 1 else strides[d] for d in range(RANK)]
    return meta
    # ~ raise NotImplementedError("lab4/06: broadcast_meta")
    # TODO(lab4/06) end


# one kiln_matmul call: element offsets of a, b and c, then batch, a's and b's batch strides
MatmulCall = tuple[int, int, int, int, int, int]


def matmul_batches(
    out_batch: Sequence[int], a_batch: Sequence[int], b_batch: Sequence[int], m: int, n: int, k: int
) -> list[MatmulCall]:
    """How to cover a batched matmul with kiln_matmul calls, each (a_offset, b_offset, c_offset,
    batch, a_batch_stride, b_batch_stride) in elements. `out_batch` is the broadcast of the
    operands' batch dims (rank 0 to 2; an operand's may be shorter, aligned on the right).
    One call when a single batch stride per operand walks the whole batch (equal batches, or an
    operand broadcast over all of it: stride 0); otherwise one call per index of the outer batch
    dim, each with its own pointer offsets."""
    # TODO(lab4/06) begin: one call, or one per outer batch index; see the chapter's section "Lowering"
    dims = [1] * (2 - len(out_batch)) + list(out_batch)  # (B0, B1)

    def strides(batch: Sequence[int], matrix: int) -> list[int]:
        full = [1] * (2 - len(batch)) + list(batch)
        s1 = matrix if full[1] > 1 else 0  # 0 where this operand broadcasts
        s0 = full[1] * matrix if full[0] > 1 else 0
        return [s0, s1]

    sa, sb = strides(a_batch, m * k), strides(b_batch, k * n)

    def flat(s: list[int]) -> int | None:
        """The one stride that walks (B0, B1) as a flat index, if there is one."""
        if dims[0] == 1:
            return s[1]
        if dims[1] == 1:
            return s[0]
        return s[1] if s[0] == dims[1] * s[1] else None

    fa, fb = flat(sa), flat(sb)
    if fa is not None and fb is not None:
        return [(0, 0, 0, dims[0] * dims[1], fa, fb)]
    # (2, 1) @ (1, 3) style: the outer index moves the pointers, the inner one the strides
    return [(i * sa[0], i * sb[0], i * dims[1] * m * n, dims[1], sa[1], sb[1]) for i in range(dims[0])]
    # ~ raise NotImplementedError("lab4/06: matmul_batches")
    # TODO(lab4/06) end


def strided_meta(out_shape: Sequence[int], in_strides: Sequence[int], offset: int) -> list[int]:
    """kiln_strided_copy's 9 int64: out's shape padded to 4 | the input strides that go with each
    out axis, padded with 0 | the element offset of out's first element in the input."""
    # TODO(lab4/06) begin: pad shape (1s) and strides (0s) on the left; see the chapter's section "Lowering"
    pad = RANK - len(out_shape)
    return [*pad4(out_shape), *([0] * pad), *in_strides, offset]
    # ~ raise NotImplementedError("lab4/06: strided_meta")
    # TODO(lab4/06) end


# --- the lowerings: node -> launch ------------------------------------------------------------------
# A lowering runs once, when the executor is built: it reads shapes and attributes, computes the
# meta and the pointers, and returns a closure that only calls the kernel. The closure is what runs
# every time (and what task 07 captures), so nothing in it may depend on a host-side value that
# changes from run to run.


def _out_and_args(ex: CudaExecutor, node: Node) -> tuple[ctypes.c_void_p, list[ctypes.c_void_p]]:
    return ptr(ex.tensors[node]), [ptr(ex.tensors[i]) for i in node.inputs]


def _binary(op: int) -> Lowering:
    def lower(ex: CudaExecutor, node: Node) -> Launch:
        # TODO(lab4/06) begin: kiln_binary; see the chapter's section "Lowering"
        out, (a, b) = _out_and_args(ex, node)
        meta = host_meta(broadcast_meta(node.type.shape, node.inputs[0].type.shape, node.inputs[1].type.shape))
        fn, stream = ex.lib.kiln_binary, ex.stream_handle
        return lambda: fn(op, out, a, b, meta, stream)
        # ~ raise NotImplementedError("lab4/06: lower add and mul")
        # TODO(lab4/06) end

    return lower


register_cuda("add")(_binary(0))
register_cuda("mul")(_binary(1))


def _unary(op: int) -> Lowering:
    def lower(ex: CudaExecutor, node: Node) -> Launch:
        # TODO(lab4/06) begin: kiln_unary; see the chapter's section "Lowering"
        out, (x,) = _out_and_args(ex, node)
        fn, n, stream = ex.lib.kiln_unary, node.type.numel, ex.stream_handle
        return lambda: fn(op, out, x, n, stream)
        # ~ raise NotImplementedError("lab4/06: lower relu and silu")
        # TODO(lab4/06) end

    return lower


register_cuda("relu")(_unary(0))
register_cuda("silu")(_unary(1))


@register_cuda("matmul")
def lower_matmul(ex: CudaExecutor, node: Node) -> Launch:
    # TODO(lab4/06) begin: kiln_matmul per matmul_batches call; see the chapter's section "Lowering"
    a_node, b_node = node.inputs
    m, k = a_node.type.shape[-2:]
    n = b_node.type.shape[-1]
    calls = matmul_batches(node.type.shape[:-2], a_node.type.shape[:-2], b_node.type.shape[:-2], m, n, k)
    c, a, b = (ex.tensors[t].data_ptr() for t in (node, a_node, b_node))
    size = node.type.dtype.itemsize  # offsets are in elements, pointers in bytes
    fn, stream = ex.lib.kiln_matmul, ex.stream_handle
    args = [
        (_P(c + co * size), _P(a + ao * size), _P(b + bo * size), batch, m, n, k, sa, sb)
        for ao, bo, co, batch, sa, sb in calls
    ]

    def launch() -> int:
        for one in args:
            rc = fn(*one, stream)
            if rc != 0:
                return rc
        return 0

    return launch
    # ~ raise NotImplementedError("lab4/06: lower matmul")
    # TODO(lab4/06) end


@register_cuda("reshape")
def lower_reshape(ex: CudaExecutor, node: Node) -> Launch | None:
    return None  # a view: ex.tensors[node] already is its input's memory with the new shape


@register_cuda("permute")
def lower_permute(ex: CudaExecutor, node: Node) -> Launch:
    # TODO(lab4/06) begin: a strided copy; see the chapter's section "Lowering"
    out, (x,) = _out_and_args(ex, node)
    src = contiguous_strides(node.inputs[0].type.shape)
    meta = host_meta(strided_meta(node.type.shape, [src[d] for d in node.attrs["dims"]], 0))
    fn, stream = ex.lib.kiln_strided_copy, ex.stream_handle
    return lambda: fn(out, x, meta, stream)
    # ~ raise NotImplementedError("lab4/06: lower permute")
    # TODO(lab4/06) end


@register_cuda("slice")
def lower_slice(ex: CudaExecutor, node: Node) -> Launch:
    # TODO(lab4/06) begin: a strided copy; see the chapter's section "Lowering"
    out, (x,) = _out_and_args(ex, node)
    src = contiguous_strides(node.inputs[0].type.shape)
    offset = sum(s * st for s, st in zip(node.attrs["starts"], src, strict=True))
    meta = host_meta(strided_meta(node.type.shape, src, offset))
    fn, stream = ex.lib.kiln_strided_copy, ex.stream_handle
    return lambda: fn(out, x, meta, stream)
    # ~ raise NotImplementedError("lab4/06: lower slice")
    # TODO(lab4/06) end


@register_cuda("slice_update")
def lower_slice_update(ex: CudaExecutor, node: Node) -> Launch:
    # TODO(lab4/06) begin: device offsets, then the kernel; see the chapter's section "Lowering"
    target, value, offsets = (ex.tensors[i] for i in node.inputs)
    rank = node.type.rank
    # the padded axes get offset 0; the run's offsets land in the tail, copied by the device at
    # run time (a host read here, or a copy made now, would freeze them)
    pad = torch.zeros(RANK, dtype=torch.int64, device=target.device)
    ex.keep.append(pad)
    tail = pad[RANK - rank :]
    meta = host_meta(pad4(node.type.shape) + pad4(node.inputs[1].type.shape))
    fn, stream = ex.lib.kiln_slice_update, ex.stream_handle
    t_p, v_p, o_p = ptr(target), ptr(value), ptr(pad)

    def launch() -> int:
        with torch.cuda.stream(ex.stream):
            tail.copy_(offsets)  # device to device, queued on ex.stream: a CUDA graph captures it
        return fn(t_p, v_p, o_p, meta, stream)

    return launch
    # ~ raise NotImplementedError("lab4/06: lower slice_update")
    # TODO(lab4/06) end


# --- the executor ---------------------------------------------------------------------------------


# lab 4's own operators and their kernels are float32; lab 5's operators bring kernels for f16 and bf16
FLOAT32_ONLY = ("add", "mul", "relu", "silu", "matmul", "permute", "slice", "slice_update")


def _check_dtypes(graph: Graph) -> None:
    """Lab 4's kernels are float32; int64 only as slice_update's offsets. Other operators (a
    reshape, lab 5's) check their own dtypes in their lowerings."""
    for n in graph.nodes:
        if n.op not in FLOAT32_ONLY:
            continue
        data = n.inputs[:2] if n.op == "slice_update" else n.inputs
        bad = [t for t in (n, *data) if t.type.dtype is not DType.float32]
        if n.op == "slice_update" and n.inputs[2].type.dtype is not DType.int64:
            bad.append(n.inputs[2])
        if bad:
            raise KilnRunError(
                f"%{n.name} ({n.op}) reads or makes {bad[0].type} (%{bad[0].name}): lab 4's CUDA kernels are"
                f" float32 (int64 only for slice_update's offsets); lab 5's fusion pass lowers f16 and bf16"
            )


def _shared_sources(graph: Graph, other: CudaExecutor | None) -> dict[Node, torch.Tensor]:
    """This graph's constants and buffers that `other` holds under the same name: node -> other's
    tensor. A name held with another type is an error, not a silent copy."""
    if other is None:
        return {}
    theirs = {(n.op, n.attrs["name"]): t for n, t in other.tensors.items() if n.op in ("constant", "buffer")}
    out: dict[Node, torch.Tensor] = {}
    for n in graph.nodes:
        t = theirs.get((n.op, n.attrs.get("name")))
        if n.op in ("constant", "buffer") and t is not None:
            out[n] = check_shared(n, t)
    return out


def _planned(graph: Graph, shared: set[Node]) -> tuple[Graph, dict[Node, Node]]:
    """The graph the planner sees: a copy in which each shared source (memory another executor
    owns) takes one element, so the arena holds no second copy of it. Returns the copy and the
    map from each node to its copy."""
    copy: dict[Node, Node] = {}
    for n in graph.nodes:
        ty = TensorType((1,), n.type.dtype) if n in shared else n.type
        copy[n] = Node(n.name, n.op, tuple(copy[i] for i in n.inputs), n.attrs, ty)
    return Graph(graph.name, list(copy.values()), [copy[o] for o in graph.outputs]), copy


class CudaExecutor:
    """Runs a graph on the GPU: one arena, one stream, one launch per node (or one CUDA graph)."""

    def __init__(
        self, graph: Graph, *, use_graph: bool = True, debug: bool = False, share_with: CudaExecutor | None = None
    ) -> None:
        """`share_with`: another executor whose constants and buffers of the same name and type
        this one uses in place (lab 5's prompt graph and one-token graph hold one copy of the
        weights and write one KV cache); they take no room in this executor's arena, and the
        capture's warm-up run leaves the shared buffers as it found them."""
        check_graph(graph)
        _check_dtypes(graph)
        missing = sorted({n.op for n in graph.nodes if n.op not in SOURCES and n.op not in CUDA_LOWERINGS})
        if missing:
            raise KilnRunError(f"no CUDA lowering for {missing}: register one with @register_cuda")
        if not torch.cuda.is_available():
            raise KilnRunError("the CUDA executor needs a GPU (torch.cuda.is_available() is False): use device='cpu'")
        self.graph = graph
        self.debug = debug
        self.lib = load_kernels()  # looked up at run time of __init__: a test may wrap it
        shared = _shared_sources(graph, share_with)
        planned, copy = _planned(graph, set(shared)) if shared else (graph, {n: n for n in graph.nodes})
        self.plan = plan_memory(planned)
        self.stream = torch.cuda.Stream()
        self.stream_handle = ctypes.c_void_p(self.stream.cuda_stream)
        self.keep: list[torch.Tensor] = []  # device memory the launches point at (slice_update's offsets)
        # the arena comes from the current stream's pool; ex.stream must not touch it before that's done
        self.arena = torch.empty(max(self.plan.arena_bytes, 1), dtype=torch.uint8, device="cuda")
        self.stream.wait_stream(torch.cuda.current_stream())
        self.tensors: dict[Node, torch.Tensor] = {}
        for n in graph.nodes:
            if n in shared:
                self.tensors[n] = shared[n]
                continue
            if n.op not in SOURCES and ops.get(n.op).view_of is not None:
                # a view is its input's memory seen with its own shape (a shared buffer's too)
                self.tensors[n] = self.tensors[n.inputs[ops.get(n.op).view_of]].view(n.type.shape)
                continue
            start = self.plan.offsets[copy[n]]
            raw = self.arena[start : start + n.type.nbytes]
            self.tensors[n] = raw.view(torch_dtype(n.type.dtype)).view(n.type.shape)
        with torch.cuda.stream(self.stream):
            self.arena.zero_()  # reproducible: an unwritten slot reads 0, not last run's garbage
            for n in graph.of_op("constant"):
                name = n.attrs["name"]
                if n in shared:
                    continue
                value = graph.constants.get(name)
                if not isinstance(value, torch.Tensor):
                    raise KilnRunError(f"constant {name!r} has no value in graph.constants (a parsed graph has none)")
                if tuple(value.shape) != n.type.shape or value.dtype != torch_dtype(n.type.dtype):
                    raise KilnRunError(f"constant {name!r}: value {value.dtype}{list(value.shape)}, node says {n.type}")
                self.tensors[n].copy_(value.detach())
        self.launches: list[tuple[Node, Launch]] = []
        for n in graph.nodes:
            if n.op in SOURCES:
                continue
            launch = CUDA_LOWERINGS[n.op](self, n)
            if launch is not None:
                self.launches.append((n, launch))
        self.stream.synchronize()
        self.cuda_graph: torch.cuda.CUDAGraph | None = None
        if use_graph and self.launches:  # (a graph of views only launches nothing: no graph to capture)
            from kiln.capture import capture

            # the capture's warm-up pass runs every kernel once, and writes the buffers: another
            # executor's (a KV cache shared with it) are put back as they were, this one's zeroed
            with torch.cuda.stream(self.stream):
                saved = {n: self.tensors[n].clone() for n in graph.buffers if n in shared}
            with collection_paused():
                self.cuda_graph = capture(self)  # task 07
            with torch.cuda.stream(self.stream):
                for n in graph.buffers:
                    if n in saved:
                        self.tensors[n].copy_(saved[n])
                    else:
                        self.tensors[n].zero_()
            self.stream.synchronize()

    def launch_all(self) -> None:
        """Queues every node's launch on self.stream, in order; the first failure raises."""
        # TODO(lab4/06) begin: every launch, rc checked; see the chapter's section "Task 06"
        for node, launch in self.launches:
            rc = launch()
            if rc != 0:
                raise KilnRunError(f"%{node.name} ({node.op}): {error_string(rc)}")
            if self.debug:
                try:
                    self.stream.synchronize()  # the kernel's own errors surface here, with its node known
                except RuntimeError as e:
                    raise KilnRunError(f"%{node.name} ({node.op}) failed on the GPU: {e}") from e
        # ~ raise NotImplementedError("lab4/06: launch_all")
        # TODO(lab4/06) end

    def input_slot(self, name: str) -> torch.Tensor:
        """The device tensor the launches (and the CUDA graph) read input `name` from, the same for
        the executor's lifetime. With replay() and output_slot() it is the CUDA-graph idiom without
        run()'s checks, copies and clones, for a caller that runs one graph thousands of times and
        checks its own inputs (lab 5's decode step): write the slots on self.stream, then replay()."""
        for n in self.graph.inputs:
            if n.attrs["name"] == name:
                return self.tensors[n]
        names = [n.attrs["name"] for n in self.graph.inputs]
        raise KilnRunError(f"no input {name!r}: graph {self.graph.name!r} takes {names}")

    def output_slot(self, index: int = 0) -> torch.Tensor:
        """Output `index`'s device tensor: the next run or replay overwrites it."""
        return self.tensors[self.graph.outputs[index]]

    def replay(self) -> None:
        """Queues one forward pass on self.stream over the input slots as they are: no checks, no
        copies, no synchronization; a kernel's failure surfaces as an asynchronous CUDA error."""
        if self.cuda_graph is None:
            self.launch_all()
            return
        with torch.cuda.stream(self.stream):
            self.cuda_graph.replay()

    def run(self, inputs: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
        """One forward pass: new CUDA tensors, one per graph output, in order."""
        # TODO(lab4/06) begin: inputs in, launch or replay, outputs out; see the chapter's section "Task 06"
        given = check_inputs(self.graph, inputs, "cuda")  # before anything is queued
        # the caller may still be writing its inputs on its own stream
        self.stream.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(self.stream):
                for n in self.graph.inputs:
                    # fixed slots: the arena addresses the launches (and a CUDA graph) were built with
                    self.tensors[n].copy_(given[n.attrs["name"]])
                if self.cuda_graph is not None:
                    self.cuda_graph.replay()
                else:
                    self.launch_all()
                # clones: the next run overwrites the arena (and a buffer keeps changing)
                outs = [self.tensors[o].clone() for o in self.graph.outputs]
            self.stream.synchronize()
        except NotImplementedError:
            raise
        except RuntimeError as e:
            raise KilnRunError(
                f"a kernel failed on the GPU ({e}); errors are reported asynchronously: build the executor"
                f" with use_graph=False, debug=True to find the node"
            ) from e
        return outs
        # ~ check_inputs(self.graph, inputs, "cuda")  # given: refuses bad inputs before any work
        # ~ raise NotImplementedError("lab4/06: run")
        # TODO(lab4/06) end


def compile(
    graph: Graph,
    device: str = "cuda",
    *,
    fold: bool = True,
    use_graph: bool = True,
    debug: bool = False,
    share_with: Any = None,
) -> Any:
    """The executor for `device` (kiln.compile, named like torch.compile): CudaExecutor(graph,
    use_graph=..., debug=..., share_with=...) for "cuda", kiln.cpu.CPUExecutor(graph,
    share_with=...) for "cpu" (which has no graph to capture and checks as it goes: use_graph and
    debug are ignored there). With `fold` (the default) the graph first goes through
    `kiln.passes.fold_constants` (task 08) and the executor runs the folded copy (`ex.graph`); its
    folded constants' names avoid `share_with`'s constants, which executors share by name."""
    if device not in ("cpu", "cuda"):
        raise KilnRunError(f"device {device!r}: kiln compiles for 'cuda' or 'cpu'")
    if fold:
        from kiln.passes import fold_constants

        theirs = () if share_with is None else [n.attrs["name"] for n in share_with.graph.of_op("constant")]
        graph = fold_constants(graph, reserved=theirs)
    if device == "cpu":
        from kiln.cpu import CPUExecutor

        return CPUExecutor(graph, share_with=share_with)
    return CudaExecutor(graph, use_graph=use_graph, debug=debug, share_with=share_with)


__all__ = [
    "CUDA_LOWERINGS",
    "CudaExecutor",
    "KilnRunError",
    "Launch",
    "broadcast_meta",
    "compile",
    "load_kernels",
    "matmul_batches",
    "register_cuda",
    "strided_meta",
]
