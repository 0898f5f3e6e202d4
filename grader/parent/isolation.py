"""Running one task in a child process with a timeout, over a report channel it cannot forge.

A child comes from the fork server when one is running (torch already imported), else it is
started directly, before its library exists: it reads its job from stdin, so its slow torch
import overlaps the nvcc build. On timeout the child's whole process group is killed: a hung
kernel dies with its context, and the next task gets a healthy GPU.

The child's report travels over a pipe of its own (`--report-fd`), one line per update, each
signed with a key the child reads from stdin before any student code is loaded. Its stdout and
stderr go to files (only their tail is read back), so printing a fake "pass" line or a fake
JSON report achieves nothing, and lines on the pipe that do not carry the key are counted as
forged. With a sandbox policy, the child runs inside grader/parent/sandbox.py's sandbox, which
hides most of the checkout (the solutions, `.build` with every graded copy and built library):
the files its job names there are copied into an inbox of its own when the job is known, and
the job names those copies instead.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from grader import paths
from grader.parent import forkserver, sandbox
from grader.records import ChildJob, ChildReport

OUTPUT_READ = 4 << 20  # bytes of a child's stdout or stderr read back: the rest is cut from the middle


@dataclass
class ChildRun:
    returncode: int | None
    timed_out: bool
    stdout: str
    stderr: str
    result: ChildReport
    seconds: float
    forged: int = 0  # lines on the report channel without the child's key: someone else wrote them
    sandbox: list[str] | None = None  # what the sandbox held, when there was one


def child_env() -> dict[str, str]:
    """The grader's environment for a task process, less the secret seed: the task process gets
    only its task's key, in its job (grader/child/context.py)."""
    env = {k: v for k, v in os.environ.items() if k != "GRADER_SEED"}
    env["PYTHONPATH"] = os.pathsep.join([str(paths.ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("PYTHONUNBUFFERED", "1")
    # torch's OpenMP workers otherwise spin for a while after each parallel CPU operation (the
    # grader's poisoning of host outputs before a timed call), on every core: a task that copies on
    # several CPU threads of its own (lab 2's pinned staging) was measured 1.8x slower behind them.
    # Passive workers sleep at once. Read when torch loads its OpenMP runtime, so it must be set here.
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def sign(key: bytes, payload: str) -> str:
    return hmac.new(key, payload.encode(), hashlib.sha256).hexdigest()


class ReportChannel:
    """The read end of a child's report pipe: keeps the last correctly signed report."""

    def __init__(self) -> None:
        self.key = secrets.token_bytes(32)
        self.read_fd, self.write_fd = os.pipe()
        self.report = ChildReport()
        self.forged = 0
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        with os.fdopen(self.read_fd, "rb") as f:
            for raw in f:
                mac, _, payload = raw.decode(errors="replace").rstrip("\n").partition(" ")
                if payload and hmac.compare_digest(mac, sign(self.key, payload)):
                    self.report = ChildReport.from_json(payload)
                elif raw.strip():
                    self.forged += 1

    def sent(self) -> None:
        """The child has its end: close ours, so the pipe ends when the child does."""
        os.close(self.write_fd)

    def final(self, wait: float = 2.0) -> ChildReport:
        self._thread.join(wait)  # a process the task left behind may hold the pipe open: don't wait for it
        return self.report


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def read_capped(path: Path, limit: int = OUTPUT_READ) -> str:
    """A child's output file, its middle cut when it is long (a student may print gigabytes)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            if size <= limit:
                return f.read().decode(errors="replace")
            head = f.read(limit // 4)
            f.seek(size - (limit - limit // 4))
            tail = f.read()
    except OSError:
        return ""
    cut = f"\n[... {size - limit} bytes of output cut ...]\n"
    return head.decode(errors="replace") + cut + tail.decode(errors="replace")


class Child:
    """One task process. Give it its job with feed() (unless it got one up front), then wait().

    `base` names its files (base.out, base.err); `policy`, when given, sandboxes it. Two kinds:
    SpawnedChild, a fresh interpreter, and ForkedChild, from the fork server. They differ in how
    the process starts, how it is told things and how its exit status arrives; wait() is one."""

    def __init__(self, base: Path, env: dict[str, str] | None, policy: sandbox.Policy | None) -> None:
        base.parent.mkdir(parents=True, exist_ok=True)
        self.out, self.err = base.with_suffix(".out"), base.with_suffix(".err")
        self.channel = ReportChannel()
        self.args = ["--report-fd", str(self.channel.write_fd), "--scratch", str(base) + ".work"]
        self.env = env or child_env()
        self.inbox: Path | None = None
        if policy is not None:
            self.env = sandbox.scrubbed_env(self.env, policy.work)
            for f in (self.out, self.err):  # its output is its own: no other sandbox's user reads it
                os.close(os.open(f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
                f.chmod(0o600)
            # the job comes after the sandbox is entered: the sandbox shows this folder, and the
            # job's files that it hides are copied in (`_delivered`). Its name is not guessable:
            # where the grader's temporary folder is not /tmp (which the sandbox replaces with an
            # empty one), another task's sandbox sees the scratch folder, though it cannot list it.
            self.inbox = base.with_name(f"{base.name}.in-{secrets.token_hex(8)}")
            self.inbox.mkdir(mode=0o755)
            self.inbox.chmod(0o755)  # the sandbox's user (nobody) reads it, whatever the umask
            policy = dataclasses.replace(policy, readable=(*policy.readable, str(self.inbox)))
        self.policy = policy
        self.started = time.perf_counter()
        self._fed = False

    # --- what each kind does its own way --------------------------------------------------------

    def _write(self, line: str) -> None:
        """A line on the process's stdin (a process that has gone away is not an error here)."""
        raise NotImplementedError

    def _status(self, timeout: float) -> int | None:
        """The exit status (negative for a signal), None when it cannot be known; TimeoutError
        when the process is still running after `timeout` seconds."""
        raise NotImplementedError

    def _close(self) -> None:
        """Lets go of the process's stdin (or socket)."""

    def kill(self) -> None:
        raise NotImplementedError

    # --- the same for both ----------------------------------------------------------------------

    def _started(self) -> None:
        """The process exists: send its report key first, then give up our end of its pipe."""
        self._write(self.channel.key.hex() + "\n")
        self.channel.sent()

    def feed(self, job: ChildJob | None) -> None:
        """Hands the child its job; None tells it to exit (the build failed)."""
        self._fed = True
        if job is not None and self.inbox is not None:
            job = self._delivered(job)
        self.started = time.perf_counter()
        self._write(job.to_line() if job is not None else "\n")

    def _delivered(self, job: ChildJob) -> ChildJob:
        """The job with each file the sandbox hides (a graded copy, a variant, a solution, the
        built library, all under .build or labN/solutions) replaced by a copy in the inbox, at its
        path in the checkout: only this task's own files, never the folder they came from."""
        assert self.inbox is not None
        shown = sandbox.shown_entries(paths.ROOT)

        def deliver(path: str) -> str:
            if not sandbox.hidden(path, shown, paths.ROOT) or not os.path.isfile(path):
                return path
            copy = self.inbox / os.path.relpath(os.path.realpath(path), paths.ROOT)
            copy.parent.mkdir(parents=True, exist_ok=True)
            folder = copy.parent
            while folder != self.inbox:  # each folder on the way readable by nobody, whatever the umask
                folder.chmod(0o755)
                folder = folder.parent
            shutil.copyfile(path, copy)
            copy.chmod(0o644)
            return str(copy)

        if job.lib:  # the build's record beside the library: the task process reads it (grader/child/observe.py)
            deliver(str(Path(job.lib).with_suffix(".json")))
        return dataclasses.replace(  # (not the spec: specs lie in the labs' tests/, which it sees)
            job,
            sources={rel: deliver(p) for rel, p in job.sources.items()},
            lib=deliver(job.lib) if job.lib else job.lib,
        )

    def wait(self, timeout: float) -> ChildRun:
        """Waits for the process to end, at most `timeout` seconds before its process group is
        killed; what it reported, printed and returned."""
        if not self._fed:
            self.feed(None)
        timed_out = False
        try:
            code = self._status(timeout)
        except TimeoutError:
            timed_out = True
            self.kill()
            try:
                code = self._status(30)
            except TimeoutError:
                code = None
        self._close()
        report = self.channel.final()
        return ChildRun(
            code,
            timed_out,
            read_capped(self.out),
            read_capped(self.err),
            report,
            time.perf_counter() - self.started,
            forged=self.channel.forged,
            sandbox=(report.sandbox or None) if self.policy is not None else None,
        )


class SpawnedChild(Child):
    """A task process in a fresh interpreter (`python -m grader.child`): it imports torch while
    the grading process builds, then reads its job from stdin. `wrapper` goes before the
    interpreter (compute-sanitizer); `job`, when known up front, is sent at once."""

    def __init__(
        self,
        base: Path,
        job: ChildJob | None = None,
        wrapper: list[str] | None = None,
        env: dict[str, str] | None = None,
        policy: sandbox.Policy | None = None,
    ) -> None:
        super().__init__(base, env, policy)
        prefix = sandbox.command(self.policy) if self.policy else []
        cmd = [*prefix, *(wrapper or []), sys.executable, "-m", "grader.child", *self.args]
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.proc = subprocess.Popen(
                cmd,
                cwd=paths.ROOT,
                env=self.env,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                pass_fds=(self.channel.write_fd,),
                start_new_session=True,
            )
        self._started()
        if job is not None:
            self.feed(job)

    def _write(self, line: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(line.encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def _status(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError from None

    def _close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()

    def kill(self) -> None:
        _kill_group(self.proc.pid)
        self.proc.wait()


class ForkedChild(Child):
    """A task process forked at once by the fork server over `server` (a connected socket): it
    sets up CUDA while nvcc runs, then reads its job from the socket, its stdin."""

    def __init__(
        self,
        base: Path,
        server: socket.socket,
        env: dict[str, str] | None = None,
        policy: sandbox.Policy | None = None,
    ) -> None:
        super().__init__(base, env, policy)
        self.server = server
        self.pid = forkserver.request(
            server, self.args, self.env, self.out, self.err, self.channel.write_fd, self.policy
        )
        self._started()

    def _write(self, line: str) -> None:
        try:
            self.server.sendall(line.encode())
        except OSError:
            pass

    def _status(self, timeout: float) -> int | None:
        try:
            return forkserver.read_status(self.server, timeout)
        except TimeoutError:
            raise
        except (OSError, ConnectionError, ValueError):  # the server went away: the status is lost
            return None

    def _close(self) -> None:
        self.server.close()

    def kill(self) -> None:
        _kill_group(self.pid)


def new_child(base: Path, policy: sandbox.Policy | None = None) -> Child:
    """A task process from the fork server if one answers, else a fresh interpreter (and a fork
    server is started in the background for the next run)."""
    if forkserver.enabled():
        sock = forkserver.connect()
        if sock is not None:
            return ForkedChild(base, sock, policy=policy)
        forkserver.start_in_background(sandbox.scrubbed_env(child_env()))
    return SpawnedChild(base, policy=policy)


def signal_name(returncode: int | None) -> str:
    if returncode is None or returncode >= 0:
        return f"exit code {returncode}"
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"
