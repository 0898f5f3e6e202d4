"""The PyTorch-extension kind end to end, on two fixture tasks (grader/tests/fixtures/torch_ext):
fixtures/91, `scaled_add` as a CUDA extension (the student's kernel, the course's binding and
Python registration), and fixtures/98, its CPU twin (a C++ extension, gpu=False, whose Python
registration is the student's).

Without a GPU, 91's variants are skipped with the reason, while 98 is graded for real: every
step of the kind (cpp_extension build, load, register_fake/register_autograd, values, opcheck,
gradcheck, torch.compile) and every verdict. With a GPU, 91's variants get pass, wrong, crash,
timeout and compile error, and a re-run after a one-line kernel edit must answer in under 5 s.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from grader import paths, toolchain
from grader.child import torch_ext as child
from grader.instructor.broken import materialize
from grader.parent import forkserver, runner
from grader.records import CheckFailure, TaskResult, Verdict
from grader.tasks import TorchExtensionTask, TorchOp
from grader.tasks.catalogue import load_task
from grader.tasks.spec import Case

FIXTURE = Path(__file__).parent / "fixtures" / "torch_ext"
# the variants, broken on purpose: edits of the working files (grader/instructor/broken.py)
FORMULA = "out[i] = alpha * x[i] + y[i];"

EDITS = {
    "wrong": {
        "91_scaled_add.cu": [(FORMULA, "out[i] = alpha * y[i] + x[i];")],
        "98_scaled_add_cpu.cpp": [(FORMULA, "out[i] = alpha * y[i] + x[i];")],
    },
    "crash": {  # writes 4 TB past `out`
        "91_scaled_add.cu": [(FORMULA, "out[i + (int64_t{1} << 40)] = alpha * x[i] + y[i];")],
        "98_scaled_add_cpu.cpp": [(FORMULA, "out[i + (int64_t{1} << 40)] = alpha * x[i] + y[i];")],
    },
    "timeout": {  # waits for a flag nobody sets
        "91_scaled_add.cu": [
            (FORMULA, "while (never_set == 0) {\n        }\n        " + FORMULA),
            (
                "template <typename T>\n__global__",
                "__device__ volatile int never_set = 0;\n\ntemplate <typename T>\n__global__",
            ),
        ],
        "98_scaled_add_cpu.cpp": [
            (FORMULA, "volatile bool never_set = false;\n        while (!never_set) {\n        }\n        " + FORMULA)
        ],
    },
    "compile_error": {  # a name that does not exist
        "91_scaled_add.cu": [(FORMULA, "out[i] = alpha * x[i] + z[i];")],
        "98_scaled_add_cpu.cpp": [(FORMULA, "out[i] = alpha * x[i] + z[i];")],
    },
    "wrong_grad": {  # the backward forgets alpha
        "scaled_add_cpu_ops.py": [("return grad * ctx.alpha, grad, None", "return grad, grad, None  # forgets alpha")],
    },
}


def variant(name: str, rel: str) -> Path:
    return materialize(FIXTURE / rel, EDITS[name][rel], f"torch_ext-{name}", f"grader fixture variant `{name}`")


GPU_SPEC = FIXTURE / "tests" / "test_91_scaled_add.py"
CPU_SPEC = FIXTURE / "tests" / "test_98_scaled_add_cpu.py"
KERNEL, CPU_KERNEL, CPU_OPS = "91_scaled_add.cu", "98_scaled_add_cpu.cpp", "scaled_add_cpu_ops.py"
HANG = 30.0  # seconds for a variant that never ends; the others keep the spec's 120 for a cold build


def _task(spec: Path) -> TorchExtensionTask:
    task = load_task(spec)
    assert isinstance(task, TorchExtensionTask)
    return task


def _variants(spec: Path, files: dict[str, dict[str, Path]], hang: str = "timeout") -> list[TaskResult]:
    """Every variant (name -> its files) graded in ONE runner.grade call, as copies of the task
    with their own ids; each child still loads the spec itself, so builds and seeds are the task's.
    The passing variant goes first: the others' build directories start from its objects."""
    task = _task(spec)
    copies = {
        name: dataclasses.replace(task, number=f"{task.number}-{name}", timeout=HANG if name == hang else task.timeout)
        for name in files
    }
    overrides = {copies[name].task_id: files[name] for name in files if files[name]}
    return list(runner.grade(list(copies.values()), runner.Options(timing="quick"), overrides))


def _need_build_tools(cuda: bool) -> None:
    missing = [tool for tool in ("ninja", "c++") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not found: torch extensions cannot be built here")
    if cuda:
        try:
            toolchain.find_nvcc()
        except toolchain.ToolchainError as e:
            pytest.skip(str(e))


def _need_gpu() -> None:
    if not toolchain.has_gpu():
        pytest.skip("no NVIDIA GPU: fixtures/91's variants can only be run on one")
    _need_build_tools(cuda=True)


def _warm_forkserver() -> None:
    """The fork server the first grade started in the background, up and answering."""
    if not forkserver.enabled():
        pytest.skip("the fork server is off (GRADER_FORKSERVER=0): a re-run is not warm")
    deadline = time.time() + 90
    while time.time() < deadline:
        sock = forkserver.connect()
        if sock is not None:
            sock.close()
            return
        time.sleep(0.5)
    pytest.fail("the fork server did not come up in 90 s (see .build/forkserver.log)")


def _edit_loop(spec: Path, rel: str, edit: Callable[[str], str]) -> tuple[TaskResult, float]:
    """Grades a copy of the task's file, edits one line, grades again: the second grade's result
    and wall time. The copy lives at a fixed place, so its build directory is reused run after
    run; the edit flips between two versions, so the timed grade always recompiles."""
    task = _task(spec)
    original = (FIXTURE / rel).read_text()
    copy = paths.BUILD / "torch_ext-edit-loop" / rel
    copy.parent.mkdir(parents=True, exist_ok=True)
    first, second = (
        (edit(original), original) if copy.exists() and copy.read_text() == original else (original, edit(original))
    )
    assert first != second, "the edit changed nothing"
    opts = runner.Options(timing="off")
    copy.write_text(first)
    (warm,) = runner.grade([task], opts, {task.task_id: {rel: copy}})
    assert warm.verdict == Verdict.PASS, f"{warm.verdict}: {warm.message}"
    _warm_forkserver()
    (warm,) = runner.grade([task], opts, {task.task_id: {rel: copy}})  # now from the fork server
    assert warm.verdict == Verdict.PASS, f"{warm.verdict}: {warm.message}"
    copy.write_text(second)
    start = time.perf_counter()
    (result,) = runner.grade([task], opts, {task.task_id: {rel: copy}})
    return result, time.perf_counter() - start


# --- anywhere ------------------------------------------------------------------------------------


def test_the_fixture_specs_load_and_name_files_that_exist():
    for spec in (GPU_SPEC, CPU_SPEC):
        task = _task(spec)
        assert task.kind == "torch_ext" and task.lab == "fixtures"
        for rel in [*task.sources, *task.course_sources, task.register]:
            assert rel and (FIXTURE / rel).is_file(), rel
    gpu, cpu = _task(GPU_SPEC), _task(CPU_SPEC)
    assert gpu.gpu and not cpu.gpu
    assert not gpu.register_is_students() and cpu.register_is_students()
    for name in ("wrong", "crash", "timeout", "compile_error"):
        assert (variant(name, KERNEL)).is_file() and (variant(name, CPU_KERNEL)).is_file()
    assert (variant("wrong_grad", CPU_OPS)).is_file()


def _op(**kw: object) -> TorchOp:
    return TorchOp(**{"name": "ns::f", "args": ["x"], "reference": lambda x: x, **kw})  # type: ignore[arg-type]


def _declare(**kw: object) -> TorchExtensionTask:
    base: dict[str, object] = {
        "lab": "fixtures",
        "number": "99",
        "title": "t",
        "sources": ["k.cu"],
        "extension": "ext",
        "ops": [_op()],
        "cases": [Case("n=3", n=3)],
        "make_inputs": lambda p, rng: {},
    }
    return TorchExtensionTask(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"extension": "my-ext"}, "must be an identifier"),
        ({"sources": ["notes.py"]}, "no C++/CUDA source"),
        ({"sources": ["k.cu"], "course_sources": ["other/k.cu"]}, "share a file name"),
        ({"gpu": False}, "cannot have .cu sources"),
        ({"register": "ops.cpp"}, "must be a .py file"),
        ({"check_cases": ["n=4"]}, "'n=4' is not among the cases"),
        ({"timing_case": "n=9"}, "'n=9' is not among the cases"),
        ({"ops": [_op(name="f")]}, "namespace::name"),
        ({"ops": [_op(grad=["y"])]}, "not among its args"),
        ({"ops": []}, "no ops"),
    ],
)
def test_spec_mistakes_are_refused_where_the_task_is_declared(change, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        _declare(**change)


def test_a_spec_declares_what_is_built_and_what_is_checked():
    task = _declare(sources=["k.cu", "ops.py"], course_sources=["bind.cpp"], register="ops.py")
    assert task.native_sources() == ["k.cu", "bind.cpp"] and task.register_is_students()
    assert [c.label for c in task.checked_cases()] == ["n=3"]  # default: the first small case
    assert task.tol("f32") == (1e-5, 1e-5) and task.tol("f64") == (1e-10, 1e-10)
    assert _declare(tolerance={"f32": (1e-3, 0.0)}).tol("f32") == (1e-3, 0.0)
    assert _declare().timeout == 120.0, "room for a cold build"


def test_files_come_from_the_job_or_the_lab_and_each_file_set_builds_apart():
    task = _task(CPU_SPEC)
    lab = FIXTURE
    student = {CPU_KERNEL: str(lab / CPU_KERNEL), CPU_OPS: str(lab / CPU_OPS)}
    native, register = child.graded_files(task, student)
    assert native == [lab / CPU_KERNEL, lab / "98_scaled_add_cpu_op.cpp"] and register == lab / CPU_OPS
    wrong = {**student, CPU_KERNEL: str(variant("wrong", CPU_KERNEL))}
    native_w, _ = child.graded_files(task, wrong)
    assert native_w[0] == variant("wrong", CPU_KERNEL) and native_w[1] == native[1], "the course's file stays"
    here = child.build_dir(task, native, "torch x")
    assert here == child.build_dir(task, native, "torch x"), "stable: ninja finds its last build"
    assert here.parent == paths.BUILD / "torch_ext" and here.name.startswith("fixtures-98-")
    assert here != child.build_dir(task, native_w, "torch x"), "a variant builds apart"
    assert here != child.build_dir(task, native, "torch y"), "another torch builds apart"
    _, ops_w = child.graded_files(task, {**student, CPU_OPS: str(variant("wrong_grad", CPU_OPS))})
    assert ops_w == variant("wrong_grad", CPU_OPS), "the registration file is the student's in 98"
    gpu = _task(GPU_SPEC)
    _, course_ops = child.graded_files(gpu, {KERNEL: str(variant("wrong", KERNEL))})
    assert course_ops == FIXTURE / "scaled_add_ops.py", "and the course's in 91"


def test_build_errors_name_the_file_and_line():
    src = variant("compile_error", CPU_KERNEL)
    line = next(i for i, text in enumerate(src.read_text().splitlines(), 1) if "z[i]" in text)
    gcc = (
        f"Error building extension 'ext': [1/3] c++ -MMD -c {src} -o x.o\n"
        f"FAILED: x.o\nc++ -MMD -c {src} -o x.o\n"
        f"{src}: In function 'void f()':\n{src}:{line}:33: error: 'z' was not declared in this scope\n"
        "ninja: build stopped: subcommand failed.\n"
    )
    msg = child.build_error(gcc)
    assert msg.startswith(f"{paths.rel(src)}:{line}: error: 'z' was not declared") and "z[i]" in msg, msg
    cu = variant("compile_error", KERNEL)
    cu_line = next(i for i, text in enumerate(cu.read_text().splitlines(), 1) if "z[i]" in text)
    nvcc = f'[1/3] nvcc -c {cu}\nFAILED: x.cuda.o\n{cu}({cu_line}): error: identifier "z" is undefined\n'
    assert child.build_error(nvcc).startswith(f'{paths.rel(cu)}:{cu_line}: error: identifier "z" is undefined')
    link = (
        "[3/3] c++ a.o -shared -o ext.so\n"
        "/usr/bin/ld: a.o: in function `f': a.cpp:(.text+0x5): undefined reference to `g()'\n"
    )
    assert child.build_error(link).startswith("link error:") and "`g()'" in child.build_error(link)
    missing = OSError("ext.so: undefined symbol: _Z17scaled_add_launchPKfS0_fPflP11CUstream_st")
    assert "scaled_add_launch" in child.load_error(missing) and "define it" in child.load_error(missing)


def test_an_exception_out_of_the_op_is_a_crash_and_a_cuda_error_is_named_with_a_hint():
    task = _task(GPU_SPEC)
    cuda = RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be ...")
    try:  # wrapped, the way opcheck and dynamo wrap what the op raised
        try:
            raise cuda
        except RuntimeError as inner:
            raise ValueError("opcheck(op, ...): test_faketensor failed") from inner
    except ValueError as outer:
        wrapped = outer
    assert child.cuda_error(wrapped) is cuda and child.cuda_error(ValueError("shape")) is None
    f = child.op_failure(task, wrapped, "fixture_ext::scaled_add, case n=33")
    assert f.verdict == Verdict.CRASH
    assert f.message.startswith("CUDA error: an illegal memory access was encountered during fixture_ext::scaled_add")
    assert "make sanitize-fixtures TASK=91" in f.message
    plain = child.op_failure(task, TypeError("scaled_add(): expected a float"), "case n=1")
    assert plain.verdict == Verdict.CRASH and "raised TypeError: scaled_add(): expected a float" in plain.message


def test_a_machine_without_ninja_gets_an_environment_verdict_naming_the_fix(monkeypatch):
    monkeypatch.setattr(child.shutil, "which", lambda name: None)
    monkeypatch.setitem(sys.modules, "ninja", None)  # the PyPI package missing too: its import fails
    with pytest.raises(CheckFailure) as info:
        child._ninja_on_path()
    assert info.value.verdict == Verdict.ENVIRONMENT and "pip install ninja" in info.value.message


def test_without_a_gpu_every_cuda_variant_is_skipped_with_the_reason(monkeypatch):
    monkeypatch.setattr(toolchain, "has_gpu", lambda: False)
    files = {"pass": {}, **{v: {KERNEL: variant(v, KERNEL)} for v in ("wrong", "crash", "timeout")}}
    results = _variants(GPU_SPEC, files)
    assert [r.verdict for r in results] == [Verdict.SKIPPED] * 4, [(r.verdict, r.message) for r in results]
    assert all("no NVIDIA GPU" in r.message for r in results)
    assert all(r.points == 0 for r in results)


@pytest.mark.skipif(child.find_ninja() is None, reason="ninja not installed: pip install ninja")
def test_a_library_is_loaded_as_it_is_only_when_built_with_the_same_arguments_and_nothing_changed(tmp_path):
    """make's head start (or the last run) built the library: the task process loads it without
    cpp_extension, but only when the load's arguments are the ones it was built with and ninja has
    nothing left to do (an edit after the head start, a build that failed, new flags)."""
    src, out = tmp_path / "kernel.cu", tmp_path / "ext"
    out.mkdir()
    src.write_text("one\n")
    lib = out / "ext.so"
    (out / "build.ninja").write_text(
        f"rule cp\n  command = cp $in $out\nbuild {lib.name}: cp {src}\ndefault {lib.name}\n"
    )
    subprocess.run([child.find_ninja(), "-C", str(out)], check=True, capture_output=True)
    assert not child._made_already(out, lib, "key"), "no record of the arguments it was built with"
    (out / child.ARGUMENTS_FILE).write_text("key")
    assert child._made_already(out, lib, "key")
    assert not child._made_already(out, lib, "other flags")
    time.sleep(0.01)
    src.write_text("two\n")
    assert not child._made_already(out, lib, "key"), "an edit ninja has not built yet"


# --- the CPU twin: graded for real on any machine with g++ and ninja ----------------------------

CPU_VARIANTS: dict[str, tuple[dict[str, Path], Verdict, str]] = {
    "pass": ({}, Verdict.PASS, ""),
    "wrong": ({CPU_KERNEL: variant("wrong", CPU_KERNEL)}, Verdict.WRONG, "elements wrong"),
    "wrong_grad": ({CPU_OPS: variant("wrong_grad", CPU_OPS)}, Verdict.WRONG, "gradient with respect to `x`"),
    "compile_error": (
        {CPU_KERNEL: variant("compile_error", CPU_KERNEL)},
        Verdict.COMPILE_ERROR,
        f"compile_error/{CPU_KERNEL}:",
    ),
    "crash": ({CPU_KERNEL: variant("crash", CPU_KERNEL)}, Verdict.CRASH, "SIGSEGV"),
    "timeout": ({CPU_KERNEL: variant("timeout", CPU_KERNEL)}, Verdict.TIMEOUT, "fixture_ext_cpu::scaled_add, case"),
}


@pytest.fixture(scope="module")
def cpu_results() -> dict[str, TaskResult]:
    _need_build_tools(cuda=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("GRADER_TIMEOUT", raising=False)
        results = _variants(CPU_SPEC, {name: files for name, (files, _, _) in CPU_VARIANTS.items()})
    return dict(zip(CPU_VARIANTS, results, strict=True))


@pytest.mark.parametrize("name", list(CPU_VARIANTS))
def test_the_cpu_twin_gets_each_verdict(name: str, cpu_results: dict[str, TaskResult]) -> None:
    _, verdict, words = CPU_VARIANTS[name]
    r = cpu_results[name]
    assert r.verdict == verdict, f"{name}: {r.verdict}: {r.message}"
    assert words in r.message, r.message


def test_the_cpu_twin_passes_every_check_on_every_case(cpu_results):
    r = cpu_results["pass"]
    # 1, 33 and 1000 are small (two random draws each), 4099 too; all through the one op
    assert [c.case for c in r.cases] == ["n=1", "n=1", "n=33", "n=33", "n=1000", "n=1000", "n=4099", "n=4099"]
    assert r.points == r.max_points == 10
    assert r.timings == [], "no timing on the CPU"


def test_the_cpu_twin_reruns_fast_after_a_one_line_edit():
    _need_build_tools(cuda=False)
    result, seconds = _edit_loop(
        CPU_SPEC, CPU_KERNEL, lambda s: s.replace("out[i] = alpha * x[i] + y[i];", "out[i] = y[i] + alpha * x[i];")
    )
    assert result.verdict == Verdict.PASS, result.message
    assert result.build_seconds is not None, "the edit must have been recompiled"
    # where the task process's time went, step by step (make bench-grader prints it)
    steps = result.step_seconds
    assert {
        "building: building and loading the extension",
        "checking: torch.library.opcheck fixture_ext_cpu::scaled_add",
    } <= set(steps), steps
    assert all(v >= 0 for v in steps.values()) and sum(steps.values()) <= seconds, (steps, seconds)
    print(
        f"C++ extension re-run after a one-line edit: {seconds:.2f} s; "
        + ", ".join(f"{k} {v:.2f}" for k, v in steps.items())
    )


# --- on a GPU ------------------------------------------------------------------------------------

GPU_VARIANTS: dict[str, tuple[Verdict, str]] = {
    "pass": (Verdict.PASS, ""),
    "compile_error": (Verdict.COMPILE_ERROR, f"compile_error/{KERNEL}:"),
    "wrong": (Verdict.WRONG, "elements wrong"),
    "crash": (Verdict.CRASH, "illegal memory access"),
    "timeout": (Verdict.TIMEOUT, "fixture_ext::scaled_add, case"),  # killed in the kernel, not the build
}


@pytest.mark.gpu
def test_on_a_gpu_each_variant_gets_its_verdict(monkeypatch):
    _need_gpu()
    monkeypatch.delenv("GRADER_TIMEOUT", raising=False)
    files = {name: ({KERNEL: variant(name, KERNEL)} if name != "pass" else {}) for name in GPU_VARIANTS}
    results = dict(zip(GPU_VARIANTS, _variants(GPU_SPEC, files), strict=True))
    for name, (verdict, words) in GPU_VARIANTS.items():
        r = results[name]
        assert r.verdict == verdict, f"{name}: {r.verdict}: {r.message}"
        assert words in r.message, f"{name}: {r.message}"
    ok = results["pass"]
    (row,) = ok.timings
    assert row.entry == "fixture_ext::scaled_add" and row.speedup and row.gbps, row
    print(f"scaled_add: {row.median_ms:.4f} ms, {row.gbps:.0f} GB/s, {row.speedup:.2f}x torch.add")


@pytest.mark.gpu
def test_on_a_gpu_a_rerun_after_a_one_line_kernel_edit_rebuilds_only_the_kernel():
    _need_gpu()
    result, seconds = _edit_loop(
        GPU_SPEC, KERNEL, lambda s: s.replace("constexpr int kThreads = 256;", "constexpr int kThreads = 128;")
    )
    assert result.verdict == Verdict.PASS, result.message
    assert result.build_seconds is not None, "the edit must have been recompiled"
    print(f"CUDA extension re-run after a one-line edit: {seconds:.2f} s ({result.notes})")


def test_a_build_killed_halfway_does_not_wedge_the_next():
    """cpp_extension's own lock file outlives a killed build; the next build must not wait on it."""
    _need_build_tools(cuda=False)
    script = (
        "import sys, torch\n"
        "from pathlib import Path\n"
        "from grader.child import torch_ext as c\n"
        "from grader.tasks.catalogue import load_task\n"
        "t = load_task(Path(sys.argv[1]))\n"
        "native, _ = c.graded_files(t, {})\n"
        "out = c.build_dir(t, native, c._fingerprint(False))\n"
        "out.mkdir(parents=True, exist_ok=True)\n"
        "(out / 'lock').write_text('')\n"
        "c.build(t, native, False)\n"
        "print('built', out)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(paths.ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", script, str(CPU_SPEC)],
        cwd=paths.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and "built" in out.stdout, out.stderr[-2000:]
