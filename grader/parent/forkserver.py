"""The grading process's side of the fork server (grader/child/forkserver.py), which forks task
processes from a warm interpreter with torch already imported.

The server is started by the first graded run that finds none, and exits when idle. Its socket
name carries a hash of the grader's sources, the interpreter and the identity of the checkout's
folder, so an edited grader, or a fresh clone in the same place, never talks to a stale server.
GRADER_FORKSERVER=0 turns it off.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from grader import paths
from grader.parent import sandbox
from grader.records import Exited, Forked, ForkRequest, from_line, to_line


def enabled() -> bool:
    return os.environ.get("GRADER_FORKSERVER", "1") != "0" and hasattr(os, "fork")


def socket_path() -> Path:
    """One server per user, interpreter, grader version and set of visible GPUs (so that the
    workers of a batch, one per GPU, each have their own), and per checkout and environment as
    they exist on disk: a checkout deleted and cloned again at the same path (its .venv too) must
    not reach a server still running from the old one, whose working folder and files are gone.
    Each pytest-xdist worker of `make check` has its own too: a server forks one task process at a
    time and waits for it, so two workers sharing one would grade in turns (and a task process
    waiting for its build would hold up the other worker's grading)."""
    # the interpreter by its real file: .venv/bin/python and the same Python reached by another
    # path (a venv folder that is a link) are one interpreter, with one server
    h = hashlib.sha256(os.path.realpath(sys.executable).encode() + os.environ.get("CUDA_VISIBLE_DEVICES", "*").encode())
    h.update(os.environ.get("PYTEST_XDIST_WORKER", "").encode())
    for folder in (paths.ROOT, Path(sys.prefix)):
        st = folder.stat()
        h.update(f"{st.st_dev}:{st.st_ino}".encode())
    for f in sorted((paths.ROOT / "grader").rglob("*.py")):
        h.update(str(f.relative_to(paths.ROOT)).encode() + f.read_bytes())
    return Path(tempfile.gettempdir()) / f"cuda-course-{os.getuid()}-{h.hexdigest()[:12]}.sock"


def connect() -> socket.socket | None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(socket_path()))
        return s
    except OSError:
        s.close()
        return None


def start_in_background(env: dict[str, str]) -> None:
    log = paths.BUILD / "forkserver.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        subprocess.Popen(
            [sys.executable, "-m", "grader.child.forkserver", str(socket_path())],
            cwd=paths.ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )


def request(
    sock: socket.socket,
    argv: list[str],
    env: dict[str, str],
    stdout: Path,
    stderr: Path,
    report_fd: int,
    policy: sandbox.Policy | None = None,
) -> int:
    """Asks for one child; returns its pid. Its exit status arrives later on the same socket.

    The child's stdin is this socket, so a child started before the build has finished reads its
    job from whatever the client sends next. Its report pipe travels with the request (SCM_RIGHTS).
    """
    msg = ForkRequest(argv, env, str(stdout), str(stderr), policy.to_json() if policy else None)
    data = to_line(msg)
    sent = socket.send_fds(sock, [data], [report_fd])
    sock.sendall(data[sent:])
    return from_line(Forked, _read_line(sock)).pid


def read_status(sock: socket.socket, timeout: float | None) -> int:
    """The child's exit status as subprocess reports it (negative for a signal)."""
    sock.settimeout(timeout)
    return from_line(Exited, _read_line(sock)).returncode


def _read_line(sock: socket.socket) -> bytes:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("fork server closed the connection")
        buf += chunk
    return buf
