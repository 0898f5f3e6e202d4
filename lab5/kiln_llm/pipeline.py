"""`kiln_llm.compile`: lab 5's passes over a graph, then lab 4's executor; and `KernelBuild`, which
builds the CUDA kernels those executors load while the caller does something else.

On the GPU the fusion pass always runs: lab 4's kernels are float32, so every pointwise node of
an f16 or bf16 model must become a generated kernel. `fuse=False` keeps that lowering but fuses
nothing (each pointwise node its own kernel, every matmul epilogue and RMSNorm a separate launch): the
baseline the chapter measures fusion against. On the CPU the graph runs as it is.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import kiln
from kiln.ir import Graph


def compile(
    graph: Graph,
    device: str = "cuda",
    *,
    fuse: bool = True,
    use_graph: bool = True,
    debug: bool = False,
    share_with: Any = None,
) -> Any:
    """An executor for `graph` on `device` ("cuda" or "cpu"); `share_with` as kiln.compile's."""
    # fold=False: lab 4's constant folding (its task 08) finds nothing in a LLaMA, whose every weight
    # feeds a linear as it is, and lab 5's grades must not hang on a lab 4 task
    if device == "cpu":
        return kiln.compile(graph, "cpu", fold=False, share_with=share_with)
    from kiln_llm import cuda  # noqa: F401 (registers the CUDA lowerings; needs no GPU to import)
    from kiln_llm.fusion import fuse as fusion_pass

    lowered = fusion_pass(graph, chains=fuse, epilogues=fuse, prologues=fuse)
    return kiln.compile(lowered, device, fold=False, use_graph=use_graph, debug=debug, share_with=share_with)


class KernelBuild:
    """Lab 4's and lab 5's kernel libraries (kiln.cuda.load_kernels, kiln_llm.cuda.load_kernels),
    built, or found built, on threads of their own while the caller's thread goes on.

    A fresh build is nvcc for a minute, in other processes: the caller can train a model or load a
    checkpoint meanwhile, and `make generate` does. `start()` begins both builds at once; call it
    once the run is sure to go on, since a build left behind by a run that fails keeps nvcc busy
    after the process exits. Call `wait()` before anything compiles a graph for the GPU: the two
    load_kernels are cached per process, not guarded against two threads, so they must have
    returned first. wait() raises what a build raised (a KilnRunError naming a compile error), as
    the executor would have; `on_done(self)` runs on the build's thread when both succeeded.

    nvcc runs at a lower priority (nice 10, Linux): the caller's thread, which keeps a GPU fed from
    one core, gets the core it needs, and the compilers every other one."""

    NICE = 10

    def __init__(self, on_done: Callable[[KernelBuild], None] | None = None) -> None:
        from kiln import cuda as kiln_cuda
        from kiln_llm import cuda as llm_cuda

        # the lab packages are imported here, on the caller's thread, not on the build's
        self._loaders = (llm_cuda.load_kernels, kiln_cuda.load_kernels)  # the long build first
        self._on_done = on_done
        self._thread: threading.Thread | None = None
        self.started: float | None = None  # perf_counter() at start()
        self.finished: float | None = None
        self.errors: list[BaseException] = []

    def start(self) -> None:
        """Begins the builds; a no-op once they began."""
        if self._thread is None:
            self.started = time.perf_counter()
            self._thread = threading.Thread(target=self._run, name="kiln kernels", daemon=True)
            self._thread.start()

    @property
    def running(self) -> bool:
        return self.started is not None and self.finished is None

    def seconds(self) -> float:
        """How long the builds have run (or ran): 0 before start()."""
        if self.started is None:
            return 0.0
        return (self.finished or time.perf_counter()) - self.started

    def wait(self, every: float | None = None, tick: Callable[[KernelBuild], None] | None = None) -> None:
        """Starts the builds if they have not begun and waits for them, calling `tick(self)` every
        `every` seconds while they run. Raises the first build's error."""
        self.start()
        assert self._thread is not None
        while self._thread.is_alive():
            self._thread.join(timeout=every)
            if tick is not None and self._thread.is_alive():
                tick(self)
        if self.errors:
            raise self.errors[0]

    def _run(self) -> None:
        _lower_priority(self.NICE)
        try:
            from grader import toolchain

            toolchain.target_arch()  # nvidia-smi once (cached), before two builds could both run it
        except Exception:  # the builds themselves say what is missing, as they always did
            pass
        try:
            other = threading.Thread(target=self._load, args=(self._loaders[1],), name="kiln kernels (lab 4)")
            other.start()
            self._load(self._loaders[0])
            other.join()
        finally:
            self.finished = time.perf_counter()
        if self._on_done is not None and not self.errors:
            self._on_done(self)

    def _load(self, loader: Callable[[], Any]) -> None:
        try:
            loader()
        except BaseException as e:  # handed to wait(), which raises it on the caller's thread
            self.errors.append(e)


def _lower_priority(nice: int) -> None:
    """This thread, and the processes it starts, `nice` steps lower in priority (19 at most): Linux
    keeps a nice value per thread, and a child inherits its parent thread's."""
    try:
        me = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, me, min(19, os.getpriority(os.PRIO_PROCESS, me) + nice))
    except (AttributeError, OSError):  # not Linux, or not allowed: the same build at normal priority
        pass
