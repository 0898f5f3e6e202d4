"""Fixture tasks (fixtures/<kind>/) are graded by the tests in this folder, never collected as
tests themselves; and a fork server of a test's own, for the tests that grade through one."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from grader import paths
from grader.parent import forkserver
from grader.parent.isolation import child_env

collect_ignore_glob = ["fixtures/*"]


@pytest.fixture
def forkserver_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """A fork server of our own (preloads included) on a scratch socket; yields the pids it forked."""
    sock = tmp_path / "fs.sock"
    monkeypatch.setattr(forkserver, "socket_path", lambda: sock)
    monkeypatch.setenv("GRADER_FORKSERVER", "1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "grader.child.forkserver", str(sock)], cwd=paths.ROOT, env=child_env()
    )
    forked: list[int] = []
    request = forkserver.request
    monkeypatch.setattr(forkserver, "request", lambda *a: forked.append(request(*a)) or forked[-1])
    try:
        deadline = time.time() + 120
        while not sock.exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert sock.exists(), "the fork server did not start"
        yield forked
    finally:
        proc.kill()
        proc.wait()
