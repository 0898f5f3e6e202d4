"""The GPUs of a task of several (`Task.gpus`), in the task process.

A task of one GPU sees none of this: every helper here then does exactly what the single-device
harness always did (torch.cuda.synchronize() waits for the current device alone). A task of N
GPUs uses the devices 0 to N-1 of what the process sees; device 0 is the launching device: the
current device when an entry point is called, the one its CUDA events are timed on, the one its
outputs are compared on unless an argument says otherwise (`In(..., device=1)`).

Arguments on another device are made on device 0 (one seeded generator draws every input, so a
draw does not depend on where it lands) and moved through the host, never by a device-to-device
copy: torch enables peer access between two devices the first time it copies between them, and a
harness that did so would hide a student's missing cudaDeviceEnablePeerAccess. For the same reason
the reference of such a task is computed on CPU copies of its inputs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from grader.child.buffers import ALIGN

if TYPE_CHECKING:
    import torch

    from grader.tasks.spec import Buffer, CudaTask, Entry, Values

HOLD_CYCLES = 100_000_000  # about 50 ms at a 2 GHz SM clock: far longer than one call and its check

_count = 1  # the devices of the task being run: set once by cudalib.run


def use(n: int) -> None:
    global _count
    _count = max(int(n), 1)


def count() -> int:
    return _count


def name(device: int) -> str:
    """torch's name for a task's device: "cuda" for device 0 (torch's current device, as the
    single-device harness always said), "cuda:1" and so on for the others."""
    return "cuda" if device == 0 else f"cuda:{device}"


def synchronize() -> None:
    """Waits for every device of the task (one: the current device, as torch.cuda.synchronize())."""
    import torch

    if _count == 1:
        torch.cuda.synchronize()
        return
    for d in range(_count):
        torch.cuda.synchronize(d)


def hold_others() -> None:
    """Queues a long sleep on the current stream of every device but 0: a kernel the call launches
    there (on the legacy default stream, which waits for it) cannot finish before the grader looks
    at the outputs, so work on the wrong device is caught however small it is."""
    import torch

    for d in range(1, _count):
        with torch.cuda.device(d):
            torch.cuda._sleep(HOLD_CYCLES)


def check_current(where: str) -> None:
    """A task of several GPUs is called with device 0 current and must leave it so: a library that
    changes its caller's device moves the caller's next allocation and launch with it."""
    import torch

    from grader.records import CheckFailure, Verdict

    if _count == 1:
        return
    d = torch.cuda.current_device()
    if d != 0:
        torch.cuda.set_device(0)
        raise CheckFailure(
            Verdict.WRONG,
            f"{where}: the call left device {d} current; it was called with device 0 current and must leave it "
            f"so (cudaGetDevice before switching, cudaSetDevice back before returning)",
        )


def wait_on_others(event: Any) -> None:
    """Makes the current stream of every device but the current one wait for `event` (recorded on
    the current device): work queued there afterwards (a check of an output that lives there)
    runs after what the event closes."""
    import torch

    if _count == 1:
        return
    here = torch.cuda.current_device()
    for d in range(_count):
        if d != here:
            torch.cuda.current_stream(d).wait_event(event)


def relocate(t: torch.Tensor, device: int) -> torch.Tensor:
    """`t` moved to the task's `device` through the host, with its shape, strides and address
    modulo ALIGN kept (a view one float into its buffer stays one float off a 16-byte boundary)."""
    import torch

    target = torch.device(name(device))
    here = t.device.type == "cuda" and device == 0 and t.device.index == torch.cuda.current_device()
    if t.device == target or here:
        return t
    es = t.element_size()
    extent = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True)) if t.numel() else 0
    base = torch.empty(extent + ALIGN // es, dtype=t.dtype, device=target)
    shift = (t.data_ptr() % ALIGN - base.data_ptr() % ALIGN) % ALIGN if t.device.type == "cuda" else 0
    assert shift % es == 0, "tensors are aligned to their element size"
    out = base.as_strided(tuple(t.shape), t.stride(), shift // es)
    out.copy_(t.cpu())
    return out


def place(entries: list[Entry], inputs: Values) -> Values:
    """The inputs an entry reads on another device than 0 moved there (a task of one GPU: as is)."""
    for e in entries:
        for arg in e.buffers("in") + e.buffers("inout"):
            if arg.device != 0 and not arg.host and hasattr(inputs.get(arg.name), "data_ptr"):
                inputs[arg.name] = relocate(inputs[arg.name], arg.device)
    return inputs


def where(arg: Buffer) -> str:
    """The torch device an argument lives on."""
    return "cpu" if arg.host else name(arg.device)


def reference(task: CudaTask, entry: Entry, inputs: Values, clone: bool = True) -> Values:
    """The entry's reference, computed on clones of `inputs` (on `inputs` themselves without
    `clone`: a case past 2^31 elements has no room for clones): on the devices they live on for a
    task of one GPU, on CPU copies for a task of several (no device-to-device copy: see above)."""
    from grader.tasks.spec import clone_values

    if task.gpus <= 1:
        return entry.reference(clone_values(inputs) if clone else inputs)
    # .cpu() of a device tensor is already a copy: a clone only for what is on the host
    return entry.reference({k: _host_copy(v) for k, v in inputs.items()})


def _host_copy(v: Any) -> Any:
    if not hasattr(v, "cpu"):
        return v
    return v.clone() if v.device.type == "cpu" else v.cpu()
