"""Deliberately broken lab 1 submissions (lab1/solutions/broken/) get the right verdict, and one
broken task never stops the others. Needs a GPU; compiling them is covered by test_compile_all."""

from __future__ import annotations

from pathlib import Path

import pytest

from grader import paths, runner, toolchain
from grader.loader import load_task
from grader.verdict import TaskResult, Verdict

BROKEN = paths.ROOT / "lab1" / "solutions" / "broken"

# variant: (verdicts accepted, words the message must contain)
EXPECTED: dict[str, tuple[set[Verdict], str]] = {
    "01_vector_add.never_written": ({Verdict.WRONG}, "never written"),
    "02_matrix_add.guard_off_by_one": ({Verdict.WRONG}, "out of bounds"),
    "03_saxpy.infinite_loop": ({Verdict.TIMEOUT}, "never finishes"),
    "03_saxpy.no_guard": ({Verdict.WRONG}, "out of bounds"),
    "03_saxpy.illegal_address": ({Verdict.CRASH}, "illegal memory access"),
    "04_swap_pairs.writes_input": ({Verdict.WRONG}, "was modified"),
    "04_swap_pairs.sync_misplaced": ({Verdict.WRONG, Verdict.SANITIZER}, ""),
    "05_silu.unchecked": ({Verdict.WRONG}, "returned cudaSuccess"),
    "05_silu.leaks": ({Verdict.WRONG}, "leaks"),
    "06_max_pool.sync_misplaced": ({Verdict.WRONG, Verdict.SANITIZER}, ""),
    "07_histogram.no_zero": ({Verdict.WRONG}, "wrong"),
}
# one run per batch: each batch mixes tasks so a hang or crash must not stop the rest
BATCHES = [
    [
        "01_vector_add.never_written",
        "02_matrix_add.guard_off_by_one",
        "03_saxpy.infinite_loop",
        "04_swap_pairs.writes_input",
        "05_silu.unchecked",
        "06_max_pool.sync_misplaced",
        "07_histogram.no_zero",
    ],
    ["03_saxpy.illegal_address", "05_silu.leaks"],
    ["03_saxpy.no_guard"],
]
SANITIZED = ["04_swap_pairs.sync_misplaced"]

pytestmark = pytest.mark.gpu
if not BROKEN.exists():
    pytest.skip("the broken variants ship with the solutions, not in a student release", allow_module_level=True)


def _tasks():
    return {f.stem.removeprefix("test_"): load_task(f) for f in paths.spec_files(paths.ROOT / "lab1")}


def _grade(variants: list[str], sanitize: bool) -> dict[str, TaskResult]:
    tasks = _tasks()
    chosen = [tasks[v.split(".")[0]] for v in variants]
    sources = {t.task_id: BROKEN / f"{v}.cu" for t, v in zip(chosen, variants, strict=True)}
    opts = runner.Options(timing="off", sanitize=sanitize, timeout=20)
    results = list(runner.grade(chosen, opts, sources))
    return {v: r for v, r in zip(variants, results, strict=True)}


@pytest.fixture(scope="module")
def results() -> dict[str, TaskResult]:
    if not toolchain.has_gpu():
        pytest.skip("no NVIDIA GPU: the broken variants can only be run on one")
    out: dict[str, TaskResult] = {}
    for batch in BATCHES:
        out.update(_grade(batch, sanitize=False))
    out.update(_grade(SANITIZED, sanitize=True))
    return out


@pytest.mark.parametrize("variant", sorted(EXPECTED))
def test_broken_variant_is_caught(variant: str, results: dict[str, TaskResult]) -> None:
    verdicts, words = EXPECTED[variant]
    r = results[variant]
    assert r.verdict in verdicts, f"{variant}: {r.verdict}: {r.message}"
    assert words.lower() in r.message.lower(), r.message


def test_every_variant_has_an_expectation() -> None:
    assert sorted(p.stem for p in Path(BROKEN).glob("*.cu")) == sorted(EXPECTED)
