"""kiln_llm: lab 5's extensions of lab 4's compiler kiln, for LLaMA-family models.

    import kiln_llm                       # registers the operators below in kiln's registries
    ex = kiln_llm.compile(graph, "cuda")  # fusion, then lab 4's executor with lab 5's lowerings

kiln itself is lab 4's package (../lab4/kiln): lab 5 adds to it only through its registries
(kiln.ops.register, kiln.cpu.register_cpu, kiln.cuda.register_cuda), so a student's lab 4 runs
unchanged under lab 5. The modules:

    ops.py      the operators' definitions: types and shapes (given)
    cpu.py      their CPU kernels (task 01)
    kernels/    their CUDA kernels (tasks 02 and 03) and cuda.py, the lowerings (given)
    codegen.py  the `fused` operator: CUDA source generated per fused node, with a compile cache (given)
    fusion.py   the fusion pass (task 04)
    pipeline.py `compile`: the passes, then an executor; `KernelBuild`: the CUDA kernels built
                in the background (make generate compiles them while the tiny model trains)
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import kiln  # noqa: F401 (the grader and the scripts stage lab 4's package first)
except ImportError:  # run from lab5/ directly: lab 4's kiln is the sibling folder's
    sys.path.append(str(Path(__file__).resolve().parents[2] / "lab4"))

from kiln_llm import codegen, cpu, ops  # noqa: F401 (imported for their registrations)
from kiln_llm.pipeline import KernelBuild, compile

__all__ = ["KernelBuild", "compile"]
