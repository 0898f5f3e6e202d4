"""Lab 3 · Task 06, the Python half of lab3ext::linear: its fake and its backward.

Implement: the fake (meta) function, which says what the op returns (shape, dtype, device) without
           computing it, and the backward, which turns grad_y into the gradients of x, w and b.
Contract:  the op is lab3ext::linear(x (B, in), w (out, in), b (out,)) -> y (B, out) = x·wᵀ + b,
           registered from C++ by 06_extension_op.cpp; the grader imports this file once the extension
           is loaded. The backward computes its two products with torch.ops.lab3ext.linear itself
           (your kernel): no torch.matmul, no `@`. Every gradient has its input's shape.
Test:      make test-lab3 TASK=06
"""

from __future__ import annotations

from typing import Any

import torch

OP = "lab3ext::linear"


@torch.library.register_fake(OP)
def _linear_fake(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # TODO(lab3/06) begin: return an empty tensor shaped like the op's output, from the inputs' sizes alone (they may be symbolic under torch.compile); see the chapter's section "Fakes, opcheck and torch.compile"; about 4 lines; x (B, in), w (out, in) -> y (B, out).
    raise NotImplementedError("TODO(lab3/06): the fake of lab3ext::linear")  # ~
    # TODO(lab3/06) end


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    x, w, _ = inputs
    ctx.save_for_backward(x, w)  # b does not appear in any gradient


def _linear_backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    # TODO(lab3/06) begin: the three gradients of y = x·wᵀ + b, the two products through torch.ops.lab3ext.linear (it computes a·mᵀ + c: pick a, m and a zero c); see the chapter's section "The backward of a linear layer"; about 10 lines; check each shape: grad_x (B, in), grad_w (out, in), grad_b (out,).
    raise NotImplementedError("TODO(lab3/06): the backward of lab3ext::linear")  # ~
    # TODO(lab3/06) end


torch.library.register_autograd(OP, _linear_backward, setup_context=_setup_context)
