"""Running one task in a child process with a timeout.

The child starts before its library exists (it reads the path from stdin), so its slow torch
import overlaps the nvcc build. On timeout the whole process group is killed: a hung kernel dies
with its context, and the next task gets a healthy GPU.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grader import paths


@dataclass
class ChildRun:
    returncode: int | None
    timed_out: bool
    stdout: str
    stderr: str
    result: dict[str, Any]
    seconds: float


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(paths.ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


class Child:
    def __init__(self, spec: Path, result: Path, timing: str, sanitize: bool = False,
                 wrapper: list[str] | None = None, lib: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.result_path = result
        result.parent.mkdir(parents=True, exist_ok=True)
        result.unlink(missing_ok=True)
        cmd = [*(wrapper or []), sys.executable, "-m", "grader.child", "--spec", str(spec),
               "--lib", str(lib) if lib else "-", "--result", str(result), "--timing", timing]
        if sanitize:
            cmd.append("--sanitize")
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            cmd, cwd=paths.ROOT, env=env or child_env(), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )
        self._fed = lib is not None

    def feed(self, lib: Path | None) -> None:
        """Hands the child its library; None tells it to exit (the build failed)."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(f"{lib or ''}\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        self._fed = True
        self.started = time.perf_counter()

    def wait(self, timeout: float) -> ChildRun:
        if not self._fed:
            self.feed(None)
        timed_out = False
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out, err = self.proc.communicate()
        result: dict[str, Any] = {}
        if self.result_path.exists():
            try:
                result = json.loads(self.result_path.read_text())
            except json.JSONDecodeError:
                result = {}
        return ChildRun(self.proc.returncode, timed_out, out, err, result, time.perf_counter() - self.started)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.communicate()


def signal_name(returncode: int | None) -> str:
    if returncode is None or returncode >= 0:
        return f"exit code {returncode}"
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"
