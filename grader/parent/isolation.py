"""Running one task in a child process with a timeout.

A child comes from the fork server when one is running (torch already imported), else it is
started directly, before its library exists: it reads its job from stdin, so its slow torch
import overlaps the nvcc build. On timeout the child's whole process group is killed: a hung
kernel dies with its context, and the next task gets a healthy GPU.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from grader import paths
from grader.parent import forkserver
from grader.records import ChildJob, ChildReport


@dataclass
class ChildRun:
    returncode: int | None
    timed_out: bool
    stdout: str
    stderr: str
    result: ChildReport
    seconds: float


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(paths.ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Child:
    """One task process. Give it its job with feed() (unless it got one up front), then wait()."""

    def __init__(
        self,
        result: Path,
        job: ChildJob | None = None,
        wrapper: list[str] | None = None,
        env: dict[str, str] | None = None,
        server: socket.socket | None = None,
    ) -> None:
        self.result_path = result
        result.parent.mkdir(parents=True, exist_ok=True)
        result.unlink(missing_ok=True)
        self.args = ["--result", str(result)]
        if job is not None:  # known up front (the sanitizer's runs): no stdin hand-over
            job_file = result.with_suffix(".job.json")
            job_file.write_text(job.to_line())
            self.args += ["--job", str(job_file)]
        self.env = env or child_env()
        self.server = server
        self.proc: subprocess.Popen[str] | None = None
        self.pid: int | None = None
        self.started = time.perf_counter()
        if server is None:
            cmd = [*(wrapper or []), sys.executable, "-m", "grader.child", *self.args]
            self.proc = subprocess.Popen(
                cmd,
                cwd=paths.ROOT,
                env=self.env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        else:  # forked at once: it sets up CUDA while nvcc runs, then reads its job
            out, err = result.with_suffix(".out"), result.with_suffix(".err")
            self.pid = forkserver.request(server, self.args, self.env, out, err)
        self._fed = job is not None

    def feed(self, job: ChildJob | None) -> None:
        """Hands the child its job; None tells it to exit (the build failed)."""
        self._fed = True
        self.started = time.perf_counter()
        line = job.to_line() if job is not None else "\n"
        if self.server is not None:
            try:
                self.server.sendall(line.encode())
            except OSError:
                pass
            return
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(line)
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass

    def wait(self, timeout: float) -> ChildRun:
        if not self._fed:
            self.feed(None)
        if self.server is not None:
            return self._wait_forked(timeout)
        assert self.proc is not None
        timed_out = False
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(self.proc.pid)
            out, err = self.proc.communicate()
        return ChildRun(self.proc.returncode, timed_out, out, err, self._report(), time.perf_counter() - self.started)

    def _wait_forked(self, timeout: float) -> ChildRun:
        assert self.server is not None
        timed_out = False
        try:
            code: int | None = forkserver.read_status(self.server, timeout)
        except TimeoutError:
            timed_out = True
            _kill_group(self.pid)
            try:
                code = forkserver.read_status(self.server, 30)
            except (OSError, ConnectionError, ValueError):
                code = None
        except (OSError, ConnectionError, ValueError):
            code = None
        self.server.close()
        out = self.result_path.with_suffix(".out")
        err = self.result_path.with_suffix(".err")
        text = [p.read_text(errors="replace") if p.exists() else "" for p in (out, err)]
        return ChildRun(code, timed_out, text[0], text[1], self._report(), time.perf_counter() - self.started)

    def _report(self) -> ChildReport:
        return ChildReport.load(self.result_path)

    def kill(self) -> None:
        if self.proc is not None:
            _kill_group(self.proc.pid)
            self.proc.communicate()
        elif self.pid is not None:
            _kill_group(self.pid)


def new_child(result: Path) -> Child:
    """A task process from the fork server if one answers, else a fresh interpreter (and a fork
    server is started in the background for the next run)."""
    if forkserver.enabled():
        sock = forkserver.connect()
        if sock is not None:
            return Child(result, server=sock)
        forkserver.start_in_background(child_env())
    return Child(result)


def signal_name(returncode: int | None) -> str:
    if returncode is None or returncode >= 0:
        return f"exit code {returncode}"
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"
