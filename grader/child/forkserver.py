"""The fork server: a warm parent for task processes, torch imported once, each task forked from it.

Importing torch takes seconds; forking a process that already has it takes milliseconds. This
server imports torch and the task-side grader (but never touches CUDA, which does not survive a
fork), then forks one task process per request. Each is still a separate process with its own
CUDA context, so isolation is unchanged: a crash or a hang ends that process alone.

It lives on the task side because what it forks runs `grader.child.__main__`; the grading process
only starts it and talks to it over its socket (grader/parent/forkserver.py, with the records
ForkRequest, Forked and Exited). It exits after IDLE_SECONDS without work.

    python -m grader.child.forkserver SOCKET
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
import tempfile
import traceback
from pathlib import Path

from grader.parent import sandbox
from grader.records import Exited, Forked, ForkRequest, from_line, to_line

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

# What torch.library.opcheck (its test_aot_dispatch_dynamic) and torch.compile import on their first
# use: inductor's lowerings, export, sympy's combinatorics, jinja2, about 240 modules. A task process
# that imports them itself spends most of a PyTorch-extension task's checks on it (on a 2-core CPU:
# opcheck twice and one torch.compile took 10-12 s in a child forked after PRELOAD, 1.25 s after
# these too). They import torch._inductor: with PYTORCH_NVML_BASED_CUDA_CHECK=1 (torch's own switch:
# "is CUDA available" asked of NVML, not of the driver) that need not touch the GPU, and the probe
# after them proves it or the server starts again without them (serve()). Only imports: running
# autograd here would make it unusable in every forked child (torch refuses autograd after a fork
# from a process whose autograd threads started).
COMPILE_PRELOAD = (
    "torch._inductor.lowering",
    "torch._inductor.select_algorithm",
    "torch._inductor.scheduler",
    "torch._inductor.pattern_matcher",
    "torch._dynamo.testing",
    "torch.export._trace",
    "torch._export.db",
    "sympy.combinatorics.tensor_can",
    "jinja2",
)
LEAN = "GRADER_FORKSERVER_LEAN"  # set when a server restarts itself without COMPILE_PRELOAD


def _read_request(conn: socket.socket) -> tuple[ForkRequest, int]:
    buf, fds, _, _ = socket.recv_fds(conn, 1 << 16, 1)
    if len(fds) != 1:
        raise ValueError("a request without its report pipe")
    while not buf.endswith(b"\n"):
        chunk = conn.recv(1 << 16)
        if not chunk:
            raise ConnectionError("the client went away mid-request")
        buf += chunk
    return from_line(ForkRequest, buf), fds[0]


def _serve_one(conn: socket.socket, listener: socket.socket) -> None:
    from grader.child.__main__ import main as child_main

    req, report_fd = _read_request(conn)
    argv = list(req.argv)
    argv[argv.index("--report-fd") + 1] = str(report_fd)  # its number here, not in the client
    pid = os.fork()
    if pid == 0:  # the task process
        code = 3
        try:
            listener.close()
            os.setsid()
            for fd, name in ((1, req.stdout), (2, req.stderr)):
                f = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(f, fd)
                os.close(f)
            os.dup2(conn.fileno(), 0)
            os.environ.clear()
            os.environ.update(req.env)
            tempfile.tempdir = None  # read TMPDIR again: the server's own is cached
            sys.stdout = os.fdopen(1, "w", buffering=1)
            sys.stderr = os.fdopen(2, "w", buffering=1)
            if req.sandbox:
                try:
                    held = sandbox.enter(sandbox.Policy.from_json(req.sandbox))
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
    conn.sendall(to_line(Forked(pid)))
    _, status = os.waitpid(pid, 0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    try:
        conn.sendall(to_line(Exited(code)))
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


def _same_user(conn: socket.socket) -> bool:
    """Whether the peer runs as this server's user. The socket is the user's own (its file is not
    writable by others, and a sandbox sees another /tmp), but a task process must never get a
    fresh, unsandboxed process by asking for one: the kernel's word on who connected settles it."""
    try:
        _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    except (OSError, AttributeError):  # no SO_PEERCRED (not Linux): the file's permissions stand alone
        return True
    return uid == os.getuid()


def serve(path: Path) -> None:
    import importlib

    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # before torch: see COMPILE_PRELOAD
    lean = os.environ.get(LEAN) == "1"
    for name in PRELOAD + (() if lean else COMPILE_PRELOAD):  # the whole point: pay for these imports once
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # a kind whose packages are missing fails in its own task, with its own message
    if not _forked_children_can_use_cuda():
        if not lean:  # the same process again, a fresh interpreter without the compile preloads
            os.environ[LEAN] = "1"
            os.execv(sys.executable, [sys.executable, "-m", "grader.child.forkserver", str(path)])
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
                if not _same_user(conn):
                    continue
                conn.settimeout(None)
                try:
                    _serve_one(conn, listener)
                except (OSError, ValueError, KeyError, TypeError):
                    continue
    finally:
        path.unlink(missing_ok=True)


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
