"""Proof that a task's checks can fail: zeros, a pass-through of an input and an fp16 round trip
of the right answer must each be rejected, while the reference itself is accepted.

Runs on the CPU with the task's own inputs and references, so it guards every task on any machine.
"""

from __future__ import annotations

from typing import Any

from grader.child.compare import judge
from grader.parent.runner import run_prepare
from grader.tasks.seeds import seed_for
from grader.tasks.spec import Buffer, CudaTask, Entry, Rng, Task, clone_values, torch_dtype

MAX_ELEMENTS = 1 << 21  # larger cases add time, not evidence


def fakes(entry: Entry, inputs: dict[str, Any], out: Buffer, expected: Any, shape: tuple[int, ...]) -> dict[str, Any]:
    """Plausible wrong answers a broken or lazy kernel would produce."""
    import torch

    dt = torch_dtype(out.dtype)
    fake: dict[str, Any] = {"zeros": torch.zeros(shape, dtype=dt)}
    sources = [inputs[b.name] for b in entry.buffers("in") if b.name in inputs]
    if sources:
        flat = sources[0].flatten().to(dt)
        numel = fake["zeros"].numel()
        passthrough = torch.zeros(numel, dtype=dt)
        passthrough[: min(numel, flat.numel())] = flat[:numel]
        # a copy's right answer is its input (lab 6's peer copy): that is no lazy answer to reject
        if not torch.equal(passthrough.view(shape), expected.reshape(shape).to(dt)):
            fake["pass-through"] = passthrough.view(shape)
    # an fp16 round trip changes nothing in an f16 output and adds precision to a bf16 one: it
    # proves only that 32-bit outputs are held to more than half precision
    if dt.is_floating_point and dt.itemsize > 2 and not entry.reduced_precision:
        fake["fp16 round trip"] = expected.reshape(shape).to(dt).half().to(dt)
    return fake


def calibrate(task: Task) -> list[str]:
    """Problems found; an empty list means every fake fails somewhere and the reference passes.

    Only CUDA tasks compare outputs against a reference here; the other kinds are judged by their
    own tests, which `make verify` runs on the skeleton (they must fail) and the solution."""
    if not isinstance(task, CudaTask):
        return []
    if task.prepare is not None:  # what its inputs are made from (lab 3's trained network)
        failed = run_prepare(task.prepare)
        if failed:
            return [f"{task.task_id}: {failed}"]
    problems: list[str] = []
    cases = [c for c in task.cases if c.size <= MAX_ELEMENTS] or list(task.cases[:1])
    for entry in task.entries:
        caught: dict[tuple[str, str], bool] = {}
        for case in cases:
            inputs = task.make_inputs(case.params, Rng(seed_for(task, case.label), "cpu"))
            expected = entry.reference(clone_values(inputs))
            shapes = task.shapes(inputs, expected)
            for out in entry.buffers("out") + entry.buffers("inout"):
                atol, rtol = task.tol(out.dtype, entry)
                ref = expected[out.name].reshape(shapes[out.name])
                exact = ref.to(torch_dtype(out.dtype))
                if judge(out.name, exact, ref, atol, rtol, None) is not None:
                    problems.append(
                        f"{task.task_id} {entry.symbol} {case.label}: the reference, stored as "
                        f"{out.dtype}, fails its own tolerance"
                    )
                for kind, value in fakes(entry, inputs, out, ref, shapes[out.name]).items():
                    key = (out.name, kind)
                    if value.numel() and judge(out.name, value, ref, atol, rtol, None) is not None:
                        caught[key] = True
                    else:
                        caught.setdefault(key, False)
        for (name, kind), was_caught in caught.items():
            if not was_caught:
                problems.append(f"{task.task_id} {entry.symbol}: a {kind} `{name}` passes every case")
    return problems
