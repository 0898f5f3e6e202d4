"""The fork server hands out working task processes (on a CPU machine the task reports skipped)."""

import subprocess
import sys
import time

import pytest

from grader import paths
from grader.parent import forkserver
from grader.parent.isolation import ForkedChild, child_env
from grader.records import ChildJob, Verdict


@pytest.fixture
def server(tmp_path, monkeypatch):
    sock = tmp_path / "fs.sock"
    monkeypatch.setattr(forkserver, "socket_path", lambda: sock)
    proc = subprocess.Popen(
        [sys.executable, "-m", "grader.child.forkserver", str(sock)], cwd=paths.ROOT, env=child_env()
    )
    deadline = time.time() + 60
    while not sock.exists() and time.time() < deadline:
        time.sleep(0.1)
    yield sock
    proc.kill()
    proc.wait()


def test_forked_child_runs_a_task_and_reports(server, tmp_path):
    spec = paths.ROOT / "lab1" / "tests" / "test_01_vector_add.py"
    sock = forkserver.connect()
    assert sock is not None
    child = ForkedChild(tmp_path / "r.json", sock)
    child.feed(ChildJob(spec=str(spec), sources={}, lib=str(tmp_path / "missing.so"), timing="off"))
    run = child.wait(60)
    assert run.returncode == 0 and not run.timed_out
    assert run.result.verdict in (Verdict.SKIPPED, Verdict.COMPILE_ERROR)


def test_forked_child_that_hangs_is_killed(server, tmp_path, monkeypatch):
    spec = tmp_path / "test_99_hang.py"
    spec.write_text("import time\ntime.sleep(120)\n")
    sock = forkserver.connect()
    child = ForkedChild(tmp_path / "r.json", sock)
    monkeypatch.setenv("GRADER_NO_GPU", "1")
    child.feed(ChildJob(spec=str(spec), sources={}, lib=str(tmp_path / "x.so"), timing="off"))
    run = child.wait(1.0)
    assert run.timed_out


def test_the_compile_preloads_exist_and_leave_cuda_and_threads_alone():
    # a module renamed by a later torch would be skipped in silence (serve() ignores ImportError),
    # and the PyTorch-extension tasks would pay for torch.compile's imports in every task process again
    code = (
        "import os, threading, importlib\n"
        "os.environ['PYTORCH_NVML_BASED_CUDA_CHECK'] = '1'\n"
        "from grader.child.forkserver import COMPILE_PRELOAD, PRELOAD\n"
        "for m in PRELOAD:\n"
        "    try: importlib.import_module(m)\n"
        "    except ImportError: pass  # a kind's optional packages (nbformat) may be missing\n"
        "for m in COMPILE_PRELOAD: importlib.import_module(m)\n"
        "import torch\n"
        "print(torch.cuda.is_initialized(), threading.active_count())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=paths.ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    # no CUDA context and no second thread: a fork after them keeps both usable in the child
    assert out.stdout.split() == ["False", "1"], out.stdout
