"""The head start (grader/build/head_start.py): `make test-labN` builds what the lab's last run built
before pytest starts, and the grader then takes that build instead of making its own."""

from __future__ import annotations

import fcntl
import shutil
import threading
import time
from pathlib import Path

import pytest

from grader import paths
from grader.build import head_start
from grader.build import nvcc as build
from grader.build.nvcc import BuildUnit

KERNEL = '#include "course.h"\n__global__ void fill(float* x) { x[threadIdx.x] = 1.f; }\n'
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: install the CUDA toolkit")


def _unit(folder: Path, name: str = "lab1/01") -> BuildUnit:
    src = folder / "01_fill.cu"
    src.write_text(KERNEL)
    return BuildUnit(name, (src,), "lab1", "01_fill.student", flags=("-DX=1",), include_dirs=(folder,))


def test_what_a_run_built_is_recalled_per_variant_and_task(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "BUILD", tmp_path / "build")
    one, two = _unit(tmp_path), _unit(tmp_path, "lab1/02")
    head_start.remember("lab1", "student", [one, two], "sm_90")
    assert head_start.recalled("lab1", "student") == [(one, "sm_90"), (two, "sm_90")]
    assert head_start.recalled("lab1", "student", "02") == [(two, "sm_90")]
    assert head_start.recalled("lab1", "student", "lab1/01") == [(one, "sm_90")]
    assert head_start.recalled("lab1", "solution") == []
    assert head_start.recalled("lab2", "student") == []
    (tmp_path / "build" / "lab1" / "units.json").write_text("{not json")
    assert head_start.recalled("lab1", "student") == []  # a broken record costs the head start, nothing else


@needs_nvcc
def test_the_grader_takes_the_head_starts_build(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "BUILD", tmp_path / "build")
    unit = _unit(tmp_path)
    head_start.remember("lab1", "student", [unit], "sm_90")
    (tmp_path / "01_fill.cu").write_text(KERNEL + "// edited\n")  # the student's edit: a new key
    assert head_start.main(["lab1", "--task", "01"]) == 0
    r = build.build_all([unit], arch="sm_90")[unit]
    assert r.ok and r.cached, "the grader built again what the head start had built"


@needs_nvcc
def test_a_build_under_way_is_waited_for_not_repeated(tmp_path, monkeypatch):
    """Two processes (here two threads) asking for one unit at once: one builds, the other waits
    on the unit's lock and finds the library built."""
    monkeypatch.setattr(paths, "BUILD", tmp_path / "build")
    unit = _unit(tmp_path)
    runs = []
    real = build._run_builds

    def counted(plans, *args, **kw):
        runs.append(len(plans))
        time.sleep(0.5)  # the other one arrives while this one builds
        return real(plans, *args, **kw)

    monkeypatch.setattr(build, "_run_builds", counted)
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(build.build_all([unit], arch="sm_90")[unit])) for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert runs == [1] and all(r.ok for r in results) and sorted(r.cached for r in results) == [False, True]


@needs_nvcc
def test_a_compile_error_is_not_compiled_twice_until_a_header_changes(tmp_path, monkeypatch):
    """The head start's failed build is the grader's verdict too; a header of the lab edited since
    (which the key does not cover) makes it build again."""
    monkeypatch.setattr(paths, "BUILD", tmp_path / "build")
    unit = _unit(tmp_path)
    (tmp_path / "shape.h").write_text("#pragma once\n")
    (tmp_path / "01_fill.cu").write_text('#include "shape.h"\n' + KERNEL + "int broken() { return nope; }\n")
    first = build.build_all([unit], arch="sm_90")[unit]
    assert not first.ok and "nope" in first.error
    runs = []
    monkeypatch.setattr(build, "_run_builds", lambda plans, *a, **k: runs.append(plans))
    again = build.build_all([unit], arch="sm_90")[unit]
    assert not again.ok and again.error == first.error and runs == []
    time.sleep(0.01)
    (tmp_path / "shape.h").write_text("#pragma once\nconstexpr int nope = 1;\n")
    build.build_all([unit], arch="sm_90")
    assert len(runs) == 1


def test_an_extensions_build_directory_is_recalled_per_variant_and_task(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "BUILD", tmp_path / "build")
    a, b = tmp_path / "build" / "torch_ext" / "lab3-06-x", tmp_path / "build" / "torch_ext" / "lab3-01-x"
    head_start.remember_extension("lab3", "student", "lab3/06", a)
    head_start.remember_extension("lab3", "student", "lab3/01", b)
    head_start.remember_extension("lab3", "solution", "lab3/06", b)
    assert sorted(head_start.recalled_extensions("lab3", "student")) == sorted([a, b])
    assert head_start.recalled_extensions("lab3", "student", "06") == [a]
    assert head_start.recalled_extensions("lab3", "solution", "lab3/06") == [b]
    assert head_start.recalled_extensions("lab1", "student") == []
    head_start.remember_extension("lab3", "student", "lab3/07", tmp_path / "elsewhere")  # another checkout's
    assert sorted(head_start.recalled_extensions("lab3", "student")) == sorted([a, b])
    (tmp_path / "build" / "lab3" / "extensions.json").write_text("[1, 2]")
    assert head_start.recalled_extensions("lab3", "student") == []


@pytest.mark.skipif(build.find_ninja() is None, reason="ninja not installed: pip install ninja")
def test_the_head_start_runs_ninja_under_the_task_process_lock(tmp_path, monkeypatch):
    """The edited file is rebuilt in the extension's build directory before the task process asks,
    and never while the task process (here: whoever holds the directory's lock) builds there."""
    monkeypatch.setattr(paths, "BUILD", tmp_path / "build")
    src, out = tmp_path / "kernel.cu", tmp_path / "build" / "torch_ext" / "ext"
    out.mkdir(parents=True)
    src.write_text("one\n")
    (out / "build.ninja").write_text(f"rule cp\n  command = cp $in $out\nbuild lib.so: cp {src}\ndefault lib.so\n")
    head_start.remember_extension("lab3", "student", "lab3/06", out)
    assert head_start.main(["lab3", "--task", "06"]) == 0
    assert (out / "lib.so").read_text() == "one\n"
    time.sleep(0.01)
    src.write_text("two\n")  # the student's edit
    with open(head_start.extension_lock(out), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the task process, building
        thread = threading.Thread(target=head_start.main, args=(["lab3"],))
        thread.start()
        time.sleep(0.3)
        assert (out / "lib.so").read_text() == "one\n", "ninja ran while the task process held the lock"
    thread.join()
    assert (out / "lib.so").read_text() == "two\n"
