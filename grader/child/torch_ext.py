"""Runs a PyTorch-extension task in the task process: build, load, then check each op through torch.

The build happens here, not in the grading process where nvcc builds the CUDA kind: cpp_extension
needs torch, which this process already has (the fork server imported it), and loading the
library runs its static initializers, the TORCH_LIBRARY registrations, which belong in the
process that is allowed to crash. Each set of graded files keeps its own build directory under
.build/torch_ext across runs, so ninja recompiles only the translation units that changed.
cpp_extension's JIT versioner lives in the process: a fresh task process always starts at
version 0, so the library's name, the flags and build.ninja stay the same and ninja stays
incremental. A new directory (another variant of the same task) starts as a copy of a sibling's,
so the course's files are not compiled again for it. The student's and the solution's directories
are remembered for `make test-labN`'s head start, which runs ninja there before pytest starts
(grader/build/head_start.py): after an edit, the build here usually finds nothing left to do.

Then, per op: its values on every case against the torch reference, torch.library.opcheck,
gradcheck in float64, torch.compile(fullgraph=True) against eager, and the timing. An exception
out of the op (a CUDA error above all) is the student's crash; one out of the grader or the
spec propagates and becomes a grader error.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grader import paths, toolchain
from grader.build import head_start
from grader.build.nvcc import environment_problem, find_ninja, first_error
from grader.child import timing
from grader.child.compare import judge
from grader.child.context import TorchRunContext, chosen_cases
from grader.records import CaseRecord, CheckFailure, ChildJob, Phase, Stage, Timing, TimingMode, Verdict
from grader.tasks.seeds import seed_for
from grader.tasks.spec import Case, Rng
from grader.tasks.torch_ext import TorchExtensionTask, TorchOp

if TYPE_CHECKING:
    import torch

    from grader.child.__main__ import Recorder

BUILD_ROOT = paths.BUILD / "torch_ext"

# --- which files, built where ------------------------------------------------------------------


def graded_files(task: TorchExtensionTask, sources: dict[str, str]) -> tuple[list[Path], Path | None]:
    """The C++/CUDA files to build (the student's as the job names them, then the course's from
    the lab folder) and the Python registration file, if the task has one."""
    lab = task.lab_dir()

    def where(rel: str) -> Path:
        return Path(sources[rel]) if rel in sources else lab / rel

    return [where(rel) for rel in task.native_sources()], (where(task.register) if task.register else None)


def object_of(source: Path, folder: Path) -> Path:
    """The object cpp_extension's ninja build compiles `source` into: name.o, or name.cuda.o."""
    return folder / (f"{source.stem}.cuda.o" if source.suffix == ".cu" else f"{source.stem}.o")


def check_references(task: TorchExtensionTask, own: Sequence[Path], lib: Path) -> None:
    """The task's never_references rules on its own objects: the symbols each leaves undefined
    (what it calls outside itself), demangled. Raises CheckFailure(rule violation)."""
    from grader.build.objects import undefined_symbols
    from grader.build.ptxas import demangle

    rules = [r for r in task.rules if getattr(r, "kind", "") == "never_references"]
    for source in own if rules else ():
        obj = object_of(source, lib.parent)
        names = undefined_symbols(obj)
        if names is None:
            raise CheckFailure(
                Verdict.ENVIRONMENT,
                f"cannot read {obj.name} (readelf missing, or no such object): the rule on what "
                f"{source.name} calls is not checked",
            )
        called = demangle(names)
        for rule in rules:
            bad = sorted({n.split("(")[0] for n in called if re.match(rule.pattern, n)})
            if bad:
                shown = ", ".join(bad[:4]) + (f" and {len(bad) - 4} more" if len(bad) > 4 else "")
                raise CheckFailure(Verdict.RULE, f"{source.name}, as compiled, calls {shown}: {rule.why}")


def build_dir(task: TorchExtensionTask, native: Sequence[Path], fingerprint: str) -> Path:
    """Stable for one set of graded files, so that ninja finds its previous build there; apart
    for the student's files, the solution's and each variant's, which may be graded in turn.
    `fingerprint` names what the build depends on that ninja cannot see (torch's and the
    toolkit's headers come in through -isystem, which compilers leave out of their dependencies)."""
    files = hashlib.sha256(b"".join(str(p.resolve()).encode() + b"\0" for p in native)).hexdigest()[:12]
    # in the sandbox only its scratch folder is writable: a submission builds there, cold, and
    # never shares a build folder with another's
    sandboxed = os.environ.get("GRADER_SANDBOX_WORK")
    root = Path(sandboxed) / "torch_ext" if sandboxed else BUILD_ROOT
    return root / f"{family(task, fingerprint)}-{files}"


def family(task: TorchExtensionTask, fingerprint: str) -> str:
    """The build directories that may seed one another: one task, one interpreter, one torch and
    toolkit (an object built against other headers than these must never be reused)."""
    h = hashlib.sha256(f"{sys.executable}\0{fingerprint}".encode()).hexdigest()[:8]
    return f"{task.lab}-{task.number}-{h}"


@contextlib.contextmanager
def _locked(path: Path, wait: bool = True) -> Iterator[bool]:
    """An exclusive flock; the kernel releases it when its process dies, unlike cpp_extension's
    own lock file, which a killed build leaves behind. Yields False when `wait` is off and
    another process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _seed(build: Path, kin: str) -> None:
    """A new build directory starts as a copy of the newest sibling of its family: ninja then
    finds the objects of the files both share (same command, same inputs, per its log) up to date
    and compiles only the rest. The library itself is never copied: it is always linked anew."""
    if (build / ".ninja_log").exists():
        return
    siblings = [d for d in build.parent.glob(f"{kin}-*") if d != build and (d / ".ninja_log").is_file()]
    for d in sorted(siblings, key=lambda d: (d / ".ninja_log").stat().st_mtime, reverse=True):
        with _locked(head_start.extension_lock(d), wait=False) as free:
            if not free:  # being built right now: its files may be half written
                continue
            build.mkdir(parents=True, exist_ok=True)
            for f in d.iterdir():
                if f.is_file() and (f.suffix == ".o" or f.name in (".ninja_log", ".ninja_deps")):
                    shutil.copy2(f, build / f.name)  # copy2 keeps the mtimes ninja compares
            return


# --- the build ---------------------------------------------------------------------------------


def _ninja_on_path() -> None:
    """cpp_extension runs `ninja` from PATH; the PyPI package's binary counts too."""
    binary = find_ninja()
    if binary is None:
        raise CheckFailure(
            Verdict.ENVIRONMENT,
            "ninja not found: torch.utils.cpp_extension builds extensions with it "
            "(pip install ninja, or apt install ninja-build)",
        )
    bin_dir = str(Path(binary).parent)
    if shutil.which("ninja") != binary:
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")


def _gencode(cuda: bool) -> list[str]:
    """nvcc's architecture flags for this GPU (none for a C++ extension); a toolkit problem is an
    ENVIRONMENT verdict that names the fix."""
    import torch

    if not cuda:
        return []
    try:
        toolchain.find_nvcc()
        arch = os.environ.get("GRADER_ARCH")
        arch = toolchain.normalize_arch(arch) if arch else "sm_{}{}".format(*torch.cuda.get_device_capability())
        return toolchain.gencode_flags(arch)
    except toolchain.ToolchainError as e:
        raise CheckFailure(Verdict.ENVIRONMENT, str(e)) from None


def _check_tools(cuda: bool) -> None:
    """What cpp_extension's build needs, each missing piece an ENVIRONMENT verdict that names the fix."""
    from torch.utils import cpp_extension

    _ninja_on_path()
    cxx = cpp_extension.get_cxx_compiler()
    if shutil.which(cxx) is None:
        raise CheckFailure(Verdict.ENVIRONMENT, f"C++ compiler `{cxx}` not found: install g++ (or set CXX)")
    if cuda and cpp_extension.CUDA_HOME is None:
        # cpp_extension looked for the toolkit once, when it was imported; the grader's own search
        # (NVCC, CUDA_HOME, PATH, /usr/local/cuda) found nvcc, so its toolkit is the one to use
        nvcc = toolchain.find_nvcc()
        homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda", str(nvcc.parent.parent)]
        cpp_extension.CUDA_HOME = next(h for h in homes if h and (Path(h) / "bin" / "nvcc").exists())


# written into a build directory after cpp_extension.load built there: the load's arguments (JSON)
ARGUMENTS_FILE = "grader-load-arguments"


def _made_already(out: Path, lib: Path, arguments: str) -> bool:
    """Whether cpp_extension.load would find nothing to do: the library was built here with these
    arguments, and ninja (asked for its plan only) has no step to run. Then the library is loaded as
    it is, and this process never imports cpp_extension (half a second of every run, on an H200)."""
    try:
        if not lib.is_file() or (out / ARGUMENTS_FILE).read_text() != arguments:
            return False
    except OSError:
        return False
    ninja = find_ninja()
    if ninja is None:
        return False
    plan = subprocess.run([ninja, "-n"], cwd=out, capture_output=True, text=True, check=False)
    return plan.returncode == 0 and "no work to do" in plan.stdout


def _fingerprint(cuda: bool) -> str:
    import torch

    parts = [torch.__version__, str(torch.version.cuda)]
    if cuda:
        parts.append(toolchain.nvcc_version())
    return " ".join(parts)


def build(task: TorchExtensionTask, native: Sequence[Path], cuda: bool) -> tuple[Path, float | None]:
    """Builds the extension (incrementally) and loads it into this process, which registers its
    ops. Returns the library and the seconds spent when something had to be rebuilt."""
    import torch

    gencode = _gencode(cuda)
    fingerprint = _fingerprint(cuda)
    out = build_dir(task, native, fingerprint)
    lib = out / f"{task.extension}.so"
    arguments = {
        "name": task.extension,
        "sources": [str(p) for p in native],
        "extra_cflags": ["-O3", *task.cflags],
        "extra_cuda_cflags": ["-O3", "-lineinfo", *gencode, *task.cuda_cflags] if cuda else None,
        "extra_include_paths": [str(paths.INCLUDE)],
        "build_directory": str(out),
        "with_cuda": cuda,
    }
    # what decides the build besides the arguments: the compilers cpp_extension picks from these
    key = json.dumps([arguments, fingerprint, [os.environ.get(v, "") for v in ("CXX", "CC", "CUDA_HOME")]])
    with _locked(head_start.extension_lock(out)):
        if _made_already(out, lib, key):  # by make's head start, or by the last run
            try:
                torch.ops.load_library(str(lib))
            except OSError as e:
                raise CheckFailure(Verdict.COMPILE_ERROR, load_error(e)) from None
            return lib, None
        _check_tools(cuda)
        from torch.utils import cpp_extension

        _seed(out, family(task, fingerprint))
        out.mkdir(parents=True, exist_ok=True)
        # cpp_extension's lock file, left by a build that was killed; under our flock nobody else
        # builds here, and with it in place cpp_extension would wait for it forever
        (out / "lock").unlink(missing_ok=True)
        (out / ARGUMENTS_FILE).unlink(missing_ok=True)
        before = lib.stat().st_mtime_ns if lib.exists() else None
        start = time.perf_counter()

        try:
            cpp_extension.load(**arguments, is_python_module=False, verbose=False)
        except RuntimeError as e:
            if not str(e).startswith("Error building extension"):
                raise
            log = out / "build.log"
            log.write_text(str(e))
            machine = environment_problem(str(e))  # say, a compiler nvcc does not support, or a missing -l
            verdict = Verdict.ENVIRONMENT if machine else Verdict.COMPILE_ERROR
            what = machine or build_error(str(e))
            raise CheckFailure(verdict, f"{what}\n(the whole build output: {paths.rel(log)})") from None
        except OSError as e:  # dlopen: the library links (shared libraries may), then lacks a symbol
            raise CheckFailure(Verdict.COMPILE_ERROR, load_error(e)) from None
        seconds = time.perf_counter() - start
        (out / ARGUMENTS_FILE).write_text(key)
    rebuilt = before is None or lib.stat().st_mtime_ns != before
    return lib, seconds if rebuilt else None


_GCC = re.compile(r"(?P<file>[^\s:]+):(?P<line>\d+):(?:\d+:)? (?:fatal )?error: (?P<msg>.*)")
_NVCC = re.compile(r"(?P<file>[^\s(]+)\((?P<line>\d+)\): (?:catastrophic )?error: (?P<msg>.*)")
_LINK = re.compile(r"undefined reference to|multiple definition of")


def build_error(output: str) -> str:
    """The first compiler (or linker) error of cpp_extension's ninja output, `file:line: message`
    and the offending line, instead of the whole log with every command line in it."""
    prefix = re.match(r"Error building extension '[^']*': ", output)
    output = output[prefix.end() :] if prefix else output
    lines = [ln for ln in output.splitlines() if not re.match(r"\[\d+/\d+\] |FAILED: ", ln)]
    for line in lines:
        m = _GCC.match(line.strip()) or _NVCC.match(line.strip())
        if m:
            return _located(Path(m["file"]), int(m["line"]), m["msg"])
        if _LINK.search(line):
            return f"link error: {line.strip()}"
    return first_error("\n".join(lines))


def _located(file: Path, line: int, msg: str) -> str:
    head = f"{paths.rel(file)}:{line}: error: {msg}"
    try:  # the offending line itself reads better than the compiler's echo of it
        return f"{head}\n    {file.read_text().splitlines()[line - 1].strip()}"
    except (OSError, IndexError):
        return head


def load_error(e: OSError) -> str:
    text = str(e)
    m = re.search(r"undefined symbol: (\S+)", text)
    if not m:
        return f"the extension built but does not load: {text}"
    symbol = m[1]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        symbol = subprocess.run(["c++filt", symbol], capture_output=True, text=True, timeout=5).stdout.strip() or symbol
    return (
        f"the extension built but does not load: nothing defines `{symbol}`, which another of its files "
        f"calls: define it, with exactly that signature, in one of the sources"
    )


# --- the Python side: registration module and the ops ---------------------------------------------


def import_register(task: TorchExtensionTask, path: Path) -> None:
    """Imports the file that registers fakes and autograd formulas. The student's file failing
    to import is the student's verdict; the course's failing is a bug in the course."""
    name = f"grader_torch_ext_{task.lab}_{task.number}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, f"cannot import {path}"
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        if not task.register_is_students():
            raise
        frames = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename) == path]
        where = "".join(f"\n  {paths.rel(path)}:{f.lineno}: {f.line}" for f in frames[-3:])
        verdict = Verdict.COMPILE_ERROR if isinstance(e, SyntaxError) else Verdict.CRASH
        what = "".join(traceback.format_exception_only(type(e), e)).strip()
        raise CheckFailure(verdict, f"importing {paths.rel(path)} failed: {what}{where}") from None


def resolve(op: TorchOp) -> Any:
    """torch.ops.<namespace>.<name>, which exists once the library registered it."""
    import torch

    try:
        return getattr(getattr(torch.ops, op.namespace), op.op_name)
    except (AttributeError, RuntimeError):
        raise CheckFailure(
            Verdict.WRONG,
            f"the extension registers no operator `{op.name}`: a TORCH_LIBRARY({op.namespace}, m) block "
            f'must m.def("{op.op_name}(...) -> ...") it',
        ) from None


# --- telling the student's failures from the grader's ------------------------------------------

_CUDA_MARKS = ("CUDA error", "cudaError", "CUBLAS_STATUS", "CUDNN_STATUS", "device-side assert")


def cuda_error(e: BaseException) -> BaseException | None:
    """The CUDA error anywhere in the chain, if there is one: opcheck, dynamo and autograd wrap
    what the op raised."""
    import torch

    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, getattr(torch, "AcceleratorError", ())) or any(m in str(cur) for m in _CUDA_MARKS):
            return cur
        cur = cur.__cause__ or cur.__context__
    return None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _head(text: str, n: int = 8) -> str:
    lines = [ln.rstrip() for ln in text.strip().splitlines() if ln.strip()]
    return "\n".join(lines[:n] + (["  ..."] if len(lines) > n else []))


def op_failure(task: TorchExtensionTask, e: BaseException, where: str) -> CheckFailure:
    """What an exception out of the student's op means for the student: always a crash."""
    found = cuda_error(e)
    if found is None:
        return CheckFailure(Verdict.CRASH, f"{where}: the op raised {type(e).__name__}: {_head(str(e), 4)}")
    first = _first_line(found)
    hint = ""
    if "illegal memory access" in first or "illegal address" in first:
        hint = (
            ": a thread read or wrote outside its tensor — check the bounds guard and the index math;"
            f" `make sanitize-{task.lab} TASK={task.number}` names the line"
        )
    elif "no kernel image" in first:
        hint = ": the extension was built for another architecture than this GPU's — unset GRADER_ARCH"
    elif "misaligned" in first:
        hint = ": a vector load or store at an address that is not a multiple of its size"
    return CheckFailure(Verdict.CRASH, f"{first} during {where}{hint}")


def call(task: TorchExtensionTask, fn: Callable[..., Any], args: Sequence[Any], where: str, cuda: bool) -> Any:
    """One call of the op, waited for, so that an asynchronous CUDA error is its own."""
    import torch

    try:
        out = fn(*args)
        if cuda:
            torch.cuda.synchronize()
    except Exception as e:
        raise op_failure(task, e, where) from None
    return out


# --- the checks --------------------------------------------------------------------------------


def dtype_key(dtype: torch.dtype) -> str:
    import torch

    keys = {
        torch.float32: "f32",
        torch.float16: "f16",
        torch.bfloat16: "bf16",
        torch.float64: "f64",
        torch.int32: "i32",
        torch.int64: "i64",
        torch.uint8: "u8",
        torch.bool: "bool",
    }
    return keys.get(dtype, str(dtype))


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, tuple | list) else [value]


def _clone(value: Any) -> Any:
    return value.clone() if hasattr(value, "clone") else value


def case_inputs(task: TorchExtensionTask, case: Case, device: str, draw: int = 0) -> dict[str, Any]:
    return task.make_inputs(case.params, Rng(seed_for(task, case.label, draw), device))


def judge_outputs(task: TorchExtensionTask, got: Any, expected: Any, where: str, what: str = "output") -> None:
    """Every output against its expected value: type, shape, dtype and device exactly, values
    within the tolerance of the output's dtype."""
    import torch

    gots, exps = _as_list(got), _as_list(expected)
    if len(gots) != len(exps):
        raise CheckFailure(Verdict.WRONG, f"{where}: returned {len(gots)} outputs, expected {len(exps)}")
    for i, (g, e) in enumerate(zip(gots, exps, strict=True)):
        name = what if len(exps) == 1 else f"{what} {i}"
        if not isinstance(e, torch.Tensor):
            if g != e:
                raise CheckFailure(Verdict.WRONG, f"{where}: `{name}` is {g!r}, expected {e!r}")
            continue
        if not isinstance(g, torch.Tensor):
            raise CheckFailure(Verdict.WRONG, f"{where}: `{name}` is a {type(g).__name__}, expected a tensor")
        for field, have, want in (("shape", tuple(g.shape), tuple(e.shape)), ("dtype", g.dtype, e.dtype)):
            if have != want:
                raise CheckFailure(Verdict.WRONG, f"{where}: `{name}` has {field} {have}, expected {want}")
        if g.device != e.device:
            raise CheckFailure(Verdict.WRONG, f"{where}: `{name}` is on {g.device}, expected {e.device}")
        atol, rtol = task.tol(dtype_key(g.dtype))
        report = judge(name, g.detach(), e.detach(), atol, rtol, None)
        if report:
            raise CheckFailure(Verdict.WRONG, f"{where}: {report}")


def _written_args(fn: Any) -> set[int]:
    """Positions of the arguments the op's schema lets it write (`Tensor(a!)`)."""
    schema = getattr(getattr(fn, "default", None), "_schema", None)
    if schema is None:
        return set()
    return {i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write}


def check_case(task: TorchExtensionTask, op: TorchOp, fn: Any, case: Case, device: str, draw: int = 0) -> CaseRecord:
    """The op on one case's seeded inputs against the reference, computed on clones beforehand."""
    import torch

    where = f"{op.name}, case {case.label}" + (f" (random draw {draw + 1})" if draw else "")
    inputs = case_inputs(task, case, device, draw)
    args = [inputs[a] for a in op.args]
    expected = op.reference(*[_clone(a) for a in args])
    before = [_clone(a) for a in args]
    got = call(task, fn, args, where, device == "cuda")
    written = _written_args(fn)
    for i, (name, now, was) in enumerate(zip(op.args, args, before, strict=True)):
        if i not in written and isinstance(now, torch.Tensor) and not torch.equal(now, was):
            changed = int((now != was).sum())
            raise CheckFailure(
                Verdict.WRONG,
                f"{where}: input `{name}` was modified ({changed} elements changed); inputs are read-only",
            )
    judge_outputs(task, got, expected, where)
    return CaseRecord(case.label, op.name)


_OPCHECK_HINTS = {
    "test_schema": "the schema must say which inputs the op writes or returns a view of (`Tensor(a!)`)",
    "test_autograd_registration": (
        "register the backward with torch.library.register_autograd (an autograd kernel at the Autograd key)"
    ),
    "test_faketensor": (
        "register a fake with torch.library.register_fake that returns outputs of the real op's shape, "
        "dtype, device and strides, without touching data"
    ),
    "test_aot_dispatch_dynamic": (
        "the op must trace under torch.compile with symbolic sizes: its fake must compute shapes from "
        "its inputs' sizes, and the backward must use only traceable torch operations"
    ),
}


def check_registration(
    task: TorchExtensionTask, op: TorchOp, fn: Any, inputs: dict[str, Any], where: str, cuda: bool
) -> None:
    """torch.library.opcheck on the inputs, those the op differentiates requiring grad: only then
    does it look at the autograd registration and trace the backward. (Without grad, opcheck runs
    the same fake and the same kernel below autograd: a second sample would find nothing more.)"""
    import torch
    from torch.library import opcheck

    args = [inputs[a] for a in op.args]
    sample = tuple(_leaf(v) if a in op.grad else v for a, v in zip(op.args, args, strict=True))
    try:
        opcheck(fn.default, sample)
        if cuda:
            torch.cuda.synchronize()
    except Exception as e:
        if cuda_error(e) is not None:
            raise op_failure(task, e, f"torch.library.opcheck of {where}") from None
        test = re.search(r"(test_\w+) failed", str(e))
        name = test[1] if test else "a test"
        cause = e.__cause__ or e
        detail = _head(f"{type(cause).__name__}: {cause}", 6)
        hint = _OPCHECK_HINTS.get(name, "")
        raise CheckFailure(
            Verdict.WRONG,
            f"torch.library.opcheck failed {name}, {where}"
            + (" (inputs requiring grad)" if op.grad else "")
            + f": {detail}"
            + (f"\nhint: {hint}" if hint else ""),
        ) from None


def _leaf(v: Any) -> Any:
    """A fresh leaf that requires grad, for a floating tensor; anything else as it is."""
    import torch

    if not (isinstance(v, torch.Tensor) and v.is_floating_point()):
        return v
    return v.detach().clone().requires_grad_(True)


def check_gradients(
    task: TorchExtensionTask, op: TorchOp, fn: Any, inputs: dict[str, Any], where: str, cuda: bool
) -> None:
    """torch.autograd.gradcheck in float64 on the `grad` arguments (the others in float64 too):
    its fast mode, then the full check where that fails."""
    import torch
    from torch.autograd.gradcheck import GradcheckError

    args = [inputs[a] for a in op.args]
    args64 = [
        v.detach().to(torch.float64) if isinstance(v, torch.Tensor) and v.is_floating_point() else v for v in args
    ]
    diff = [i for i, a in enumerate(op.args) if a in op.grad]
    assert all(isinstance(args64[i], torch.Tensor) and args64[i].is_floating_point() for i in diff), (
        f"{task.task_id}: {op.name}'s grad arguments {list(op.grad)} must be floating-point tensors"
    )
    if not has_autograd(op.name, "cuda" if cuda else "cpu"):
        raise CheckFailure(
            Verdict.WRONG,
            f"{where}: no backward is registered, so gradients cannot flow to {', '.join(op.grad)}: register one "
            f"with torch.library.register_autograd (or a kernel at the Autograd dispatch key, in C++)",
        )
    leaves = tuple(args64[i].clone().requires_grad_(True) for i in diff)

    def f(*xs: Any) -> Any:
        full = list(args64)
        for i, x in zip(diff, xs, strict=True):
            full[i] = x
        return fn(*full)

    atol, rtol = task.gradcheck_tolerance
    try:
        # fast mode first: v·J·u for random u and v, one finite difference per input instead of
        # one per input element (0.50 s -> 0.05 s at 7x33->17 on an H200); a wrong Jacobian is far off
        # there too. Only a failure runs the full check, whose report says which input, and its verdict stands.
        try:
            torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=atol, rtol=rtol, raise_exception=True, fast_mode=True)
        except GradcheckError:
            torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=atol, rtol=rtol, raise_exception=True)
        if cuda:
            torch.cuda.synchronize()
    except GradcheckError as e:
        raise CheckFailure(Verdict.WRONG, _gradcheck_message(str(e), [op.args[i] for i in diff], where)) from None
    except Exception as e:
        if cuda_error(e) is not None:
            raise op_failure(task, e, f"gradcheck in float64, {where}") from None
        raise CheckFailure(
            Verdict.WRONG,
            f"gradcheck in float64, {where}: {type(e).__name__}: {_head(str(e), 6)}\n"
            f"hint: the op must accept float64 tensors, and its backward (torch.library.register_autograd) "
            f"return one gradient per input",
        ) from None


def has_autograd(name: str, device: str) -> bool:
    """Whether the op has an autograd kernel. Without one, torch's fallback still marks outputs as
    requiring grad and backpropagates zeros, which neither opcheck (an op may be non-differentiable)
    nor gradcheck (it reports a Jacobian of zeros) names as the cause."""
    import torch

    has = getattr(torch._C, "_dispatch_has_kernel_for_dispatch_key", None)
    if has is None:  # a torch without this query: gradcheck still catches the zeros
        return True
    keys = ("Autograd", "AutogradCUDA" if device == "cuda" else "AutogradCPU", "CompositeImplicitAutograd")
    return any(has(name, key) for key in keys)


def _gradcheck_message(text: str, names: Sequence[str], where: str) -> str:
    """gradcheck's report, which prints both Jacobians whole, cut down to which input and the
    first row of each Jacobian (the forward in float64 may be as wrong as the backward)."""
    wrt = re.search(r"with respect to input (\d+)", text)
    which = f" with respect to `{names[int(wrt[1])]}`" if wrt and int(wrt[1]) < len(names) else ""
    rows = [
        f"\n  {label}: {m[1].strip()} ..."
        for label, m in (
            ("finite differences of the forward", re.search(r"numerical:\s*(.*)", text)),
            ("the registered backward          ", re.search(r"analytical:\s*(.*)", text)),
        )
        if m
    ]
    head = f"gradcheck in float64, {where}: the gradient{which} disagrees with finite differences of the forward"
    return head + ("".join(rows) + "\n(first row of each Jacobian)" if rows else f": {_head(text, 6)}")


def check_compile(
    task: TorchExtensionTask, op: TorchOp, fn: Any, inputs: dict[str, Any], where: str, cuda: bool
) -> None:
    """torch.compile(backend="aot_eager", fullgraph=True) of a call of the op must trace without a
    graph break and agree with eager, and so must its gradients."""
    import torch

    # one compiled call on inputs that require grad gives both the outputs and the backward: a
    # second call without grad would be a second trace (dynamo guards on requires_grad)
    args = [_leaf(v) if a in op.grad else v for a, v in zip(op.args, (inputs[a] for a in op.args), strict=True)]
    eager = call(task, fn, args, where, cuda)

    def one_call(*a: Any) -> Any:
        return fn(*a)

    compiled = torch.compile(one_call, backend="aot_eager", fullgraph=True)
    got = _compiled_call(task, op, compiled, args, where, cuda)
    judge_outputs(task, _detached(got), _detached(eager), f"{where}, under torch.compile", "compiled output")
    if not op.grad:
        return
    diff = [v for a, v in zip(op.args, args, strict=True) if a in op.grad]

    def grads(out: Any) -> tuple[Any, ...]:
        outs = [o for o in _as_list(out) if isinstance(o, torch.Tensor) and o.requires_grad]
        rng = Rng(seed_for(task, "compile backward"), "cuda" if cuda else "cpu")  # the same for both runs
        cotangents = [rng.randn(*o.shape).to(o.dtype) for o in outs]
        return torch.autograd.grad(outs, diff, cotangents, allow_unused=True)

    want = call(task, grads, [eager], f"{where}, backward", cuda)
    have = _compiled_call(task, op, grads, [got], f"{where}, backward", cuda)
    judge_outputs(task, list(have), list(want), f"{where}, backward under torch.compile", "gradient")


def _detached(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, (list, tuple)):
        return type(value)(_detached(v) for v in value)
    return value


def _compiled_call(
    task: TorchExtensionTask, op: TorchOp, run: Callable[..., Any], args: Sequence[Any], where: str, cuda: bool
) -> Any:
    import torch

    try:
        out = run(*args)
        if cuda:
            torch.cuda.synchronize()
    except Exception as e:
        if cuda_error(e) is not None:
            raise op_failure(task, e, f"torch.compile, {where}") from None
        raise CheckFailure(
            Verdict.WRONG,
            f"torch.compile(backend='aot_eager', fullgraph=True) failed, {where}: "
            f"{type(e).__name__}: {_head(str(e), 6)}\n"
            f"hint: torch.compile traces the op with fake tensors (torch.library.register_fake) and its "
            f"backward from torch.library.register_autograd",
        ) from None
    return out


def time_op(
    task: TorchExtensionTask, op: TorchOp, fn: Any, case: Case, budget: timing.Budget, copy_gbps: float
) -> Timing:
    """The op against its torch baseline on the timing case, interleaved, with a cold L2."""
    import torch

    inputs = case_inputs(task, case, "cuda")
    args = [inputs[a] for a in op.args]
    fns: dict[str, Callable[[], object]] = {"student": lambda: fn(*args)}
    if op.baseline is not None:
        baseline = op.baseline
        fns["torch"] = lambda: baseline(*args)
    stats = timing.Timer().compare(fns, budget)
    torch.cuda.synchronize()
    s = stats["student"]
    row = Timing(op.name, case.label, s.median_ms, s.q1_ms, s.q3_ms, s.min_ms, s.n, copy_gbps=copy_gbps)
    if "torch" in stats:
        row.baseline_median_ms = stats["torch"].median_ms
        row.speedup = stats["torch"].median_ms / s.median_ms
    if op.bytes_moved is not None:
        row.gbps = op.bytes_moved(inputs) / (s.median_ms * 1e-3) / 1e9
        row.share_of_copy = row.gbps / copy_gbps
    if op.flops is not None:
        row.gflops = op.flops(inputs) / (s.median_ms * 1e-3) / 1e9
    return row


# --- the task ----------------------------------------------------------------------------------


def run(task: TorchExtensionTask, job: ChildJob, rec: Recorder) -> None:
    import torch

    cuda = task.gpu
    device = "cuda" if cuda else "cpu"
    if cuda and not torch.cuda.is_available():
        rec.set(
            verdict=Verdict.SKIPPED,
            message="torch sees no CUDA GPU (torch.version.cuda = "
            f"{torch.version.cuda}): install a CUDA build of torch, or run on a GPU machine",
        )
        return
    if cuda:
        from grader.child.cudalib import device_info

        rec.set(device=device_info())
    native, register = graded_files(task, job.sources)
    rec.at(Stage.BUILDING, "building and loading the extension")
    lib, seconds = build(task, native, cuda)
    rec.set(build_seconds=seconds)
    if job.variant in ("student", "solution") and not os.environ.get("GRADER_SANDBOX_WORK"):
        # where `make test-labN`'s head start runs ninja next time, before pytest has started
        head_start.remember_extension(task.lab, job.variant, task.task_id, lib.parent)
    check_references(
        task, [p for rel, p in zip(task.native_sources(), native, strict=True) if rel in task.sources], lib
    )
    notes: list[str] = []
    if register is not None:
        rec.at(Stage.CHECKING, f"importing {register.name}")
        import_register(task, register)
    fns = {op.name: resolve(op) for op in task.ops}
    report = rec.report
    try:
        for case in chosen_cases(task.cases, job):
            draws = task.seeds if case.small and not job.sanitize else 1
            for op in task.ops:
                for draw in range(draws):
                    rec.at(Stage.CHECKING, f"{op.name}, case {case.label}")
                    report.cases.append(check_case(task, op, fns[op.name], case, device, draw))
        for case in task.checked_cases():
            for op in task.ops:
                where = f"{op.name}, case {case.label}"
                inputs = case_inputs(task, case, device)
                if op.opcheck and not job.sanitize:
                    rec.at(Stage.CHECKING, f"torch.library.opcheck {where}")
                    check_registration(task, op, fns[op.name], inputs, where, cuda)
                if op.grad:
                    rec.at(Stage.CHECKING, f"gradcheck {where}")
                    check_gradients(task, op, fns[op.name], inputs, where, cuda)
                if op.compile and not job.sanitize:
                    rec.at(Stage.CHECKING, f"torch.compile {where}")
                    check_compile(task, op, fns[op.name], inputs, where, cuda)
        # the custom checks, once the ops pass their own (not under the sanitizer: a check may train a
        # network): a CUDA error out of one is the student's crash (below), any other exception not
        # a CheckFailure is a bug in the spec
        ctx = TorchRunContext(task, device)
        for check in () if job.sanitize else task.checks:
            rec.at(Stage.CHECKING, f"check {check.__name__}")
            try:
                check(ctx)
            finally:
                notes += ctx.notes
                ctx.notes.clear()
        if cuda and job.timing != TimingMode.OFF and not job.sanitize and task.timing_case:
            case = task.case(task.timing_case)
            budget = timing.QUICK if job.timing == TimingMode.QUICK else timing.BENCH
            rec.at(Stage.TIMING, "measuring copy bandwidth")
            copy = timing.copy_bandwidth_gbps()
            for op in task.ops:
                rec.at(Stage.TIMING, f"timing {op.name}, case {case.label}")
                report.timings.append(time_op(task, op, fns[op.name], case, budget, copy))
    except CheckFailure as f:
        rec.set(verdict=f.verdict, message=f.message, notes=notes)
        return
    except RuntimeError as e:
        # a CUDA error that surfaced outside the op's own calls (errors are sticky) is still the
        # student's; any other error is the grader's own bug
        if cuda_error(e) is None:
            raise
        rec.set(verdict=Verdict.CRASH, message=op_failure(task, e, str(report.phase)).message, notes=notes)
        return
    rec.set(verdict=Verdict.PASS, message="", notes=notes, phase=Phase(Stage.DONE))
