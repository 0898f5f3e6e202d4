"""What every executor shares: the run-time error and the check of a run's inputs.

Both executors (kiln/cpu.py, kiln/cuda.py) call `check_inputs` before computing anything, so a
caller's mistake is reported the same way on either device, by the input's name, instead of as a
wrong answer or a crash deep inside a kernel.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from kiln.ir import DType, Graph, Node


class KilnRunError(ValueError):
    """A run that cannot start: inputs missing, extra or not what the graph declares."""


def torch_dtype(dtype: DType) -> torch.dtype:
    return getattr(torch, dtype.torch_name)


def check_inputs(graph: Graph, inputs: Mapping[str, Any], device: str | torch.device) -> dict[str, torch.Tensor]:
    """The run's inputs by name, each checked against its input node: a torch tensor on `device`
    (its type: `cpu` or `cuda`), contiguous, of the declared shape and dtype. Raises KilnRunError
    naming the input and the problem; the first problem found is reported."""
    if not isinstance(inputs, Mapping):
        raise KilnRunError(f"inputs must be a mapping from input name to tensor, not {type(inputs).__name__}")
    want = torch.device(device)
    nodes = {n.attrs["name"]: n for n in graph.inputs}
    missing = [k for k in nodes if k not in inputs]
    if missing:
        raise KilnRunError(f"missing input(s) {missing}: graph {graph.name!r} takes {list(nodes)}")
    extra = [k for k in inputs if k not in nodes]
    if extra:
        raise KilnRunError(f"unknown input(s) {extra}: graph {graph.name!r} takes {list(nodes)}")
    out: dict[str, torch.Tensor] = {}
    for name, node in nodes.items():
        t = inputs[name]
        if not isinstance(t, torch.Tensor):
            raise KilnRunError(f"input {name!r}: a torch tensor is needed, not {type(t).__name__}")
        if t.device.type != want.type or (want.index is not None and t.device.index != want.index):
            raise KilnRunError(f"input {name!r} is on {t.device}: this executor runs on {want} (move it with .to())")
        if tuple(t.shape) != node.type.shape:
            raise KilnRunError(f"input {name!r} has shape {list(t.shape)}: the graph declares {node.type}")
        if t.dtype != torch_dtype(node.type.dtype):
            raise KilnRunError(f"input {name!r} has dtype {t.dtype}: the graph declares {node.type}")
        if not t.is_contiguous():
            raise KilnRunError(f"input {name!r} is not contiguous: pass t.contiguous() (kiln reads rows densely)")
        out[name] = t
    return out


def check_shared(node: Node, t: torch.Tensor) -> torch.Tensor:
    """Another executor's constant or buffer, taken for `node` (`share_with`): it must have the
    node's type, or two graphs would read one memory as two different tensors."""
    if tuple(t.shape) != node.type.shape or t.dtype != torch_dtype(node.type.dtype):
        raise KilnRunError(
            f"{node.op} {node.attrs['name']!r} is {node.type} here but {t.dtype}{list(t.shape)} in the executor"
            " it shares memory with"
        )
    return t
