"""The environment a grade was produced in, for the JSON report (no torch import needed)."""

from __future__ import annotations

import importlib.metadata
import platform
from typing import Any

from grader import toolchain


def environment() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform()}
    try:
        info["nvcc"] = toolchain.nvcc_version()
    except toolchain.ToolchainError as e:
        info["nvcc"] = f"missing: {e}"
    try:
        info["torch"] = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        info["torch"] = "missing"
    info["arch"] = toolchain.target_arch()
    info["gpus"] = [
        {
            "name": g.name,
            "compute_capability": g.compute_capability,
            "driver": g.driver,
            "memory_mib": g.memory_mib,
            "sm_clock_mhz": g.sm_clock_mhz,
            "mem_clock_mhz": g.mem_clock_mhz,
            "max_sm_clock_mhz": g.max_sm_clock_mhz,
        }
        for g in toolchain.gpus()
    ]
    return info
