"""What a task's custom checks get to work with inside the child process."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from grader.child.ffi import EntryPoint, Library
from grader.records import CheckFailure, ChildJob, Verdict
from grader.tasks.seeds import seed_for
from grader.tasks.spec import Case, Task


@dataclass
class RunContext:
    task: Task
    lib: Library
    device: str = "cuda"
    notes: list[str] = field(default_factory=list)

    def entry(self, symbol: str, args: Any = None) -> EntryPoint:
        return self.lib.function(symbol, args if args is not None else self.task.entry(symbol).args)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def fail(self, message: str, verdict: Verdict = Verdict.WRONG) -> None:
        raise CheckFailure(verdict, message)

    def check_rc(self, symbol: str, rc: int, case: str) -> None:
        if rc != 0:
            raise CheckFailure(Verdict.CRASH, returned_error(self.lib, symbol, rc, case))

    def captured(self, calls: Sequence[tuple[str, dict[str, Any]]]) -> Any:
        """A torch.cuda.CUDAGraph of `calls` (entry point, argument values without `stream`), for a
        check that replays it on new data in the same buffers. Each call runs once first, outside
        the capture (modules load, errors show plainly), then all are captured on torch's capture
        stream, passed as their `stream` argument. A capture CUDA refuses fails the check and names
        its usual causes; a non-zero return code is the call's crash."""
        import torch

        for symbol, values in calls:
            stream = torch.cuda.current_stream().cuda_stream
            self.check_rc(symbol, self.entry(symbol)({**values, "stream": stream}), "before the capture")
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        rcs = []
        try:
            with torch.cuda.graph(graph):
                stream = torch.cuda.current_stream().cuda_stream
                for symbol, values in calls:
                    rcs.append((symbol, self.entry(symbol)({**values, "stream": stream})))
        except RuntimeError as e:
            what = " and ".join(symbol for symbol, _ in calls)
            self.fail(
                f"capturing {what} into a CUDA graph failed ({str(e).strip().splitlines()[0]}): launch only on "
                f"the `stream` argument (the fourth launch parameter), and do not synchronize, allocate or copy "
                f"to the host inside the call"
            )
        for symbol, rc in rcs:
            self.check_rc(symbol, rc, "a call captured into a CUDA graph")
        return graph


@dataclass
class TorchRunContext:
    """What a torch extension task's custom checks get: the task, the device its ops run on
    ("cuda", or "cpu" for gpu=False), notes for the report, and failing with a verdict. The ops
    themselves are torch.ops.<namespace>.<name>, registered by then."""

    task: Task
    device: str
    notes: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def fail(self, message: str, verdict: Verdict = Verdict.WRONG) -> None:
        raise CheckFailure(verdict, message)

    def seed(self, label: str) -> int:
        """A seed for the check's random draws, moved by GRADER_SEED like the cases' inputs."""
        return seed_for(self.task, label) % 2**31


CUDA_ERROR_INVALID_VALUE = 1  # cudaErrorInvalidValue: what an entry point returns for sizes it refuses

_HINTS = {
    "cudaErrorNotYetImplemented": "the skeleton's stub `return` is still in place",
    "cudaErrorInvalidConfiguration": "a block holds at most 1024 threads and a grid needs at least one block",
    "cudaErrorInvalidValue": "an argument to a runtime call is invalid (a null pointer, a size of 0, a bad direction?)",
    "cudaErrorNoKernelImageForDevice": "the library was built for another GPU architecture: unset GRADER_ARCH",
    "cudaErrorMemoryAllocation": "cudaMalloc failed: is the size in bytes right?",
    "cudaErrorPeerAccessAlreadyEnabled": "a second cudaDeviceEnablePeerAccess for a pair reports it and leaves it "
    "in the runtime's last error: here it is no error; clear it (cudaGetLastError) and go on",
}


def returned_error(lib: Library, symbol: str, rc: int, case: str) -> str:
    name = lib.error_name(rc)
    hint = _HINTS.get(name)
    return f"{symbol} returned {name} ({rc}) for {case}" + (f": {hint}" if hint else "")


def chosen_cases(cases: Sequence[Case], job: ChildJob) -> list[Case]:
    """The cases a job runs: the sanitizer only the small ones; the huge ones only when asked for."""
    return [c for c in cases if (c.small or not job.sanitize) and (job.huge or not c.huge)]
