"""Lab 6's GPU all-reduce (kiln_tp/cuda.py, task 04) and its launcher (kiln_tp/launch.py), where no GPU is needed.

Task 04's grader (lab6/tests/test_04_nccl.py) runs on 2 GPUs only. What can be checked without one:

- the lowering is registered for `all_reduce` when kiln_tp is imported, as handed out;
- its given checks (`check_group`): no process group, a group without NCCL for a CUDA tensor, and a
  dtype NCCL is not given (float64) are refused with a KilnRunError naming the node; a CPU tensor
  needs no NCCL;
- the reference solution's launch, on CPU tensors in a fake executor (its tensors and a stream of
  None, which torch.cuda.stream takes as "no stream"), on 2 gloo ranks: the lowering queues nothing,
  each call leaves the sum in the output's own tensor, reduced there (every all_reduce call is on
  its memory), the input keeps its value, a second call gives the same sum (the copy refreshes the
  output first) and each returns 0; on 1 rank the output is the input, with no all_reduce call;
- launch(): fewer GPUs than ranks refused before anything starts, naming both counts; a device it
  does not know refused; a rank that raises named, with its error.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
LAB6 = ROOT / "lab6"
if str(LAB6) not in sys.path:
    sys.path.insert(0, str(LAB6))

PACKAGES = ["kiln_tp", "../lab5/kiln_llm", "../lab5/llama", "../lab4/kiln"]
TOPS = ("kiln", "kiln_llm", "llama", "kiln_tp")
needs_solutions = pytest.mark.skipif(
    not (LAB6 / "solutions" / "kiln_tp" / "cuda.py").exists(), reason="no reference solutions here (a student release)"
)


@pytest.fixture(autouse=True)
def _sibling_labs() -> None:
    """Labs 4 and 5's packages on sys.path, as importing kiln_tp puts them: whichever test runs first."""
    import kiln_tp  # noqa: F401


def _node() -> Any:
    """An all_reduce node of a one-node graph."""
    import kiln
    import kiln_tp  # noqa: F401 (registers all_reduce)

    b = kiln.Builder("one_all_reduce")
    g = b.output(b.op("all_reduce", b.input("x", (4,), "float32"), op="sum"))
    return g.of_op("all_reduce")[0]


def test_the_lowering_is_registered() -> None:
    import kiln_tp
    from kiln.cuda import CUDA_LOWERINGS

    assert CUDA_LOWERINGS["all_reduce"] is kiln_tp.cuda.lower_all_reduce


def test_no_process_group_is_refused() -> None:
    import torch.distributed as dist

    from kiln.runtime import KilnRunError
    from kiln_tp.cuda import check_group

    assert not dist.is_initialized()
    node = _node()
    with pytest.raises(KilnRunError, match=rf"%{node.name} \(all_reduce\): no process group.*kiln_tp.launch"):
        check_group(node, torch.device("cuda", 0), torch.float32)


@pytest.fixture
def group_of_one(tmp_path: Path) -> Iterator[None]:
    """This process as a gloo process group of one rank."""
    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_group_checks(group_of_one: None, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    from kiln.runtime import KilnRunError
    from kiln_tp.cuda import check_group

    node = _node()
    assert check_group(node, torch.device("cpu"), torch.float64) == 1  # a CPU tensor: gloo reduces it
    with pytest.raises(KilnRunError, match=r"backend is 'gloo'.*NCCL.*device='cuda'"):
        check_group(node, torch.device("cuda", 0), torch.float32)
    monkeypatch.setattr(dist, "get_backend", lambda *_: "cpu:gloo,cuda:nccl")  # as launch(device="cuda") makes it
    assert check_group(node, torch.device("cuda", 0), torch.bfloat16) == 1
    with pytest.raises(KilnRunError, match=r"float64: the GPU all-reduce takes float32, float16, bfloat16"):
        check_group(node, torch.device("cuda", 0), torch.float64)


# --- the reference solution's launch, on CPU tensors ------------------------------------------------


@pytest.fixture(scope="module")
def solutions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Lab 6's packages with the reference solutions over them (and labs 4's and 5's), first on
    sys.path for this module's tests and the ranks they start; what was imported before is put back."""
    from grader.staging import stage_packages

    staged = tmp_path_factory.mktemp("lab6-solutions")
    stage_packages(LAB6, PACKAGES, staged, solutions=True)
    saved = {n: m for n, m in sys.modules.items() if n.partition(".")[0] in TOPS}
    path = list(sys.path)
    for n in saved:
        del sys.modules[n]
    sys.path.insert(0, str(staged))
    try:
        yield staged
    finally:
        for n in [n for n in sys.modules if n.partition(".")[0] in TOPS]:
            del sys.modules[n]
        sys.modules.update(saved)
        sys.path[:] = path


def lowered_on_cpu(rank: int, world: int, n: int) -> dict[str, Any]:
    """On one rank of a launch: the all_reduce lowering of the imported kiln_tp over a fake executor
    of CPU tensors, its launch called twice; what the checks need."""
    import torch.distributed as dist

    from kiln.cuda import CUDA_LOWERINGS

    node = _node()
    mine = torch.arange(n, dtype=torch.float32) + 100 * (rank + 1)
    out = torch.full((n,), float("nan"))
    ex = SimpleNamespace(tensors={node.inputs[0]: mine, node: out}, stream=None)
    reduced: list[int] = []  # the memory each all_reduce call reduced
    plain = dist.all_reduce

    def counted(t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        reduced.append(t.data_ptr())
        return plain(t, *args, **kwargs)

    dist.all_reduce = counted
    try:
        launch = CUDA_LOWERINGS["all_reduce"](ex, node)
        queued_at_lowering = not bool(torch.isnan(out).all()) or bool(reduced)
        first = launch()
        after_one = out.clone()
        second = launch()
    finally:
        dist.all_reduce = plain
    return {
        "rcs": [first, second],
        "after_one": after_one,
        "out": out,
        "x": mine,
        "queued_at_lowering": queued_at_lowering,
        "reduced": reduced,
        "out_ptr": out.data_ptr(),
    }


def _expected(world: int, n: int) -> torch.Tensor:
    return sum(torch.arange(n, dtype=torch.float32) + 100 * (r + 1) for r in range(world))


@needs_solutions
@pytest.mark.parametrize("world", [1, 2])
def test_the_reference_launch_on_cpu_tensors(solutions: Path, world: int) -> None:
    import kiln_tp
    from kiln_tp import launch

    assert str(solutions) in str(Path(kiln_tp.__file__).resolve().parent.parent)
    n = 1000
    got = launch(world, lowered_on_cpu, n, timeout=120)
    assert not got["queued_at_lowering"], "the lowering itself must queue nothing: the launch does the work"
    assert got["rcs"] == [0, 0]
    want = _expected(world, n)
    assert torch.equal(got["after_one"], want), "one launch: the sum of every rank's x in out"
    assert torch.equal(got["out"], want), "a second launch: the same sum (x copied into out before the reduction)"
    assert torch.equal(got["x"], torch.arange(n, dtype=torch.float32) + 100), "x keeps its value"
    if world == 1:
        assert got["reduced"] == [], "one rank: a copy, no all_reduce call"
    else:
        assert got["reduced"] == [got["out_ptr"]] * 2, "each launch reduces out's own memory, once"


# --- launch() --------------------------------------------------------------------------------------


def fails_on_rank_one(rank: int, world: int) -> int:
    if rank == 1:
        raise ValueError("rank one says no")
    import torch.distributed as dist

    dist.barrier()  # rank 0 waits for its peer, which never comes: launch must end it
    return rank


def test_launch_refuses_too_few_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    launcher = importlib.import_module("kiln_tp.launch")  # the module: kiln_tp.launch is also the function
    monkeypatch.setattr(launcher, "gpus_visible", lambda: 1)
    monkeypatch.setattr(launcher.mp, "start_processes", lambda *a, **k: pytest.fail("no process may start"))
    with pytest.raises(launcher.LaunchError, match=r"2 ranks on GPUs need 2 GPUs, one each; this machine shows 1"):
        launcher.launch(2, fails_on_rank_one, device="cuda")


def test_launch_refuses_unknown_devices() -> None:
    from kiln_tp.launch import launch

    with pytest.raises(ValueError, match="device must be one of"):
        launch(2, fails_on_rank_one, device="tpu")
    with pytest.raises(ValueError, match="positive number"):
        launch(0, fails_on_rank_one)


def test_launch_names_the_failing_rank() -> None:
    from kiln_tp.launch import LaunchError, launch

    with pytest.raises(LaunchError, match=r"rank 1 of 2 failed:(.|\n)*ValueError: rank one says no") as e:
        launch(2, fails_on_rank_one, timeout=120)
    assert e.value.rank == 1


def returns_then_lingers(rank: int, world: int) -> int:
    """Returns at once; rank 1 leaves a thread behind that keeps its process from ever exiting, as a
    kernel still spinning on a flag keeps a GPU rank's synchronize on the way out from returning."""
    import threading
    import time

    if rank == 1:
        threading.Thread(target=time.sleep, args=(3600,), daemon=False).start()
    return 40 + rank


def test_launch_result_stands_once_every_rank_returned() -> None:
    import importlib
    import time

    launcher = importlib.import_module("kiln_tp.launch")
    start = time.monotonic()
    assert launcher.launch(2, returns_then_lingers, timeout=120) == 40
    took = time.monotonic() - start
    assert took < launcher.TEARDOWN_S + 30, f"{took:.0f} s: the lingering rank was not ended after TEARDOWN_S"


# --- kiln_tp.own_all_reduce: all_reduce lowered to tasks 02 and 03, with stand-in libraries --------------


class StandInCommunicator:
    """kiln_tp.ipc.Communicator's interface over a CPU buffer, summed by gloo: what the lowering does
    with tasks 02 and 03's libraries, without them or a GPU."""

    def __init__(self, lib_path: str, prefix: str, capacity: int, rank: int, world: int) -> None:
        self.prefix, self.capacity = prefix, capacity
        self.buffer = torch.full((capacity,), float("nan"))
        self.calls: list[int] = []
        self.closed = False

    def tensor(self, n: int) -> torch.Tensor:
        return self.buffer[:n]

    def all_reduce(self, n: int, stream: Any = None) -> None:
        import torch.distributed as dist

        self.calls.append(n)
        dist.all_reduce(self.buffer[:n])

    def close(self) -> None:
        self.closed = True


def own_lowered_on_cpu(rank: int, world: int, sizes: list[int], dtype: torch.dtype) -> dict[str, Any]:
    """On one rank: use_own_all_reduce with stand-in communicators (one-shot up to 100 floats, ring
    up to 1000), each size lowered and launched twice; what the checks need."""
    import torch.distributed as dist

    from kiln.cuda import CUDA_LOWERINGS
    from kiln_tp import own_all_reduce as own

    own.Communicator = StandInCommunicator
    nccl = CUDA_LOWERINGS["all_reduce"]
    own.use_own_all_reduce("ring.so", "one_shot.so", ring_capacity=1000, one_shot_max_bytes=400)
    swapped = CUDA_LOWERINGS["all_reduce"] is own.lower_all_reduce_own
    comms = own._in_use["comms"]
    nccl_calls: list[int] = []
    plain = dist.all_reduce

    def counted(t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if not any(t.data_ptr() == c.buffer.data_ptr() for c in comms.values()):
            nccl_calls.append(t.numel())  # not a stand-in's buffer: task 04's lowering
        return plain(t, *args, **kwargs)

    dist.all_reduce = counted
    outs, rcs, xs = {}, [], {}
    try:
        for n in sizes:
            node = _node()
            x = ((torch.arange(n) % 7) + 0.25 * (rank + 1)).to(dtype)
            out = torch.full((n,), float("nan"), dtype=dtype)
            ex = SimpleNamespace(tensors={node.inputs[0]: x, node: out}, stream=None)
            launch = CUDA_LOWERINGS["all_reduce"](ex, node)
            rcs += [launch(), launch()]
            outs[n], xs[n] = out, x
    finally:
        dist.all_reduce = plain
    own.stop_own_all_reduce()
    return {
        "swapped": swapped,
        "restored": CUDA_LOWERINGS["all_reduce"] is nccl,
        "calls": {p: c.calls for p, c in comms.items()},
        "closed": all(c.closed for c in comms.values()),
        "nccl_calls": nccl_calls,
        "rcs": rcs,
        "outs": outs,
        "x0": xs,
    }


@needs_solutions
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_own_all_reduce_picks_by_size_and_sums_on_every_rank(solutions: Path, dtype: torch.dtype) -> None:
    from kiln_tp import launch

    sizes = [1, 100, 101, 1000, 1001]  # one-shot, one-shot, ring, ring, past the ring's buffer: NCCL's lowering
    got = launch(2, own_lowered_on_cpu, sizes, dtype, timeout=120)
    assert got["swapped"] and got["restored"] and got["closed"]
    assert got["rcs"] == [0] * (2 * len(sizes))
    assert got["calls"] == {"one_shot": [1, 1, 100, 100], "ring": [101, 101, 1000, 1000]}
    assert got["nccl_calls"] == [1001, 1001], "a message past the ring's buffer goes to task 04's lowering"
    for n in sizes:
        base = (torch.arange(n) % 7).double()
        want = (2 * base + 0.25 * (1 + 2)).to(dtype)  # summed in float32 (exact here), rounded once
        assert torch.equal(got["outs"][n], want), f"n={n}: the sum of both ranks' x in out"
        assert torch.equal(got["x0"][n], ((torch.arange(n) % 7) + 0.25).to(dtype)), "x keeps its value"
