"""A warm parent for task processes: torch imported once, each task forked from it.

Importing torch takes seconds; forking a process that already has it takes milliseconds. The
server imports torch and the grader (but never touches CUDA, which does not survive a fork),
then forks one child per task. Each child is still a separate process with its own CUDA
context, so isolation is unchanged: a crash or a hang ends that child alone.

The server is started by the first graded run that finds none and exits after IDLE_SECONDS
without work. Its socket name carries a hash of the grader's sources, the interpreter and the
identity of the checkout's folder, so an edited grader, or a fresh clone in the same place, never
talks to a stale server. GRADER_FORKSERVER=0 turns it off.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from grader import paths
from grader.parent import sandbox

IDLE_SECONDS = 900

# imported once by the server, so that no forked task process pays for them: each kind of task's
# runner in the task process, and the heavy modules those runners use
PRELOAD = (
    "torch",
    "grader.child.__main__",
    "grader.child.cudalib",
    "grader.child.pytests",  # pytest itself
    "grader.child.notebook",
    "nbformat",  # (with jsonschema) a second or so, like nbclient with jupyter_client and zmq
    "nbclient",
    "grader.child.torch_ext",
    "torch._dynamo",  # torch.compile: with the next two about 2 s on a CPU, once here instead of per task
    "torch._functorch.aot_autograd",
    "torch.testing._internal.optests",  # torch.library.opcheck
)
# Never preload torch.utils.cpp_extension or torch._inductor: importing either touches the CUDA
# driver (seen on an H200 with torch 2.11), and a child forked after that cannot use CUDA at all
# ("Cannot re-initialize CUDA in forked subprocess"). serve() checks this with a probe child.


def enabled() -> bool:
    return os.environ.get("GRADER_FORKSERVER", "1") != "0" and hasattr(os, "fork")


def socket_path() -> Path:
    """One server per user, interpreter, grader version and set of visible GPUs (so that the
    workers of a batch, one per GPU, each have their own), and per checkout and environment as
    they exist on disk: a checkout deleted and cloned again at the same path (its .venv too) must
    not reach a server still running from the old one, whose working folder and files are gone."""
    h = hashlib.sha256(sys.executable.encode() + os.environ.get("CUDA_VISIBLE_DEVICES", "*").encode())
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
            [sys.executable, "-m", "grader.parent.forkserver", str(socket_path())],
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
    msg = {
        "argv": argv,
        "env": env,
        "stdout": str(stdout),
        "stderr": str(stderr),
        "sandbox": policy.to_json() if policy else None,
    }
    data = json.dumps(msg).encode() + b"\n"
    sent = socket.send_fds(sock, [data], [report_fd])
    sock.sendall(data[sent:])
    return int(_read_line(sock)["pid"])


def read_status(sock: socket.socket, timeout: float | None) -> int:
    """The child's exit status as subprocess reports it (negative for a signal)."""
    sock.settimeout(timeout)
    return int(_read_line(sock)["returncode"])


def _read_line(sock: socket.socket) -> dict[str, Any]:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("fork server closed the connection")
        buf += chunk
    return json.loads(buf)


def _read_request(conn: socket.socket) -> tuple[dict[str, Any], int]:
    buf, fds, _, _ = socket.recv_fds(conn, 1 << 16, 1)
    if len(fds) != 1:
        raise ValueError("a request without its report pipe")
    while not buf.endswith(b"\n"):
        chunk = conn.recv(1 << 16)
        if not chunk:
            raise ConnectionError("the client went away mid-request")
        buf += chunk
    return json.loads(buf), fds[0]


def _serve_one(conn: socket.socket, listener: socket.socket) -> None:
    from grader.child.__main__ import main as child_main

    req, report_fd = _read_request(conn)
    argv = list(req["argv"])
    argv[argv.index("--report-fd") + 1] = str(report_fd)  # its number here, not in the client
    pid = os.fork()
    if pid == 0:  # the task process
        code = 3
        try:
            listener.close()
            os.setsid()
            for fd, name in ((1, req["stdout"]), (2, req["stderr"])):
                f = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(f, fd)
                os.close(f)
            os.dup2(conn.fileno(), 0)
            os.environ.clear()
            os.environ.update(req["env"])
            tempfile.tempdir = None  # read TMPDIR again: the server's own is cached
            sys.stdout = os.fdopen(1, "w", buffering=1)
            sys.stderr = os.fdopen(2, "w", buffering=1)
            if req.get("sandbox"):
                try:
                    held = sandbox.enter(sandbox.Policy.from_json(req["sandbox"]))
                except sandbox.SandboxError as e:
                    print(f"sandbox: {e}", file=sys.stderr)
                    os._exit(4)
                os.environ["GRADER_SANDBOX_HELD"] = json.dumps(held)
            code = child_main(argv)
        except BaseException:  # os._exit skips the usual traceback: print it for the parent to quote
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(code)
    os.close(report_fd)  # the child has it
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    _, status = os.waitpid(pid, 0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    try:
        conn.sendall(json.dumps({"returncode": code}).encode() + b"\n")
    except OSError:
        pass  # the client gave up (timeout) and went away


def _forked_children_can_use_cuda() -> bool:
    """Whether a child forked now can start CUDA (trivially true without a GPU)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.init()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def serve(path: Path) -> None:
    import importlib

    for name in PRELOAD:  # the whole point: pay for these imports once
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # a kind whose packages are missing fails in its own task, with its own message
    if not _forked_children_can_use_cuda():
        print("fork server: a forked child cannot use CUDA after the preloads; not serving", file=sys.stderr)
        return  # the grader then starts a fresh interpreter per task: slower, never wrong

    path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(4)
    listener.settimeout(IDLE_SECONDS)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        while True:
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                return
            with conn:
                conn.settimeout(None)
                try:
                    _serve_one(conn, listener)
                except (OSError, ValueError, KeyError):
                    continue
    finally:
        path.unlink(missing_ok=True)


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
