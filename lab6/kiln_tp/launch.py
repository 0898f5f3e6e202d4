"""`launch`: one function run on `world` processes that share a process group (given code).

    result = launch(2, fn, a, b)   # fn(rank, world, a, b) on ranks 0 and 1; returns rank 0's value

Each rank is a process started by torch.multiprocessing (spawn: a fresh interpreter, so nothing
of the caller's threads or locks is inherited), with one CPU thread, that joins a gloo process
group through a torch.distributed.FileStore in a temporary folder (torch's own rendezvous: the
first rank to arrive creates the store's file, the others find it there). `fn` and its arguments
are pickled, so `fn` must be a module-level function of an importable module (not a lambda, not a
test's local function). Rank 0's return value comes back through a file (torch.save), not a queue:
nothing else has to be shared between the processes.

A rank that raises ends the run: torch's ProcessContext sees its exit, terminates the others
(which would otherwise wait in their next all-reduce until the group's timeout) and hands back the
rank's traceback; `launch` raises LaunchError naming the rank and its error. A run past `timeout`
seconds (a hang: a rank that never reaches a collective the others wait in) is ended the same way,
naming the ranks still running. The process group's own timeout is set to the same `timeout`, so a
rank whose peer vanished raises instead of waiting forever, even without this watchdog.
"""

from __future__ import annotations

import datetime
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

POLL = 0.05  # seconds between looks at the ranks


class LaunchError(RuntimeError):
    """A rank that failed (its exception or its signal), or a run past its time limit."""

    def __init__(self, message: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank


def _rank_main(
    rank: int, world: int, folder: str, timeout: float, fn: Callable[..., Any], args: tuple[Any, ...]
) -> None:
    """What each process runs: join the group, run fn, save rank 0's result, leave the group."""
    torch.set_num_threads(1)  # world processes share the machine's cores: one thread each
    store = dist.FileStore(os.path.join(folder, "store"), world)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout)
    )
    try:
        result = fn(rank, world, *args)
        if rank == 0:
            torch.save(result, os.path.join(folder, "result.pt"))
        dist.barrier()  # no rank leaves the group while another still needs it
    finally:
        dist.destroy_process_group()


def launch(world: int, fn: Callable[..., Any], *args: Any, timeout: float = 120.0) -> Any:
    """fn(rank, world, *args) on `world` processes of one gloo process group: rank 0's return
    value. Raises LaunchError naming the rank that failed and its error, or the ranks still
    running after `timeout` seconds; every process has ended when it returns or raises."""
    if not isinstance(world, int) or world < 1:
        raise ValueError(f"world must be a positive number of processes, got {world!r}")
    # gloo finds its peers through the host name's address unless told an interface; loopback is
    # the one every machine (and the grader's sandbox, which has no other) has
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with tempfile.TemporaryDirectory(prefix="kiln_tp-") as folder:
        ctx = mp.start_processes(
            _rank_main, args=(world, folder, timeout, fn, args), nprocs=world, join=False, start_method="spawn"
        )
        deadline = time.monotonic() + timeout
        try:
            while not ctx.join(timeout=POLL, grace_period=1.0):
                if time.monotonic() > deadline:
                    running = [r for r, p in enumerate(ctx.processes) if p.is_alive()]
                    _end(ctx.processes)
                    raise LaunchError(f"ranks {running} of {world} still running after {timeout:g} s: ended")
        except mp.ProcessRaisedException as e:
            raise LaunchError(f"rank {e.error_index} of {world} failed:{_last_lines(str(e))}", e.error_index) from None
        except mp.ProcessExitedException as e:
            raise LaunchError(f"rank {e.error_index} of {world} died: {e}", e.error_index) from None
        finally:
            _end(ctx.processes)
        return torch.load(Path(folder) / "result.pt", weights_only=False)


def _end(processes: list[Any]) -> None:
    """Kills what is still running (each process launch started, by its own handle) and reaps it."""
    for p in processes:
        if p.is_alive():
            p.kill()
    for p in processes:
        p.join()


def _last_lines(trace: str, n: int = 12) -> str:
    """The end of a rank's traceback, where its error is: the message stays readable."""
    lines = [ln for ln in trace.strip().splitlines() if ln.strip()]
    return "\n" + "\n".join(lines[-n:]) if lines else " (no traceback)"
