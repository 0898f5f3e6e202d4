"""The sandbox for submissions' code, tested with hostile submissions of our own.

Each hostile submission is the Python fixture task's reference (fixtures/92, which runs on any
machine) with code added at the top of the student's module, so it runs inside the task process
as a student's would: it hunts for the secret seed, writes into the grader's files, leaves a
process behind, forges the result, floods its output and opens network connections. Grading
runs in a separate grading process whose environment carries GRADER_SEED from its start (as a
CI job's does), so that /proc/<pid>/environ of the grader holds the secret for real.

Where a test can fail only if the hostile code did run, a control without the sandbox shows
that it does what it says (finds the secret, reaches the listener). What of the checkout the
sandbox shows is checked here as a rule (any machine); grader/tests/test_sandbox_secrets.py
plays the thief who hunts for the solutions and other students' files, for every task kind.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from grader import paths
from grader.instructor.broken import materialize
from grader.parent import sandbox
from grader.tests.variants import processes_with

FIXTURE = Path(__file__).parent / "fixtures" / "python"
SPEC = FIXTURE / "tests" / "test_92_tinystats.py"
REFERENCE = FIXTURE / "variants" / "pass.py"
ANCHOR = "from tinystats.checks import require_nonempty\n"
# the hostile code reports what it found through a failing test's message
REPORT = """
def mean(xs: list[float]) -> float:  # noqa: F811 - the hostile code's report, as a failing test
    raise AssertionError("HOSTILE " + " | ".join(_FOUND))
"""


def _probe() -> str:
    try:
        held = sandbox.probe(sandbox.Policy(work=f"/tmp/grader-probe-{os.getpid()}"))
    except (sandbox.SandboxError, OSError) as e:
        return str(e)
    missing = [h for h in held if h.startswith("NOT HELD")]
    return "; ".join(missing)


NO_SANDBOX = _probe()
needs_namespaces = pytest.mark.skipif(bool(NO_SANDBOX), reason=f"the sandbox cannot hold here: {NO_SANDBOX}")


def hostile(name: str, code: str) -> Path:
    """The reference with `code` run when the student's module is imported."""
    edits = [(ANCHOR, ANCHOR + code), ("    return best\n", "    return best\n" + REPORT)]  # the report last
    return materialize(REFERENCE, edits, f"hostile-{name}", f"hostile: {name}")


def grade(source: Path, secret: str, *, sandboxed: bool, output_bytes: int = 256 << 20) -> dict:
    """Grades the fixture task with `source` in a grading process of its own; its result as JSON."""
    script = f"""
import json
from pathlib import Path
from grader.parent import runner
from grader.tasks.catalogue import load_task
task = load_task(Path({str(SPEC)!r}))
opts = runner.Options(timing="off", sandbox={sandboxed}, output_bytes={output_bytes}, timeout=60)
[r] = runner.grade([task], opts, {{task.task_id: {{"tinystats/stats.py": Path({str(source)!r})}}}})
print("RESULT " + json.dumps(r.to_dict()))
"""
    env = {**os.environ, "GRADER_SEED": secret, "GRADER_FORKSERVER": "0", "PYTHONPATH": str(paths.ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=paths.ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"the grading process failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT ") :])


def found(result: dict) -> str:
    """What the hostile code reported, from its failing test."""
    text = json.dumps(result)
    assert "HOSTILE" in text, f"the hostile code did not run: {result['verdict']}: {result['message'][:500]}"
    return text


SEED_HUNT = """
import glob as _glob, os as _os
_FOUND = ["env=" + str("GRADER_SEED" in _os.environ)]
_hits = []
for _p in ["/proc/self/environ", *_glob.glob("/proc/[0-9]*/environ"), *_glob.glob("/proc/[0-9]*/cmdline")]:
    try:
        _text = open(_p, "rb").read().decode(errors="replace")
    except OSError:
        continue
    if "sekrit-" in _text:
        _hits.append(_p + ":" + _text[_text.index("sekrit-"):][:40])
_FOUND += ["hits=" + ",".join(_hits), "pids=%d" % len(_glob.glob("/proc/[0-9]*"))]
"""


def test_scrubbed_env_keeps_the_toolchain_and_drops_every_secret() -> None:
    env = {
        "PATH": "/usr/bin",
        "CUDA_VISIBLE_DEVICES": "1",
        "LD_LIBRARY_PATH": "/usr/lib",
        "GRADER_SEED": "s",
        "GRADER_TIMEOUT": "9",
        "GITHUB_TOKEN": "t",
        "AWS_SECRET_ACCESS_KEY": "k",
        "SSH_AUTH_SOCK": "/tmp/a",
        "MY_PRIVATE_THING": "x",
        "TORCH_CUDA_ARCH_LIST": "9.0",
    }
    out = sandbox.scrubbed_env(env, "/scratch")
    assert {"PATH", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "GRADER_TIMEOUT", "TORCH_CUDA_ARCH_LIST"} <= set(out)
    assert not {"GRADER_SEED", "GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "SSH_AUTH_SOCK", "MY_PRIVATE_THING"} & set(out)
    assert out["HOME"] == out["TMPDIR"] == "/scratch"


def test_what_of_the_checkout_the_sandbox_hides() -> None:
    """The sandbox's view of the checkout (grader/tests/test_sandbox_secrets.py tries it for real):
    the task's imports and the labs' files, never the solutions, results, .git or .build."""
    root = paths.ROOT
    shown = sandbox.shown_entries(root)
    assert {"grader", "conftest.py", "pyproject.toml", "lab1"} <= shown and not {".git", ".build"} & shown
    for seen in ["grader/child/__main__.py", "lab1/03_saxpy.cu", "lab4/kiln/planner.py", "lab1/tests/test_03_saxpy.py"]:
        assert not sandbox.hidden(root / seen, shown, root), seen
    for secret in [
        "lab4/solutions/kiln/planner.py",
        "lab3/results/reference-bench.json",
        ".build/graded/lab1-03-0123456789abcdef/03_saxpy.cu",
        ".build/lab1/03_saxpy.student.0123456789abcdef.so",
        ".git/HEAD",
        "grade-results/alice/summary.md",
        "benchmarks/grade_class.py",
    ]:
        assert sandbox.hidden(root / secret, shown, root), secret
    assert not sandbox.hidden("/usr/include/stdio.h", shown, root)  # outside the checkout: not its business


def test_a_build_step_may_read_the_files_its_command_names(tmp_path: Path) -> None:
    source = tmp_path / "03 saxpy.cu"  # a space: the shell line quotes it
    source.write_text("")
    line = f"nvcc -O3 -I{tmp_path} -c '{source}' -o {tmp_path / 'missing.o'} > {tmp_path / 'log'} 2>&1"
    assert sandbox.named_files(["/bin/sh", "-c", line]) == ("/bin/sh", str(source))


@needs_namespaces
def test_the_probe_says_what_holds() -> None:
    held = sandbox.probe(sandbox.Policy(work=f"/tmp/grader-probe-{os.getpid()}"))
    text = " ".join(held)
    assert "no network" in text and "PID namespace" in text and "read-only" in text and "limits" in text
    assert "of the grader's checkout only" in text and "without their solutions" in text and "an empty /tmp" in text


@needs_namespaces
def test_the_secret_seed_is_out_of_reach() -> None:
    secret = f"sekrit-{uuid.uuid4().hex}"
    code = hostile("seed", SEED_HUNT)
    control = found(grade(code, secret, sandboxed=False))
    assert secret in control, "the hunt should find the seed in the unsandboxed grader's /proc/PID/environ"
    result = grade(code, secret, sandboxed=True)
    text = found(result)
    assert secret not in text and "env=False" in text and "hits=" in text
    pids = int(text.split("pids=")[1].split('"')[0].split()[0].rstrip("|\\n"))
    assert pids <= 3, f"{pids} processes visible: the sandbox should show its own only"
    assert any("PID namespace" in h for h in result["sandbox"])


@needs_namespaces
def test_writes_outside_the_scratch_folder_are_refused() -> None:
    tag = uuid.uuid4().hex
    home = Path.home()
    targets = [paths.ROOT / "grader" / "__init__.py", paths.ROOT / f"PWNED-{tag}", Path(f"/tmp/PWNED-{tag}")]
    targets.append(home / f"PWNED-{tag}")
    before = (paths.ROOT / "grader" / "__init__.py").read_bytes()
    code = f"""
_FOUND = []
for _p in {[str(t) for t in targets]!r}:
    try:
        with open(_p, "a") as _f:
            _f.write("# pwned\\n")
        _FOUND.append("WRO" + "TE " + _p)  # spelt apart: a traceback quotes this line
    except OSError as _e:
        _FOUND.append("REFU" + "SED " + _p + ": " + type(_e).__name__)
"""
    text = found(grade(hostile(f"write-{tag[:6]}", code), "s", sandboxed=True))
    assert "WROTE" not in text and all(f"REFUSED {t}" in text for t in targets)
    assert (paths.ROOT / "grader" / "__init__.py").read_bytes() == before
    assert not any(t.exists() for t in targets[1:])


@needs_namespaces
def test_a_process_left_behind_dies_with_its_task() -> None:
    tag = f"outlive-{uuid.uuid4().hex}"
    code = f"""
import subprocess as _sp, sys as _sys, os as _os
_sp.Popen([_sys.executable, "-c", "import time; time.sleep(120)", {tag!r}], start_new_session=True)
if _os.fork() == 0:  # a double-forked daemon, in a session of its own
    _os.setsid()
    if _os.fork() == 0:
        _os.execv(_sys.executable, [_sys.executable, "-c", "import time; time.sleep(120)", {tag!r}])
    _os._exit(0)
_FOUND = ["left two behind"]
"""
    try:
        found(grade(hostile("outlive", code), "s", sandboxed=True))
        deadline = time.time() + 10
        while processes_with(tag) and time.time() < deadline:
            time.sleep(0.2)
        assert not processes_with(tag), "a process the task left behind is still running"
    finally:
        for pid in processes_with(tag):
            os.kill(pid, 9)


FORGE = """
import json as _json, os as _os, stat as _stat, sys as _sys
_fake = _json.dumps({"verdict": "pass", "phase": "done", "message": "", "cases": [], "timings": [], "tests": []})
print("RESULT " + _fake)
print("PASSED 100/100")
_n = 0
for _fd in range(3, 64):
    try:
        if _stat.S_ISFIFO(_os.fstat(_fd).st_mode):
            _os.write(_fd, ("0" * 64 + " " + _fake + "\\n").encode())
            _n += 1
    except OSError:
        pass
_FOUND = ["forged on %d pipes" % _n]
"""


@pytest.mark.parametrize("sandboxed", [False, True], ids=["plain", "sandboxed"])
def test_a_forged_report_achieves_nothing(sandboxed: bool) -> None:
    if sandboxed and NO_SANDBOX:
        pytest.skip(f"the sandbox cannot hold here: {NO_SANDBOX}")
    result = grade(hostile("forge", FORGE), "s", sandboxed=sandboxed)
    text = found(result)
    assert result["verdict"] == "wrong"  # its mean() fails: no forged line changes that
    assert result["points"] < result["max_points"]
    assert "forged on 0 pipes" not in text  # it did find the report pipe, and wrote to it
    assert any("did not carry the task process's key" in n for n in result["notes"])


@needs_namespaces
def test_the_fork_servers_children_are_sandboxed_too(forkserver_on: list[int], monkeypatch) -> None:
    from grader.parent import runner
    from grader.tasks.catalogue import load_task

    secret = f"sekrit-{uuid.uuid4().hex}"
    monkeypatch.setenv("GRADER_SEED", secret)
    task = load_task(SPEC)
    opts = runner.Options(timing="off", sandbox=True, timeout=60)
    override = {task.task_id: {"tinystats/stats.py": hostile("seed", SEED_HUNT)}}
    [r] = runner.grade([task], opts, override)
    text = found(r.to_dict())
    assert forkserver_on, "the task process did not come from the fork server"
    assert secret not in text and "env=False" in text
    assert any("PID namespace" in h for h in r.sandbox)


@needs_namespaces
def test_a_flood_of_output_is_stopped() -> None:
    code = """
import sys as _sys
_line = "x" * 1023 + "\\n"
while True:
    _sys.stdout.write(_line * 1024)
"""
    result = grade(hostile("flood", code), "s", sandboxed=True, output_bytes=8 << 20)
    assert result["verdict"] == "crash" and "more than the sandbox allows" in result["message"], result["message"]


@needs_namespaces
def test_the_network_is_out_of_reach() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        listener.setblocking(False)
        port = listener.getsockname()[1]
        code = f"""
import socket as _socket
_FOUND = []
for _addr in [("127.0.0.1", {port}), ("1.1.1.1", 53)]:
    try:
        _socket.create_connection(_addr, timeout=2).close()
        _FOUND.append("CONNEC" + "TED %s" % (_addr,))  # spelt apart: a traceback quotes this line
    except OSError as _e:
        _FOUND.append("no connection %s: %s" % (_addr, type(_e).__name__))
"""
        source = hostile(f"net-{port}", code)
        control = found(grade(source, "s", sandboxed=False))
        assert "CONNECTED ('127.0.0.1'" in control  # unsandboxed, it reaches the grader's machine
        listener.accept()[0].close()
        text = found(grade(source, "s", sandboxed=True))
        assert "CONNECTED" not in text and "no connection ('127.0.0.1'" in text
        with pytest.raises(BlockingIOError):
            listener.accept()
