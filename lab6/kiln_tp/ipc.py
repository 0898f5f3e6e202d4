"""The all-reduces of tasks 02 and 03 from Python: their libraries over ctypes, on one rank each (given code).

    comm = Communicator(lib_path, "ring", capacity=1 << 20, rank=rank, world=world)
    x = comm.tensor(n)             # (n,) float32 view of this rank's shared buffer
    x.copy_(my_values)             # on the current stream
    comm.all_reduce(n)             # in place, on the current stream (or stream=...)
    comm.close()                   # every rank: after its last call

Tasks 02 (02_ring.cu, prefix "ring") and 03 (03_one_shot.cu, prefix "one_shot") export the same C
functions under their own prefix: alloc, buffer, export, open, all_reduce, close, free. A
Communicator calls them in a rank that kiln_tp.launch(world, ..., device="cuda") started (rank r on
GPU r, one process group): it allocates the rank's buffer, exports its CUDA IPC handle, gathers
every rank's handle through the process group (64 bytes each, over gloo) and opens them. Its
buffer is a torch tensor of the library's memory (through `__cuda_array_interface__`: torch does
not own it; keep the Communicator while the tensor is used).

`check_all_reduce` is what the graders of tasks 02 and 03 (lab6/tests/test_02_ring.py and
test_03_one_shot.py) run on every rank: the scenarios below, each rank checking its own result
exactly, the findings of every rank gathered to rank 0. `time_all_reduce` is bench_allreduce.py's.

Every input is a whole number from -8 to 8 (`rank_input`), so every sum over up to 8 ranks is exact
in float32, in any order: a check compares with ==. Each call gets new values (its call number is
in them), so a result left over from an earlier call, or a rank's own input passed through, is wrong.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)
SOURCES = {"ring": "02_ring.cu", "one_shot": "03_one_shot.cu"}  # each prefix's task file, in lab6/
PREFIXES = tuple(SOURCES)
SENTINEL = 4096.0  # what the elements past n hold before a call, and must hold after it
PAD = 64  # elements past n checked against SENTINEL
LATE_S = 0.5  # how long the late rank sleeps before its call
# n of the `sizes` scenario: 1 (fewer elements than ranks), below and past a float4, a chunk's
# tails (n not a multiple of the world, of a chunk, of 4), and several rounds of a grid
SIZES = (1, 2, 3, 4, 5, 7, 8, 9, 1000, 1001, 4099, 65536 + 3, (1 << 20) + 5, 1 << 22)
CAPACITY = (1 << 22) + PAD
# the scenarios, in the order every rank runs them; each name is a test of the task's grader
SCENARIOS = ("sizes", "repeated", "back_to_back", "late", "stream", "graph", "slow_reader")
# how long a rank waits for its queued calls: an honest call takes microseconds to a millisecond,
# the late rank's peers wait LATE_S; a kernel spinning on a flag that never comes is caught here,
# by the scenario and call it hangs in, not by the launch's time limit minutes later
CALL_LIMIT_S = 15.0
# the slow_reader scenario: rank 0's copies from each peer's memory, queued beside its calls; 16
# copies of 256 MB take about 11 ms on an NVLink of 400 GB/s one way, against tens of microseconds
# for the call they slow down
LOAD_BYTES = 1 << 28
LOAD_COPIES = 16
SLOW_N = 1 << 22
# a ring without its last barrier got caught in 12 of 15 such calls on two H200s: five calls miss it
# about once in 3000 runs
SLOW_ROUNDS = 5
ALIGN_N = 1000


class AllReduceError(RuntimeError):
    """A call of the library returned a CUDA error: its name and the call."""


class _CudaArray:
    """A device pointer torch can view as a tensor (`torch.as_tensor`), without owning it."""

    def __init__(self, ptr: int, n: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (n,),
            "typestr": "<f4",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
            "stream": None,  # nothing to wait for: the caller orders its own work
        }


def build_libraries(solutions: bool) -> tuple[dict[str, str], dict[str, str]]:
    """({prefix: shared library path}, {prefix: why it is left out}) for tasks 02 and 03: your
    02_ring.cu and 03_one_shot.cu (or the reference solutions) built by the grader's nvcc build, with
    the course's flags, in the parent process before any rank starts."""
    from grader import paths
    from grader.build import BuildError, shared_library

    lab = paths.ROOT / "lab6"  # the repository's: a staged kiln_tp has no .cu files beside it
    built, left_out = {}, {}
    for prefix, rel in SOURCES.items():
        source = paths.solution_source(lab, rel) if solutions else paths.student_source(lab, rel)
        tag = "sol" if solutions else "student"
        try:
            built[prefix] = str(shared_library(rel, [source], group="lab6", stem=f"{source.stem}.{tag}"))
        except BuildError as e:
            left_out[prefix] = str(e).splitlines()[0]
    return built, left_out


def load_library(path: str | Path, prefix: str) -> ctypes.CDLL:
    """The library of task 02 or 03 with the argument types of its seven functions."""
    if prefix not in PREFIXES:
        raise ValueError(f"prefix must be one of {PREFIXES}, got {prefix!r}")
    lib = ctypes.CDLL(str(path))
    vp, size, i32 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    signatures: dict[str, list[Any]] = {
        "alloc": [size, ctypes.POINTER(vp)],
        "buffer": [vp, ctypes.POINTER(vp)],
        "export": [vp, ctypes.c_char_p],
        "open": [vp, ctypes.c_char_p, i32, i32],
        "all_reduce": [vp, size, vp],
        "close": [vp],
        "free": [vp],
    }
    for name, args in signatures.items():
        fn = getattr(lib, f"{prefix}_{name}")
        fn.argtypes, fn.restype = args, ctypes.c_int
    return lib


class Communicator:
    """One rank's side of a task 02 or 03 all-reduce: its shared buffer of `capacity` floats, every
    other rank's mapped. Made on every rank of the default process group at once (the handles are
    gathered through it), on the rank's current device."""

    def __init__(self, lib_path: str | Path, prefix: str, capacity: int, rank: int, world: int) -> None:
        self.lib = load_library(lib_path, prefix)
        self.prefix, self.capacity, self.rank, self.world = prefix, capacity, rank, world
        self._comm = ctypes.c_void_p()
        self._call("alloc", ctypes.c_size_t(capacity), ctypes.byref(self._comm))
        ptr = ctypes.c_void_p()
        self._call("buffer", self._comm, ctypes.byref(ptr))
        if not ptr.value:
            raise AllReduceError(f"{prefix}_buffer returned a null pointer")
        # (capacity,) float32: the library's memory, viewed, not owned
        self.buffer = torch.as_tensor(_CudaArray(ptr.value, capacity), device=f"cuda:{torch.cuda.current_device()}")
        handle = ctypes.create_string_buffer(HANDLE_BYTES)
        self._call("export", self._comm, handle)
        mine = torch.frombuffer(bytearray(handle.raw), dtype=torch.uint8)
        gathered = [torch.empty(HANDLE_BYTES, dtype=torch.uint8) for _ in range(world)]
        if world > 1:
            dist.all_gather(gathered, mine)  # CPU tensors: gloo
        else:
            gathered = [mine]
        handles = b"".join(bytes(t.tolist()) for t in gathered)  # rank by rank
        self._call("open", self._comm, handles, rank, world)
        self._open = True

    def _call(self, name: str, *args: Any) -> None:
        err = getattr(self.lib, f"{self.prefix}_{name}")(*args)
        if err != 0:
            raise AllReduceError(f"{self.prefix}_{name} returned {_error_name(self.lib, err)} on rank {self.rank}")

    def tensor(self, n: int) -> torch.Tensor:
        """(n,) float32: the first n elements of this rank's shared buffer (its input and its sum)."""
        return self.buffer[:n]

    def all_reduce(self, n: int, stream: torch.cuda.Stream | None = None) -> None:
        """The sum over the ranks of the buffers' first n elements, in place, queued on `stream`
        (the current stream if None). Every rank calls it with the same n, in the same order."""
        s = torch.cuda.current_stream() if stream is None else stream
        self._call("all_reduce", self._comm, ctypes.c_size_t(n), ctypes.c_void_p(s.cuda_stream))

    def close(self) -> None:
        """Unmaps the peers and frees this rank's buffer, once every rank has finished with it."""
        if not self._open:
            return
        self._open = False
        torch.cuda.synchronize()
        if self.world > 1:
            dist.barrier()  # no rank frees its buffer while a peer's kernel may read it
        self._call("close", self._comm)
        if self.world > 1:
            dist.barrier()  # every peer has unmapped it
        self._call("free", self._comm)


def _error_name(lib: ctypes.CDLL, code: int) -> str:
    try:
        name = lib.course_error_name
        name.argtypes, name.restype = [ctypes.c_int], ctypes.c_char_p
        return f"{name(code).decode()} ({code})"
    except (AttributeError, UnicodeDecodeError):
        return f"CUDA error {code}"


# --- the checks -----------------------------------------------------------------------------------


def rank_input(rank: int, call: int, n: int, device: str | torch.device = "cuda") -> torch.Tensor:
    """(n,) float32 of whole numbers from -8 to 8: rank `rank`'s input to call number `call`."""
    i = torch.arange(n, device=device, dtype=torch.int64)
    return ((i * 7 + rank * 13 + call * 5) % 17 - 8).to(torch.float32)


def expected_sum(world: int, call: int, n: int, device: str | torch.device = "cuda") -> torch.Tensor:
    """(n,) float32: the sum over the ranks of their rank_input, exact."""
    total = torch.zeros(n, device=device, dtype=torch.float32)
    for r in range(world):
        total += rank_input(r, call, n, device)
    return total


def describe(got: torch.Tensor, want: torch.Tensor, what: str) -> str:
    """ "" when got == want exactly, else where and how they differ, for a test's message."""
    if got.shape != want.shape:
        return f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    bad = (got != want).nonzero().flatten()
    if not len(bad):
        return ""
    i = int(bad[0])
    return (
        f"{what}: wrong at {len(bad)} of {want.numel()} elements; first at [{i}]: {got[i].item():g}, "
        f"expected {want[i].item():g}"
    )


class _Scenario:
    """The calls of one rank, numbered alike on every rank (so that every rank's inputs to one call
    are of the same call number), and what it found wrong."""

    def __init__(self, comm: Communicator) -> None:
        self.comm = comm
        self.calls = 0
        self.errors: list[str] = []
        self.load: _LinkLoad | None = None

    def next_call(self) -> int:
        self.calls += 1
        return self.calls

    def prepare(self, n: int, call: int) -> None:
        """This rank's input for `call` in the buffer, the sentinel after it (current stream)."""
        buf = self.comm.buffer
        buf[n : n + PAD].fill_(SENTINEL)
        buf[:n].copy_(rank_input(self.comm.rank, call, n))

    def settle(self, what: str) -> None:
        """Waits for everything queued on this rank's GPU, as torch.cuda.synchronize() does (every
        stream, the legacy one too), but at most CALL_LIMIT_S: past it, raises TimeoutError naming `what`
        and the last call. The synchronize runs in a thread, which a hung GPU leaves blocked: the
        rank then stops its scenarios, and the launcher ends the process."""
        failed: list[BaseException] = []
        device = torch.cuda.current_device()  # the rank's: a new thread's current device is GPU 0

        def wait() -> None:
            try:
                torch.cuda.synchronize(device)
            except BaseException as e:  # a kernel's error (a misaligned address) is the scenario's
                failed.append(e)

        waiter = threading.Thread(target=wait, daemon=True)
        waiter.start()
        waiter.join(CALL_LIMIT_S)
        if waiter.is_alive():
            raise TimeoutError(
                f"{what}, call {self.calls}: the GPU had not finished {CALL_LIMIT_S:g} s later; a kernel is "
                "waiting for a flag that never comes (a peer that never arrived, failed, or wrote another value)"
            )
        if failed:
            raise failed[0]

    def check(self, got: torch.Tensor, n: int, call: int, what: str) -> None:
        message = describe(got, expected_sum(self.comm.world, call, n), f"{what} (n={n})")
        if message:
            self.errors.append(message)

    def check_tail(self, n: int, what: str) -> None:
        after = self.comm.buffer[n : n + PAD]
        message = describe(after, torch.full_like(after, SENTINEL), f"{what} (n={n}): the elements past n")
        if message:
            self.errors.append(message + " (they must be left alone)")


def _sizes(s: _Scenario) -> None:
    for n in SIZES:
        call = s.next_call()
        s.prepare(n, call)
        s.comm.all_reduce(n)
        s.settle(f"one call, n={n}")
        s.check(s.comm.tensor(n), n, call, "one call")
        s.check_tail(n, "one call")


def _repeated(s: _Scenario) -> None:
    n = 4099
    for k in range(4):
        call = s.next_call()
        s.prepare(n, call)
        s.comm.all_reduce(n)
        s.settle(f"call {k + 1} of 4, n={n}")
        s.check(s.comm.tensor(n), n, call, f"call {k + 1} of 4 on new inputs")


def _back_to_back(s: _Scenario) -> None:
    """Three calls queued on one stream with no wait on the host between them: each next input is
    written into the buffer after the previous sum was copied out, in stream order."""
    n = (1 << 20) + 5
    calls = [s.next_call() for _ in range(3)]
    inputs = [rank_input(s.comm.rank, c, n) for c in calls]
    outs = []
    for x in inputs:
        s.comm.tensor(n).copy_(x)
        s.comm.all_reduce(n)
        outs.append(s.comm.tensor(n).clone())
    s.settle(f"three calls back to back, n={n}")
    for k, (c, out) in enumerate(zip(calls, outs, strict=True)):
        s.check(out, n, c, f"back-to-back call {k + 1} of 3")


def _late(s: _Scenario) -> None:
    """The last rank sleeps LATE_S seconds on the host before it writes its input and calls: the
    others' calls must wait for it, not read what its buffer held before."""
    for n in (1000, (1 << 20) + 3):
        call = s.next_call()
        if s.comm.rank == s.comm.world - 1:
            s.settle(f"before the late call, n={n}")
            time.sleep(LATE_S)
        s.prepare(n, call)
        s.comm.all_reduce(n)
        s.settle(f"rank {s.comm.world - 1} late, n={n}")
        s.check(s.comm.tensor(n), n, call, f"rank {s.comm.world - 1} {LATE_S:g} s late")


def _stream(s: _Scenario) -> None:
    """The call on a stream of torch's (not the legacy default stream), behind a kernel that keeps
    the stream busy for tens of milliseconds, then the input's copy: the all-reduce must run after
    them, on that stream."""
    n = (1 << 18) + 1
    call = s.next_call()
    x = rank_input(s.comm.rank, call, n)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # cycles: tens of milliseconds
        s.comm.buffer[n : n + PAD].fill_(SENTINEL)
        s.comm.tensor(n).copy_(x)
        s.comm.all_reduce(n, stream=side)
        out = s.comm.tensor(n).clone()
    s.settle(f"on a non-default stream, n={n}")
    s.check(out, n, call, "on a non-default stream")


def _graph(s: _Scenario) -> None:
    """The input's copy, the call and the sum's copy captured in one CUDA graph, replayed three times
    on new inputs: the epochs live on the device, so each replay synchronizes anew."""
    n = 8191
    static_in = torch.zeros(n, device="cuda")
    static_out = torch.zeros(n, device="cuda")
    graph = torch.cuda.CUDAGraph()
    s.settle("before the capture")
    with torch.cuda.graph(graph):
        s.comm.tensor(n).copy_(static_in)
        s.comm.all_reduce(n)  # on the capture's stream: torch makes it current
        static_out.copy_(s.comm.tensor(n))
    for k in range(3):
        call = s.next_call()
        static_in.copy_(rank_input(s.comm.rank, call, n))
        graph.replay()
        s.settle(f"CUDA graph replay {k + 1} of 3, n={n}")
        s.check(static_out, n, call, f"CUDA graph replay {k + 1} of 3")


class _LinkLoad:
    """Rank 0's side of the slow_reader scenario: every rank allocates LOAD_BYTES outside torch and
    exports its CUDA IPC handle (cuda-python's runtime); rank 0 maps every peer's and, at each
    `start`, queues LOAD_COPIES copy-engine copies from each into its own memory, one side stream a
    peer. They travel the links the way rank 0's reads of its peers' buffers do, and take their
    share of each link's bandwidth from those reads: rank 0 reads its peers more slowly than they
    read it. Made on every rank at once (the handles are gathered through the process group); a
    rank whose set-up fails raises on every rank, after the gather, so that none waits for it."""

    def __init__(self, rank: int, world: int) -> None:
        self.source = 0
        self.mapped: list[int] = []
        self.copies: list[tuple[torch.cuda.Stream, int, torch.Tensor]] = []
        raw: bytes | str
        try:
            from cuda.bindings import runtime as cudart

            self.cudart = cudart
            _cudart_ok(cudart.cudaSetDevice(torch.cuda.current_device()), "cudaSetDevice")  # cuda-python's own
            self.source = _cudart_ok(cudart.cudaMalloc(LOAD_BYTES), "cudaMalloc")
            handle = _cudart_ok(cudart.cudaIpcGetMemHandle(self.source), "cudaIpcGetMemHandle")
            raw = ctypes.string_at(handle.getPtr(), HANDLE_BYTES)
        except Exception as e:  # no cuda-python, no memory left
            raw = f"rank {rank}: {type(e).__name__}: {e}"
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, raw)
        problems = [g for g in gathered if isinstance(g, str)]
        if problems:
            raise RuntimeError("the slow_reader scenario's set-up (not your library) failed: " + "; ".join(problems))
        if rank == 0:
            for p in range(1, world):
                peer = cudart.cudaIpcMemHandle_t()
                ctypes.memmove(peer.getPtr(), gathered[p], HANDLE_BYTES)
                ptr = _cudart_ok(
                    cudart.cudaIpcOpenMemHandle(peer, cudart.cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle"
                )
                self.mapped.append(int(ptr))
                self.copies.append(
                    (torch.cuda.Stream(), int(ptr), torch.empty(LOAD_BYTES, dtype=torch.uint8, device="cuda"))
                )

    def start(self) -> None:
        """Queues the copies (rank 0), after the work queued so far on the current stream."""
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyDefault
        for stream, src, dst in self.copies:
            stream.wait_stream(torch.cuda.current_stream())
            for _ in range(LOAD_COPIES):
                _cudart_ok(
                    self.cudart.cudaMemcpyAsync(dst.data_ptr(), src, LOAD_BYTES, kind, stream.cuda_stream),
                    "cudaMemcpyAsync",
                )

    def close(self) -> None:
        """Every rank, once every rank finished its scenarios: rank 0 unmaps the peers' memory, then
        each frees its own."""
        torch.cuda.synchronize()
        self.copies.clear()
        for ptr in self.mapped:
            _cudart_ok(self.cudart.cudaIpcCloseMemHandle(ptr), "cudaIpcCloseMemHandle")
        self.mapped.clear()
        dist.barrier()  # no rank frees what rank 0 still maps
        _cudart_ok(self.cudart.cudaFree(self.source), "cudaFree")


def _cudart_ok(result: Any, what: str) -> Any:
    """cuda-python's (error, value...) tuple: the value, or RuntimeError naming the call."""
    from grader.build import cuda_error_string

    err, *value = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeError(
            f"{what} failed: {cuda_error_string(int(err))} (the slow_reader scenario's own set-up, not your library)"
        )
    return value[0] if len(value) == 1 else tuple(value) if value else None


def _slow_reader(s: _Scenario) -> None:
    """Rank 0 reads its peers' buffers slowly (_LinkLoad's copies share its links), and every other
    rank, as soon as its call is done on its stream, writes its next input into its buffer: a rank
    whose call ends (or writes its sum) while a peer may still be reading its buffer hands that
    peer its next input (or its sum) in place of its input. Each of SLOW_ROUNDS rounds starts with
    a small call, whose barriers line the GPUs up without the hosts; rank 0's copies start after
    it. Rank 0's sums of the large calls are checked."""
    if s.load is None:  # one rank: nobody to be slow against
        return
    n, rank = SLOW_N, s.comm.rank
    for k in range(SLOW_ROUNDS):
        s.prepare(ALIGN_N, s.next_call())
        s.comm.all_reduce(ALIGN_N)
        call = s.next_call()
        following = rank_input(rank, call + 1, n)  # made before the call: nothing delays the write
        s.prepare(n, call)
        s.load.start()
        s.comm.all_reduce(n)
        if rank == 0:
            out = s.comm.tensor(n).clone()
        else:
            s.comm.tensor(n).copy_(following)  # this rank moves on at once
        s.settle(f"slow-reader call {k + 1} of {SLOW_ROUNDS}, n={n}")
        if rank == 0:
            s.check(out, n, call, f"rank 0 reading slowly, call {k + 1} of {SLOW_ROUNDS}")


RUNS: dict[str, Callable[[_Scenario], None]] = {
    "sizes": _sizes,
    "repeated": _repeated,
    "back_to_back": _back_to_back,
    "late": _late,
    "stream": _stream,
    "graph": _graph,
    "slow_reader": _slow_reader,
}


def check_all_reduce(rank: int, world: int, lib_path: str, prefix: str) -> dict[str, list[list[str]]]:
    """Run by kiln_tp.launch on every rank: every scenario in order on one Communicator. Returns
    (on rank 0: launch's result) {scenario: [what rank 0 found wrong, rank 1's, ...]}. A scenario
    that raises ends the run (the ranks' calls no longer pair up): it and the ones after say why.
    The findings are gathered before the communicator is closed, and it is closed only where every
    rank finished its scenarios: close's barriers would otherwise pair with a rank that raised,
    and wait in the gather, which is where that rank is."""
    found: dict[str, list[str]] = {name: [] for name in SCENARIOS}
    failed = ""
    try:
        comm = Communicator(lib_path, prefix, CAPACITY, rank, world)
    except Exception as e:  # the skeleton's cudaErrorNotYetImplemented, a failed IPC open
        comm, failed = None, "set-up"
        for name in SCENARIOS:
            found[name].append(f"setting up the communicator failed: {e}")
    load = None
    if world > 1:
        try:  # on every rank, communicator or not: its gather pairs up
            load = _LinkLoad(rank, world)
        except Exception as e:
            found["slow_reader"].append(str(e))
    if comm is not None:
        s = _Scenario(comm)
        s.load = load
        for name in SCENARIOS:
            if failed:
                found[name].append(f"not run: scenario {failed!r} raised first")
                continue
            s.errors = found[name]  # empty, or the link load's failed set-up (slow_reader)
            try:
                RUNS[name](s)
            except Exception as e:  # a CUDA error, a capture that fails, a call that never finishes
                failed = name
                s.errors.append(f"raised {type(e).__name__}: {e} ({_where(e)})")
    finished = comm is not None and not failed and (load is not None or world == 1)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (found, finished))
    if all(f for _, f in gathered):
        if load is not None:
            load.close()
        comm.close()
    return {name: [g[name] for g, _ in gathered] for name in SCENARIOS}


def _where(e: BaseException) -> str:
    frames = traceback.extract_tb(e.__traceback__)
    return f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"


# --- timing (bench_allreduce.py) ------------------------------------------------------------------


def time_all_reduce(
    rank: int, world: int, libs: dict[str, str], sizes: list[int], iters: int, reps: int
) -> dict[str, dict[int, float]]:
    """Run by kiln_tp.launch on every rank: microseconds per all-reduce of each size in bytes
    (float32), for each library ({prefix: path}) and for NCCL (torch.distributed.all_reduce). Each
    is timed as the decode step runs it: `iters` calls captured in one CUDA graph (no host in
    between), the graph replayed once untimed, then `reps` times between CUDA events on rank 0; the
    median replay over `iters`. The ranks line up before each size. A library that cannot set up
    (the skeleton) is left out."""
    out: dict[str, dict[int, float]] = {}
    capacity = max(sizes) // 4
    for prefix, path in libs.items():
        try:
            comm = Communicator(path, prefix, capacity, rank, world)
        except AllReduceError:
            continue
        out[prefix] = {}
        for size in sizes:
            n = size // 4
            comm.tensor(n).copy_(rank_input(rank, 0, n))
            out[prefix][size] = _time(functools.partial(comm.all_reduce, n), iters, reps)
        comm.close()
    out["nccl"] = {}
    for size in sizes:
        t = torch.ones(size // 4, device="cuda")
        out["nccl"][size] = _time(functools.partial(dist.all_reduce, t), iters, reps)
    return out


def _time(call: Callable[[], None], iters: int, reps: int) -> float:
    """Microseconds per call: the median of `reps` replays of a graph of `iters` calls."""
    call()  # outside any capture: NCCL's and the library's first-call set-up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            call()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / iters)
    del graph
    return sorted(times)[len(times) // 2]
