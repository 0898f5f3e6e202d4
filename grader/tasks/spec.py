"""How a task declares what the grader checks.

A spec file (`labN/tests/test_NN_name.py`) builds one task as `TASK`. Every kind shares `Task`
(the student's files, rules, points, GPU or CPU, timeout); `CudaTask` adds C entry points with
their argument lists, the cases to run (seeded random inputs at edge and large sizes), a PyTorch
reference per entry point, and optional custom checks and a timing baseline. Specs never import
torch at module level: the pytest process that builds and schedules tasks stays light, and only
the task process pays for torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:
    import torch

    from grader.child.context import RunContext
    from grader.tasks.ladder import Ladder

DType = Literal["f32", "f16", "bf16", "i32", "u32", "i64", "u8"]
Role = Literal["in", "out", "inout"]

# (atol, rtol) per dtype: tight enough that zeros, a pass-through or an fp16 round trip fail.
DEFAULT_TOLERANCE: dict[str, tuple[float, float]] = {
    "f32": (1e-5, 1e-5),
    "f16": (1e-3, 1e-3),
    "bf16": (8e-3, 8e-3),  # 8 bits of mantissa: one rounding is 2^-9 relative
    "i32": (0.0, 0.0),
    "u32": (0.0, 0.0),
    "i64": (0.0, 0.0),
    "u8": (0.0, 0.0),
}


@dataclass(frozen=True)
class Buffer:
    """A pointer argument: a device tensor, or a host array when `host` is true.

    `device` is the index of the GPU it lives on, within the task's own set (0 to `gpus` - 1 of
    its task; the first GPU the task process sees is 0). The harness allocates and fills it
    there and compares an output there; only tasks of several GPUs name another than 0."""

    name: str
    dtype: DType
    role: Role = "in"
    host: bool = False
    device: int = 0


@dataclass(frozen=True)
class Scalar:
    """A by-value argument; `ctype` is one of i32, i64, u64, f32."""

    name: str
    ctype: Literal["i32", "i64", "u64", "f32"]


Arg = Buffer | Scalar


def In(name: str, dtype: DType = "f32", device: int = 0) -> Buffer:  # noqa: N802 - reads like a declaration
    return Buffer(name, dtype, "in", device=device)


def Out(name: str, dtype: DType = "f32", device: int = 0) -> Buffer:  # noqa: N802
    return Buffer(name, dtype, "out", device=device)


def InOut(name: str, dtype: DType = "f32", device: int = 0) -> Buffer:  # noqa: N802
    return Buffer(name, dtype, "inout", device=device)


def HostIn(name: str, dtype: DType = "f32") -> Buffer:  # noqa: N802
    return Buffer(name, dtype, "in", host=True)


def HostOut(name: str, dtype: DType = "f32") -> Buffer:  # noqa: N802
    return Buffer(name, dtype, "out", host=True)


def Int(name: str) -> Scalar:  # noqa: N802
    return Scalar(name, "i32")


def Size(name: str) -> Scalar:  # noqa: N802
    return Scalar(name, "u64")


def Float(name: str) -> Scalar:  # noqa: N802
    return Scalar(name, "f32")


Values = dict[str, Any]


def clone_values(values: Values) -> Values:
    """A copy whose tensors can be changed without touching the originals."""
    return {k: v.clone() if hasattr(v, "clone") else v for k, v in values.items()}


@dataclass(frozen=True)
class Entry:
    """One C entry point: `symbol(args...)` returning cudaError_t.

    reference(inputs) returns the expected value of every out/inout buffer, computed with torch on
    clones of the inputs. baseline(inputs, outputs), if given, is the torch code timed against the
    student's. bytes_moved/flops(inputs) turn a time into GB/s or GFLOP/s.
    """

    symbol: str
    args: Sequence[Arg]
    reference: Callable[[Values], Values]
    baseline: Callable[[Values, Values], Any] | None = None
    bytes_moved: Callable[[Values], float] | None = None
    flops: Callable[[Values], float] | None = None
    flop_peak: str = "fp32"  # the FLOP/s limit a timing figure must stay under: fp32 (CUDA cores) | tensor
    tolerance: Mapping[str, tuple[float, float]] = field(default_factory=dict)  # this entry's own, over the task's
    # True for an entry that multiplies with 10-bit mantissas (TF32 tensor cores): its tolerance must
    # admit an error the size of an fp16 rounding of the answer, so `make verify`'s calibration does
    # not hold that fake against it (zeros and a pass-through must still fail)
    reduced_precision: bool = False
    # The compute capabilities the entry runs on, (major, minor) at least and at most; None: no bound.
    # Code built for an architecture-specific target (sm_90a's wgmma and TMA multicast) runs on its
    # own capability alone: min_cc=(9, 0), max_cc=(9, 0). On another card the entry is skipped, and
    # the reason (`unsupported`) names `needs`: none of its cases, timings, ladder rows or rules on
    # its code are judged there, and its performance points are not counted (CudaTask.skipped).
    min_cc: tuple[int, int] | None = None
    max_cc: tuple[int, int] | None = None
    needs: str = ""  # what the entry needs, for the reason: "Hopper: wgmma, TMA"

    def buffers(self, role: Role | None = None) -> list[Buffer]:
        return [a for a in self.args if isinstance(a, Buffer) and (role is None or a.role == role)]

    @property
    def host(self) -> bool:
        return any(b.host for b in self.buffers())

    def unsupported(self, cc: tuple[int, int]) -> str:
        """Why the entry cannot run on a card of compute capability `cc` (its major and minor);
        "" when it can: "hgemm_4 needs an sm_90 card (Hopper: wgmma, TMA); this card is sm_89"."""
        low, high = self.min_cc, self.max_cc
        if (low is None or tuple(cc) >= tuple(low)) and (high is None or tuple(cc) <= tuple(high)):
            return ""

        def sm(c: tuple[int, int]) -> str:
            return f"sm_{c[0]}{c[1]}"

        if low is not None and high is not None:
            card = f"an {sm(low)} card" if tuple(low) == tuple(high) else f"an {sm(low)} to {sm(high)} card"
        elif low is not None:
            card = f"an {sm(low)} or newer card"
        else:
            card = f"an {sm(high)} or older card"  # type: ignore[arg-type]  # one bound is set here
        why = f" ({self.needs})" if self.needs else ""
        return f"{self.symbol} needs {card}{why}; this card is {sm(cc)}"


@dataclass(frozen=True)
class Case:
    """Named parameters for one run, e.g. Case("n=33", n=33).

    small cases are the ones the sanitizer runs (and that get several random draws); huge ones
    (past 2^31 elements, tens of GB) run only when the grade asks for them (`make grade`).
    """

    label: str
    params: dict[str, Any]
    small: bool = True
    huge: bool = False

    def __init__(self, label: str, small: bool | None = None, huge: bool = False, **params: Any) -> None:
        object.__setattr__(self, "label", label)
        object.__setattr__(self, "params", params)
        object.__setattr__(self, "small", self.size <= 1 << 16 if small is None else small)
        object.__setattr__(self, "huge", huge)

    @property
    def size(self) -> int:
        """Product of the integer parameters: roughly how many elements the case touches."""
        n = 1
        for v in self.params.values():
            if isinstance(v, int):
                n *= max(v, 1)
        return n


@dataclass(frozen=True)
class Rule:
    """A rule on the student's code. `forbid` or `require` a regex in the source (comments
    stripped), judged before the build. The other kinds judge what the build compiled, not how the
    source is spelled (grader/tasks/rules.py makes them: NO_LIBRARIES, uses_shared_memory,
    uses_syncthreads): `no_libraries` (the headers the preprocessor read, the libraries the .so
    links), `shared_memory` and `barrier` (per kernel, from ptxas and the PTX; `pattern`, if not
    empty, names the kernels that must each comply, else one kernel is enough)."""

    kind: Literal["forbid", "require", "no_libraries", "shared_memory", "barrier"]
    pattern: str
    why: str
    strings: bool = False  # forbid/require also read string literals (inline PTX lives in asm strings)

    @property
    def compiled(self) -> bool:
        """Judged on the build (CUDA-library tasks), after it, in the grading process."""
        return self.kind not in ("forbid", "require")


@dataclass(frozen=True)
class PerfTarget:
    """Performance points: the metric of `entry` on the timing case must reach `target`.

    metric is "share_of_copy" (achieved GB/s over the measured copy bandwidth), "speedup" (torch
    time over student time), "speedup_over:<symbol>" (another entry point's time over this one's),
    "share_of_peak" (of the card's theoretical FLOP/s, or DRAM bandwidth without FLOPs), "gbps",
    "gflops" or "share_of:<baseline>" (a ladder baseline's time over this one's, e.g. cuBLAS). An
    entry timed only in its task's ladder is judged at the ladder's last sweep size. A gate must
    hold for the reference solution: `make verify` times it and fails when it misses.

    `case` names the case the target is judged on; "" means the task's `timing_case`. Every case
    a target names is timed on every run (lab 3's batch-1 and batch-4096 targets).
    """

    entry: str
    metric: str
    target: float
    points: float
    gate: bool = False
    case: str = ""


@dataclass(kw_only=True)
class Task:
    """What every kind of task declares. A spec file (`labN/tests/test_NN_name.py`) builds one
    task of a concrete kind (CudaTask, TorchExtensionTask, PythonTask, NotebookTask) as `TASK`.

    `sources` are the files the student owns, relative to the lab folder: the grader builds and
    runs exactly these (or the reference solutions under `labN/solutions/`, or a variant the
    grader's own tests substitute).
    """

    kind: ClassVar[str] = "base"

    lab: str
    number: str
    title: str
    sources: Sequence[str]
    rules: Sequence[Rule] = ()
    points: float = 10.0
    perf: Sequence[PerfTarget] = ()
    gpu: bool = True  # False: runs and is graded on a machine without a GPU too
    # how many GPUs the task process must see (at least 1); where fewer are visible the task is
    # `skipped`, naming both counts. The gradebook gives each worker as many GPUs as the most
    # demanding task of the run needs (grader/instructor/gradebook.py: worker_groups).
    gpus: int = 1
    timeout: float | None = None  # seconds for the task process; None: GRADER_TIMEOUT (60)
    # "module:function" the grading process calls before the task's own process starts, outside the
    # sandbox, to make what the task reads (lab 3's trained weights); imported only then, so that
    # declaring a task stays cheap. An exception it raises is the task's `environment` verdict.
    prepare: str | None = None
    # The mistakes this task's cases are designed to catch: a short class name ("tail", "long
    # rows", "replayed results") -> the input or check that exposes it. Every class has a broken
    # variant in labN/solutions/broken.py that must be caught (tests/test_broken_variants.py), and
    # `make verify` counts the variants caught per class.
    mistakes: Mapping[str, str] = field(default_factory=dict)
    spec_file: str = ""  # filled in by the grader: where this spec was loaded from

    @property
    def task_id(self) -> str:
        return f"{self.lab}/{self.number}"

    @property
    def source(self) -> str:
        """The first (for most tasks the only) student file."""
        return self.sources[0]

    def lab_dir(self) -> Path:
        return Path(self.spec_file).resolve().parent.parent


@dataclass(kw_only=True)
class CudaTask(Task):
    """`.cu`/`.cpp` sources built with nvcc into one shared library whose C entry points
    (`COURSE_API`) the grader calls through ctypes on seeded inputs. Each `.cu`/`.cpp` of
    `sources` is its own translation unit; headers listed there are hashed, not compiled.

    nvcc_flags, libraries (cublas, cublasLt, cudnn, curand, cufft: linked as -lNAME) and
    include_packages (PyPI wheels that ship headers: "nvidia-cudnn-frontend", "nvidia-cutlass")
    are per task. output_shapes defaults to the shapes of the reference's outputs.
    """

    kind: ClassVar[str] = "cuda"

    entries: Sequence[Entry]
    cases: Sequence[Case]
    make_inputs: Callable[[dict[str, Any], Rng], Values]
    output_shapes: Callable[[Values], dict[str, tuple[int, ...]]] | None = None
    tolerance: dict[str, tuple[float, float]] = field(default_factory=dict)
    deterministic: bool = True
    timing_case: str | None = None  # label of the case that is timed
    checks: Sequence[Callable[[RunContext], None]] = ()  # custom checks, run before the cases
    seeds: int = 2  # small cases run with this many different random inputs
    nvcc_flags: Sequence[str] = ()
    libraries: Sequence[str] = ()
    include_packages: Sequence[str] = ()
    ladder: Ladder | None = None  # rungs timed side by side over a sweep (grader/tasks/ladder.py)
    # cases timed by `make bench-labN` only, every entry against its baseline, for throughput plots
    # (lab 3's images/s against batch size); not checked for values beyond what the timing verifies
    sweep: Sequence[Case] = ()
    sweep_entries: Sequence[str] = ()  # the entries a sweep times; () means every entry with a baseline
    # Build for the card's architecture-specific target (sm_90a on a 9.0 card, sm_100a on 10.0; the
    # plain architecture before 9.0): wgmma, setmaxnreg and TMA multicast exist only there, and the
    # library then runs on that compute capability alone. The entries that use them say so with
    # min_cc and max_cc, and are skipped on other cards.
    arch_specific: bool = False

    def __post_init__(self) -> None:
        for e in self.entries:
            if e.min_cc is not None and e.max_cc is not None and tuple(e.min_cc) > tuple(e.max_cc):
                raise ValueError(
                    f"CudaTask {self.lab}/{self.number}: {e.symbol}: min_cc {e.min_cc} is past max_cc {e.max_cc}"
                )
        for problem in device_problems(self):
            raise ValueError(f"CudaTask {self.lab}/{self.number}: {problem}")
        labels = {c.label for c in self.cases}
        named = [self.timing_case or "", *(p.case for p in self.perf)]
        missing = [x for x in named if x and x not in labels]
        if missing:
            raise ValueError(
                f"CudaTask {self.lab}/{self.number}: case {missing[0]!r} is not among the cases {sorted(labels)}"
            )
        if len({c.label for c in self.sweep}) != len(self.sweep):
            raise ValueError(f"CudaTask {self.lab}/{self.number}: sweep labels must be distinct")

    def timed_cases(self, bench: bool) -> list[Case]:
        """The cases timed in a run: the timing case, the cases the targets name and, for a
        benchmark, the sweep (rows of a sweep case come back marked `sweep`)."""
        labels = [self.timing_case or "", *(p.case for p in self.perf)]
        chosen = [c for label in dict.fromkeys(labels) if label for c in self.cases if c.label == label]
        if bench:
            chosen += [c for c in self.sweep if c.label not in {x.label for x in chosen}]
        return chosen

    def tol(self, dtype: str, entry: Entry | None = None) -> tuple[float, float]:
        """(atol, rtol) for outputs of `dtype`: the entry's own where it declares one, else the task's,
        else the default."""
        if entry is not None and dtype in entry.tolerance:
            return entry.tolerance[dtype]
        return self.tolerance.get(dtype, DEFAULT_TOLERANCE[dtype])

    def skipped(self, cc: tuple[int, int]) -> dict[str, str]:
        """The entries that cannot run on a card of compute capability `cc`, each with its reason."""
        return {e.symbol: why for e in self.entries if (why := e.unsupported(cc))}

    def entry(self, symbol: str) -> Entry:
        for e in self.entries:
            if e.symbol == symbol:
                return e
        raise KeyError(symbol)

    def shapes(self, inputs: Values, reference: Values | None) -> dict[str, tuple[int, ...]]:
        """Output shapes: the declared function, else the reference's own shapes."""
        if self.output_shapes is not None:
            return self.output_shapes(inputs)
        assert reference is not None, f"{self.task_id}: no output_shapes and no reference to take them from"
        return {k: tuple(v.shape) for k, v in reference.items()}


def device_problems(task: CudaTask) -> list[str]:
    """What is wrong with where a task's arguments live: a device index outside the task's own
    GPUs, a host array given a device, a task of less than one GPU, or several GPUs on a task
    that needs none."""
    problems = []
    if not isinstance(task.gpus, int) or task.gpus < 1:
        problems.append(f"gpus must be a whole number of at least 1, got {task.gpus!r}")
    elif task.gpus > 1 and not task.gpu:
        problems.append(f"gpus={task.gpus} on a task with gpu=False")
    for e in task.entries:
        for b in e.buffers():
            if b.host and b.device != 0:
                problems.append(f"{e.symbol}: `{b.name}` is a host array and cannot live on device {b.device}")
            elif not isinstance(b.device, int) or not 0 <= b.device < max(task.gpus, 1):
                problems.append(
                    f"{e.symbol}: `{b.name}` lives on device {b.device!r}, but the task declares gpus={task.gpus} "
                    f"(devices 0 to {task.gpus - 1})"
                )
    return problems


class Rng:
    """Seeded random inputs on one device; tasks use it instead of touching torch's global RNG."""

    def __init__(self, seed: int, device: str) -> None:
        import torch

        self.device = device
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(seed)

    def randn(self, *shape: int) -> torch.Tensor:
        import torch

        return torch.randn(*shape, generator=self.gen, device=self.device)

    def stream(self) -> int:
        """torch's current CUDA stream as a handle (0 on the CPU, or for the default stream): the
        `stream` argument of an entry point that launches where its caller (an executor) says."""
        if not str(self.device).startswith("cuda"):
            return 0
        import torch

        return torch.cuda.current_stream().cuda_stream

    def integers(self, low: int, high: int, *shape: int, dtype: str = "i32") -> torch.Tensor:
        import torch

        t = {"i32": torch.int32, "i64": torch.int64, "u8": torch.uint8}[dtype]
        return torch.randint(low, high, shape, generator=self.gen, device=self.device).to(t)

    def scalar(self, low: float = -2.0, high: float = 2.0) -> float:
        import torch

        return float(torch.rand((), generator=self.gen, device=self.device) * (high - low) + low)


def torch_dtype(dtype: str) -> torch.dtype:
    import torch

    return {
        "f32": torch.float32,
        "f16": torch.float16,
        "bf16": torch.bfloat16,
        "i32": torch.int32,
        "u32": torch.int32,  # torch has no full uint32 support: same bits, compared exactly
        "i64": torch.int64,
        "u8": torch.uint8,
    }[dtype]
