"""How a PyTorch-extension task is declared: C++/CUDA sources that register torch operators.

The student's sources (and any the course adds, such as the binding that declares the op's
schema) are built with `torch.utils.cpp_extension` in the task process and loaded as a plain
library, whose `TORCH_LIBRARY` blocks register the ops with the dispatcher. An optional Python
file is imported next, for what lives on the Python side of `torch.library` (register_fake,
register_autograd). Each op is then graded through torch the way its users will meet it: its
values on seeded cases against a torch reference, `torch.autograd.gradcheck` in float64,
`torch.library.opcheck`, and `torch.compile(fullgraph=True)` against eager.

Like every spec module, this one never imports torch: declaring a task stays cheap.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import TYPE_CHECKING, Any, ClassVar

from grader.tasks.spec import DEFAULT_TOLERANCE, Case, Rng, Task, Values

if TYPE_CHECKING:
    from grader.child.context import TorchRunContext

# what cpp_extension compiles (by suffix); any other source, e.g. the Python registration file, is not built
NATIVE_SUFFIXES = (".cu", ".cpp", ".cc", ".cxx", ".c")

# (atol, rtol) per output dtype; the CUDA kind's table plus the dtypes torch ops often return
TORCH_TOLERANCE: dict[str, tuple[float, float]] = {
    **DEFAULT_TOLERANCE,
    "bf16": (1e-2, 1e-2),
    "f64": (1e-10, 1e-10),
    "bool": (0.0, 0.0),
}

_QUALIFIED = re.compile(r"[A-Za-z_]\w*::[A-Za-z_]\w*")


@dataclass(frozen=True)
class TorchOp:
    """One operator the extension registers, checked on every case.

    `name` is "namespace::op", called as torch.ops.namespace.op(*args) with make_inputs' values
    named in `args`, in order. `reference(*args)` is torch code, run on clones of the same values
    before the op runs, that returns what the op must return: same type, shape, dtype (compute in
    float64 inside and cast back for an accurate reference). `grad` names the tensor arguments
    that gradcheck differentiates, in float64, so the op must accept float64 tensors; an op with
    none is not gradchecked. `baseline(*args)` is the torch code timed against the op;
    bytes_moved/flops(values) turn its time into GB/s or GFLOP/s. The op must be functional:
    inputs the schema does not mark as written (`Tensor(a!)`) must come back unchanged.
    """

    name: str
    args: Sequence[str]
    reference: Callable[..., Any]
    grad: Sequence[str] = ()
    opcheck: bool = True  # torch.library.opcheck: schema, fake, autograd registration, aot dispatch
    compile: bool = True  # torch.compile(backend="aot_eager", fullgraph=True) agrees with eager
    baseline: Callable[..., Any] | None = None
    bytes_moved: Callable[[Values], float] | None = None
    flops: Callable[[Values], float] | None = None

    @property
    def namespace(self) -> str:
        return self.name.split("::")[0]

    @property
    def op_name(self) -> str:
        return self.name.split("::")[1]


@dataclass(kw_only=True)
class TorchExtensionTask(Task):
    """C++/CUDA sources built with torch.utils.cpp_extension (ninja) into one library whose
    `TORCH_LIBRARY` registrations the grader calls through `torch.ops`.

    `sources` are the student's files; `course_sources` are C++/CUDA files the course provides
    (say, the binding with the schema and the tensor checks), built with them but never graded
    or substituted. `register` is a Python file imported once the library is loaded, for
    torch.library.register_fake / register_autograd: the student's when it is also listed in
    `sources`, else the course's. `extension` names the library (cpp_extension's `name`).

    Keep torch headers out of the kernel's translation unit (a `.cu` with the kernel and a plain
    launcher taking raw pointers and a cudaStream_t, the binding `.cpp` doing the rest): ninja
    then recompiles only the kernel after an edit, in about 2 s instead of the 40-50 s a file
    including <torch/extension.h> costs.

    gpu=False makes it a C++ (CPU) extension: no `.cu` sources, inputs and ops on the CPU, no timing.
    The default timeout leaves room for a cold build of the extension; the build counts against it.
    """

    kind: ClassVar[str] = "torch_ext"

    extension: str
    ops: Sequence[TorchOp]
    cases: Sequence[Case]
    make_inputs: Callable[[dict[str, Any], Rng], Values]
    course_sources: Sequence[str] = ()
    register: str | None = None
    tolerance: dict[str, tuple[float, float]] = field(default_factory=dict)
    check_cases: Sequence[str] = ()  # cases for gradcheck, opcheck and torch.compile; () : the first small case
    gradcheck_tolerance: tuple[float, float] = (1e-5, 1e-3)  # (atol, rtol), gradcheck's own defaults
    timing_case: str | None = None
    seeds: int = 2  # small cases run with this many different random inputs
    cflags: Sequence[str] = ()  # added to -O3 for C++ sources
    cuda_cflags: Sequence[str] = ()  # added to -O3 -lineinfo and the GPU's -gencode for .cu sources
    timeout: float | None = 120.0
    # custom checks, run after every op passed its own (values, opcheck, gradcheck, compile), before timing
    checks: Sequence[Callable[[TorchRunContext], None]] = ()

    def __post_init__(self) -> None:
        def fail(why: str) -> None:
            raise ValueError(f"TorchExtensionTask {self.lab}/{self.number}: {why}")

        if not re.fullmatch(r"[A-Za-z_]\w*", self.extension):
            fail(f"extension {self.extension!r} must be an identifier (it names the library)")
        if not self.native_sources():
            fail(f"no C++/CUDA source among sources and course_sources (suffixes {', '.join(NATIVE_SUFFIXES)})")
        stems = [_object_stem(s) for s in self.native_sources()]
        if len(set(stems)) != len(stems):
            fail(f"two sources share a file name {stems}: cpp_extension names objects by it")
        if not self.gpu and any(s.endswith(".cu") for s in self.native_sources()):
            fail("gpu=False builds a C++ (CPU) extension: it cannot have .cu sources")
        if self.register is not None and not self.register.endswith(".py"):
            fail(f"register {self.register!r} must be a .py file")
        labels = {c.label for c in self.cases}
        for label in [*self.check_cases, *([self.timing_case] if self.timing_case else [])]:
            if label not in labels:
                fail(f"case {label!r} is not among the cases {sorted(labels)}")
        if not self.ops:
            fail("no ops to check")
        for op in self.ops:
            if not _QUALIFIED.fullmatch(op.name):
                fail(f"op {op.name!r} must be qualified as namespace::name")
            missing = set(op.grad) - set(op.args)
            if missing:
                fail(f"{op.name}: grad names {sorted(missing)}, which are not among its args")

    def native_sources(self) -> list[str]:
        """Every file cpp_extension compiles: the student's, then the course's."""
        return [s for s in [*self.sources, *self.course_sources] if s.endswith(NATIVE_SUFFIXES)]

    def register_is_students(self) -> bool:
        return self.register is not None and self.register in self.sources

    def tol(self, dtype: str) -> tuple[float, float]:
        return self.tolerance.get(dtype, TORCH_TOLERANCE.get(dtype, (0.0, 0.0)))

    def checked_cases(self) -> list[Case]:
        """The cases gradcheck, opcheck and torch.compile run on."""
        if self.check_cases:
            return [c for c in self.cases if c.label in self.check_cases]
        small = [c for c in self.cases if c.small and not c.huge]
        return small[:1]

    def case(self, label: str) -> Case:
        return next(c for c in self.cases if c.label == label)


def _object_stem(source: str) -> str:
    """The object file cpp_extension makes of a source: `x.cuda.o` for x.cu, `x.o` for x.cpp."""
    p = PurePath(source)
    return p.stem + (".cuda" if p.suffix == ".cu" else "")
