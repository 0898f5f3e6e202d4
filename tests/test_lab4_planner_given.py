"""The given parts of lab 4's memory planner (kiln/planner.py, task 01): `best_fit_plan`, the baseline
the task's tests compare with, `describe`, `align_up` and Plan's `peak_live_bytes` and `total_bytes`.

They are checked on the reference solution (the student's file stops at its TODO regions, and
`best_fit_plan` calls the student's `liveness`). The random graphs and the arena model that runs a
plan are the task spec's own (lab4/tests/test_01_planner.py), so the baseline is held to the
same standard as the student's planner.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str, path: Path) -> ModuleType:
    if str(ROOT / "lab4") not in sys.path:
        sys.path.insert(0, str(ROOT / "lab4"))  # kiln's own modules: `from kiln import ops`
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# distinct names: the student's kiln.planner (a skeleton) may be imported elsewhere in the session
SOLUTION = ROOT / "lab4/solutions/kiln/planner.py"
if not SOLUTION.exists():
    pytest.skip(
        "the given code is checked on the reference solution, absent from a student release", allow_module_level=True
    )
planner = _load("lab4_planner_solution", SOLUTION)
spec01 = _load("lab4_planner_spec", ROOT / "lab4/tests/test_01_planner.py")


def test_align_up() -> None:
    assert [planner.align_up(n) for n in (1, 255, 256, 257, 1024)] == [256, 256, 256, 512, 1024]


def test_best_fit_plans_are_valid() -> None:
    for seed in range(spec01.RANDOM_GRAPHS):
        g = spec01._random_graph(seed)
        plan = planner.best_fit_plan(g)
        spec01._simulate(g, plan)  # no tensor overwritten before its last read
        assert plan.lifetimes == planner.liveness(g)
        assert all(plan.offsets[n] % planner.ALIGNMENT == 0 for n in plan.sizes)
        assert plan.peak_live_bytes <= plan.arena_bytes <= plan.total_bytes


def test_best_fit_reuses_a_chain() -> None:
    b = spec01.Builder("chain")
    t = b.source("input", "x", (64, 64))
    for _ in range(50):
        t = b("relu", t, shape=(64, 64))
    g = b.done(t)
    assert planner.best_fit_plan(g).arena_bytes == 3 * 64 * 64 * 4


def test_peak_and_total_bytes() -> None:
    b = spec01.Builder()
    x = b.source("input", "x", (1, 100))  # 400 bytes: one 256-byte slot is not enough
    t1 = b("relu", x, shape=(8, 64))  # 2048
    t2 = b("relu", t1, shape=(1, 10))  # 40 -> 256
    t3 = b("add", t2, x, shape=(1, 100))  # 400 -> 512
    g = b.done(t3)
    plan = planner.plan_memory(g)
    assert plan.sizes[x] == 512 and plan.sizes[t1] == 2048 and plan.sizes[t2] == 256
    assert plan.total_bytes == 512 + 2048 + 256 + 512
    assert plan.peak_live_bytes == 512 + 2048 + 256  # step 2: x, t1 read, t2 written
    assert plan.arena_bytes == plan.peak_live_bytes


def test_describe_compares_the_plans() -> None:
    g = spec01._random_graph(3)
    text = planner.describe(planner.plan_memory(g), g)
    for word in ("arena", "lower bound", "best-fit", "no reuse", "KiB", "over the bound"):
        assert word in text, text
