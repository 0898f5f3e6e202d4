"""kiln: a small inference compiler (labs 4 and 5).

    import kiln
    b = kiln.Builder("mlp")
    x = b.input("x", (4, 784), "float32")
    ...
    b.output(y)
    print(kiln.to_text(b.graph))

The IR (kiln/ir.py), the operator registry (kiln/ops.py), shape inference (kiln/shapes.py), the
builder (kiln/frontend.py) and the text form (kiln/text.py) are given; the memory planner, the
executors, the kernels and constant folding (kiln/passes.py) are the lab's tasks.
`kiln.compile(graph, device)` folds the graph's constants, then builds the executor.
"""

from typing import Any

from kiln.frontend import Builder, Tensor
from kiln.ir import DType, Graph, IRError, Node, TensorType
from kiln.shapes import ShapeError
from kiln.text import parse, to_text


def __getattr__(name: str) -> Any:
    """`kiln.compile` and `kiln.CudaExecutor` (kiln/cuda.py, tasks 06-07), imported on first use:
    `import kiln` stays cheap and works on a machine without CUDA (nothing touches a GPU until an
    executor is built)."""
    if name in ("compile", "CudaExecutor"):
        from kiln import cuda

        return getattr(cuda, name)
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")


__all__ = [
    "Builder",
    "CudaExecutor",
    "DType",
    "Graph",
    "IRError",
    "Node",
    "ShapeError",
    "Tensor",
    "TensorType",
    "compile",
    "parse",
    "to_text",
]
