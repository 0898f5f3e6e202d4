"""How long a student waits: edit one lab 1 task, re-run its test, read the verdict.

Measured in one run, on one GPU: the grader's edit-and-retest loop, `make test-lab1 TASK=01`
(warm: fork server up, the other tasks cached), and the same with pytest alone (no head start);
the same kernel rebuilt through torch.utils.cpp_extension.load_inline after the same edit (the
usual alternative); the PyTorch-extension task's loop (lab 3 task 06); and grading all of lab 1
from a cold build cache.

    python benchmarks/edit_loop.py          (or: make bench-grader)
    python benchmarks/edit_loop.py --loops  (the two edit loops and their parts only: a minute less)
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grader import paths  # noqa: E402
from grader.parent import forkserver  # noqa: E402
from grader.records import TimingMode  # noqa: E402

TASK_FILE = ROOT / "lab1" / "solutions" / "01_vector_add.cu"
REPEATS = 3
INLINE_REPEATS = 2  # each load_inline rebuild takes most of a minute

INLINE_DRIVER = r'''
import sys, time, torch
from torch.utils.cpp_extension import load_inline
src, build, include = sys.argv[1], sys.argv[2], sys.argv[3]
wrapper = """
#include <torch/extension.h>
torch::Tensor run(torch::Tensor a, torch::Tensor b) {
    auto c = torch::empty_like(a);
    vector_add(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), (int)a.numel());
    return c;
}
"""
mod = load_inline("edit_loop_vector_add", cpp_sources="torch::Tensor run(torch::Tensor a, torch::Tensor b);",
                  cuda_sources=open(src).read() + wrapper, functions=["run"], build_directory=build,
                  extra_include_paths=[include], extra_cuda_cflags=["-O3", "-lineinfo"])
a, b = torch.randn(1000, device="cuda"), torch.randn(1000, device="cuda")
assert torch.allclose(mod.run(a, b), a + b)
print("ok")
'''


def run(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    t = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, env=env or dict(os.environ), capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"command failed: {' '.join(cmd)}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return time.perf_counter() - t, out.stdout


def grade_task_01(head_start: bool = True) -> float:
    """The verdict on task 01 as a student asks for it, `make test-lab1 TASK=01` (the reference
    solution, timing off); `head_start=False`: pytest alone, the build begun only once pytest has
    started, as the loop was before make's head start (grader/build/head_start.py)."""
    if head_start:
        command = ["make", "-s", "test-lab1", "TASK=01", "SOLUTIONS=1", "ARGS=--timing off"]
    else:
        command = [sys.executable, "-m", "pytest", "lab1/tests", "-q", "-p", "no:cacheprovider", "--solutions"]
        command += ["--task", "01", "--timing", "off"]
    dt, out = run(command, {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert "1 passed" in out, out
    return dt


def where_the_time_goes() -> dict[str, float]:
    """The edit loop of task 01 in its parts, each timed on its own after an edit: pytest starting
    and collecting the task (no grading), and the grader's build of the edited file (nvcc's
    compile and link, then the facts read off the objects). What is left of the loop is the
    task's grading: the forked task process, its cases, checks and report."""
    from grader.build import nvcc as build
    from grader.build.nvcc import BuildUnit
    from grader.tasks import catalogue

    collect = [
        run(
            [sys.executable, "-m", "pytest", "lab1/tests", "-q", "-p", "no:cacheprovider", "--co", "--task", "01"],
            {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},  # as make runs it
        )[0]
        for _ in range(REPEATS)
    ]
    task = next(t for t in catalogue.all_tasks(["lab1"]) if t.number == "01")
    copy = paths.BUILD / "edit-loop-parts" / TASK_FILE.name
    copy.parent.mkdir(parents=True, exist_ok=True)
    builds = []
    for k in range(REPEATS):
        copy.write_text(TASK_FILE.read_text() + f"// part {k} {time.time_ns()}\n")
        t = time.perf_counter()
        (r,) = build.build_all([BuildUnit.for_task(task, {task.source: copy}, "student")]).values()
        builds.append(time.perf_counter() - t)
        if not r.ok:
            raise SystemExit(f"the build of an edited copy failed: {r.error}")
    # the grading of the last copy, built already: the grading process's own work and the task
    # process's, step by step
    from grader.parent import runner

    graded = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        (g,) = runner.grade([task], runner.Options(timing=TimingMode.OFF), {task.task_id: {task.source: copy}})
        graded.append((time.perf_counter() - t, g.step_seconds))
    seconds, steps = sorted(graded, key=lambda g: g[0])[len(graded) // 2]  # the median run, its steps
    parts = {"pytest_start_and_collect_s": statistics.median(collect), "build_s": statistics.median(builds)}
    parts["grade_built_s"] = seconds
    parts.update({f"task_process_step_s[{k}]": v for k, v in steps.items()})
    return parts


EXTENSION_FILE = ROOT / "lab3" / "solutions" / "06_extension.cu"
EXTENSION_LINE = "constexpr int TILE = 16;"


def grade_task_06() -> float:
    """The verdict on lab 3 task 06 as a student asks for it, `make test-lab3 TASK=06` (the
    reference solution, timing off)."""
    command = ["make", "-s", "test-lab3", "TASK=06", "SOLUTIONS=1", "ARGS=--timing off"]
    dt, out = run(command, {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert "1 passed" in out, out
    return dt


def extension_edit_loop() -> list[float]:
    """The PyTorch-extension task's loop, lab 3 task 06: one line of the reference's kernel edited
    in place, then `make test-lab3 TASK=06` (make's head start runs ninja in the task's build
    directory while pytest starts; then the static checks, a forked task process, the build it finds
    made, values, opcheck, gradcheck, torch.compile, the custom checks and the 100-step training).
    The file is restored afterwards. Returns the seconds of each edited run."""
    original = EXTENSION_FILE.read_text()
    assert EXTENSION_LINE in original, f"{EXTENSION_LINE!r} is no longer in {paths.rel(EXTENSION_FILE)}"
    try:
        grade_task_06()  # builds the binding and remembers the build directory for the head start
        edited = []
        for k in range(REPEATS):
            EXTENSION_FILE.write_text(
                original.replace(EXTENSION_LINE, f"constexpr int TILE = {(32, 16)[k % 2]};  // edit {k}")
            )
            edited.append(grade_task_06())
    finally:
        EXTENSION_FILE.write_text(original)
    return edited


def extension_steps() -> dict[str, float]:
    """The same loop's task process step by step (median seconds per step): an edited copy of the
    kernel graded by the grader in this process, without make's head start, so that the build is
    timed whole. The copy lives at a fixed place, so its build directory stays warm and the binding
    (06_extension_op.cpp) is never rebuilt."""
    from grader.parent import runner
    from grader.tasks.catalogue import load_task

    lab3 = ROOT / "lab3"
    task = load_task(lab3 / "tests" / "test_06_extension.py")
    original = EXTENSION_FILE.read_text()
    copy = paths.BUILD / "torch_ext-edit-loop" / "06_extension.cu"
    copy.parent.mkdir(parents=True, exist_ok=True)
    files = {"06_extension.cu": copy, "06_extension.py": lab3 / "solutions" / "06_extension.py"}

    steps: list[dict[str, float]] = []

    def grade(text: str) -> None:
        copy.write_text(text)
        (r,) = runner.grade([task], runner.Options(timing=TimingMode.OFF), {task.task_id: files})
        if str(r.verdict) != "pass":
            raise SystemExit(f"lab 3 task 06's reference did not pass: {r.verdict}: {r.message}")
        steps.append(r.step_seconds)

    grade(original)
    steps.clear()
    for k in range(REPEATS):
        grade(original.replace(EXTENSION_LINE, f"constexpr int TILE = {(32, 16)[k % 2]};  // part {k}"))
    names = sorted({k for s in steps for k in s})
    return {k: statistics.median(s.get(k, 0.0) for s in steps) for k in names}


def load_inline_loop(original: str) -> dict[str, float | list[float]]:
    """The same kernel, the same edit, rebuilt through torch.utils.cpp_extension.load_inline."""
    build = Path(tempfile.mkdtemp(prefix="inline-"))
    src = build / "task.cu"
    driver = [sys.executable, "-c", INLINE_DRIVER, str(src), str(build), str(paths.INCLUDE)]
    env = {**os.environ, "TORCH_CUDA_ARCH_LIST": os.environ.get("TORCH_CUDA_ARCH_LIST", "9.0")}
    src.write_text(original)
    first = run(driver, env)[0]
    inline = []
    for k in range(INLINE_REPEATS):
        src.write_text(original + f"// edit {k} {time.time_ns()}\n")
        inline.append(run(driver, env)[0])
    shutil.rmtree(build, ignore_errors=True)
    return {"load_inline_first_build_s": first, "load_inline_edit_s": inline}


def main() -> int:
    loops_only = "--loops" in sys.argv[1:]
    original = TASK_FILE.read_text()
    results: dict[str, float | list[float]] = {}
    try:
        grade_task_01()  # builds, and starts the fork server in the background
        deadline = time.time() + 60
        while forkserver.connect() is None and time.time() < deadline:
            time.sleep(0.5)
        grade_task_01()
        edited = []
        for k in range(REPEATS):
            TASK_FILE.write_text(original + f"// edit {k} {time.time_ns()}\n")
            edited.append(grade_task_01())
        results["grader_edit_s"] = edited
        plain = []
        for k in range(REPEATS):
            TASK_FILE.write_text(original + f"// plain {k} {time.time_ns()}\n")
            plain.append(grade_task_01(head_start=False))
        results["grader_edit_without_head_start_s"] = plain
        results["grader_unchanged_s"] = grade_task_01()
        if not loops_only:
            results.update(load_inline_loop(original))
    finally:
        TASK_FILE.write_text(original)

    results["torch_ext_edit_s"] = extension_edit_loop()
    ext_steps = extension_steps()
    results.update({f"torch_ext_step_s[{k}]": v for k, v in ext_steps.items()})
    parts = where_the_time_goes()
    results.update(parts)

    if not loops_only:
        shutil.rmtree(paths.BUILD / "lab1", ignore_errors=True)
        cold_env = {**os.environ, "GRADER_FORKSERVER": "0"}
        results["lab1_cold_s"] = run(
            [sys.executable, "-m", "pytest", "lab1/tests", "-q", "-p", "no:cacheprovider", "--solutions"], cold_env
        )[0]

    g = statistics.median(results["grader_edit_s"])  # type: ignore[arg-type]
    print(json.dumps(results, indent=2))
    if not loops_only:
        i = statistics.median(results["load_inline_edit_s"])  # type: ignore[arg-type]
        print(
            f"edit + re-test one task (median of {REPEATS}): grader {g:.2f} s, load_inline {i:.2f} s "
            f"({i / g:.1f}x slower); first load_inline build {results['load_inline_first_build_s']:.1f} s"
        )
    p = statistics.median(results["grader_edit_without_head_start_s"])  # type: ignore[arg-type]
    rest = p - parts["pytest_start_and_collect_s"] - parts["build_s"]
    print(
        f"where the time goes (medians, each part timed alone): pytest's start and collection "
        f"{parts['pytest_start_and_collect_s']:.2f} s, the build (nvcc, link, facts) {parts['build_s']:.2f} s, "
        f"the rest (task process, cases, checks, report) {rest:.2f} s of pytest alone's {p:.2f} s; with make's "
        f"head start (the build begun before pytest) {g:.2f} s; goal 1.5 s"
    )
    steps = {k[len("task_process_step_s[") : -1]: v for k, v in parts.items() if k.startswith("task_process_step_s[")}
    print(
        f"grading task 01 once built (no pytest): {parts['grade_built_s']:.2f} s; in its task process: "
        + ", ".join(f"{k} {v:.2f} s" for k, v in sorted(steps.items(), key=lambda kv: -kv[1]))
    )
    if not loops_only:
        print(f"grade all of lab 1 from a cold cache (no fork server): {results['lab1_cold_s']:.1f} s")
    e = statistics.median(results["torch_ext_edit_s"])  # type: ignore[arg-type]
    print(
        f"PyTorch-extension task (lab 3 task 06), make test-lab3 TASK=06 after a one-line kernel edit (median of "
        f"{REPEATS}): {e:.2f} s; goal 3 s; its task process step by step, graded without the head start: "
        + ", ".join(f"{k} {v:.2f} s" for k, v in sorted(ext_steps.items(), key=lambda kv: -kv[1]))
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
