"""Tasks of several GPUs (`Task.gpus`, lab 6): where their arguments may live, how many GPUs the
grader counts, and the skip, naming both counts, where fewer are visible. Runs on the CPU: the
GPUs are simulated by replacing toolchain.gpus (what nvidia-smi reports) and CUDA_VISIBLE_DEVICES;
what the task process does with them is checked on a machine of two GPUs by lab 6's task 01."""

from __future__ import annotations

import dataclasses

import pytest

from grader import paths, toolchain
from grader.parent import runner
from grader.records import TimingMode, Verdict
from grader.tasks import Case, CudaTask, Entry, HostOut, In, Int, Out, Size, catalogue
from grader.tasks.spec import Buffer

H100 = toolchain.Gpu("NVIDIA H100 80GB HBM3", "9.0", "570.86", 81559, "1980", "2619", "1980")


def machine(monkeypatch: pytest.MonkeyPatch, n: int, visible: str | None = None) -> None:
    """A machine whose nvidia-smi lists `n` GPUs, with CUDA_VISIBLE_DEVICES set to `visible`."""
    monkeypatch.setattr(toolchain, "gpus", lambda: (H100,) * n)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)


@pytest.mark.parametrize(
    ("listed", "visible", "count"),
    [
        (0, None, 0),
        (2, None, 2),
        (8, "0,1", 2),
        (8, "3", 1),
        (2, "", 0),
        (2, "-1", 0),
        (2, "1,0", 2),
        (2, "0,7,1", 1),  # CUDA stops at the first entry that names no device
        (4, "GPU-5c1e, GPU-77aa", 2),
        (2, "0,0", 0),  # a device named twice: CUDA shows none
    ],
)
def test_the_visible_count_follows_cuda_visible_devices(
    monkeypatch: pytest.MonkeyPatch, listed: int, visible: str | None, count: int
) -> None:
    machine(monkeypatch, listed, visible)
    assert toolchain.visible_gpu_count() == count


def _args(device: int = 1, host_device: int = 0) -> list:
    return [
        Out("dst", device=0),
        In("src", device=device),
        Size("n"),
        Buffer("table", "i32", "out", host=True, device=host_device),
    ]


def _task(gpus: int = 2, args: list | None = None, gpu: bool = True) -> CudaTask:
    return CudaTask(
        lab="lab6",
        number="99",
        title="a copy between two GPUs",
        sources=["99_copy.cu"],
        gpus=gpus,
        gpu=gpu,
        entries=[Entry("copy", args if args is not None else _args(), reference=lambda v: {"dst": v["src"]})],
        cases=[Case("n=3", n=3)],
        make_inputs=lambda p, rng: {"src": rng.randn(p["n"]), "n": p["n"]},
    )


def test_an_argument_names_its_device() -> None:
    assert In("src", device=1).device == 1 and In("src").device == 0
    assert Out("dst", "i32", device=1) == Buffer("dst", "i32", "out", device=1)
    assert HostOut("table", "i32").device == 0
    assert _task().gpus == 2
    assert catalogue.all_tasks(["lab1"])[0].gpus == 1  # the default: one GPU


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"args": _args(device=2)}, "`src` lives on device 2, but the task declares gpus=2 (devices 0 to 1)"),
        ({"args": _args(device=1), "gpus": 1}, "`src` lives on device 1, but the task declares gpus=1"),
        ({"args": _args(device=-1)}, "`src` lives on device -1"),
        ({"args": _args(host_device=1)}, "`table` is a host array and cannot live on device 1"),
        ({"gpus": 0, "args": [Out("dst"), Int("n")]}, "gpus must be a whole number of at least 1, got 0"),
        ({"gpu": False}, "gpus=2 on a task with gpu=False"),
    ],
)
def test_a_spec_with_an_argument_off_its_devices_is_refused(change: dict, words: str) -> None:
    with pytest.raises(ValueError, match="lab6/99: .*" + words.replace("(", r"\(").replace(")", r"\)")):
        _task(**change)


def _python_task(gpus: int):
    """A Python task (nothing to build) that says it needs `gpus` GPUs."""
    task = catalogue.all_tasks(["lab4"])[0]
    return dataclasses.replace(task, gpu=True, gpus=gpus)


def _grade(task) -> object:
    # the reference solution; in a student release, which has none, the untouched skeleton run all
    # the same (the count is checked before anything runs, either way)
    solved = paths.solution_source(task.lab_dir(), task.source).exists()
    opts = runner.Options(solutions=solved, force_run=not solved, timing=TimingMode.OFF, sandbox=False)
    (result,) = runner.grade([task], opts)
    return result


def test_a_task_of_two_gpus_is_skipped_where_one_is_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    machine(monkeypatch, 1)
    task = _python_task(2)
    r = _grade(task)
    assert r.verdict == Verdict.SKIPPED, r.message
    assert f"{task.task_id} needs 2 GPUs; this machine shows 1:" in r.message
    assert runner.too_few_gpus(_python_task(1)) == ""  # one GPU: the old path alone decides


def test_the_skip_names_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    machine(monkeypatch, 2, "1")
    task = _python_task(2)
    assert runner.too_few_gpus(task) == f"{task.task_id} needs 2 GPUs; this machine shows 1 (CUDA_VISIBLE_DEVICES=1)"
    machine(monkeypatch, 4, "2,3")
    assert runner.too_few_gpus(task) == ""
    assert runner.too_few_gpus(_python_task(4)).endswith("shows 2 (CUDA_VISIBLE_DEVICES=2,3)")


def test_without_a_gpu_the_no_gpu_skip_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    machine(monkeypatch, 0)
    r = _grade(_python_task(2))
    assert r.verdict == Verdict.SKIPPED, r.message
    assert "no NVIDIA GPU visible" in r.message
