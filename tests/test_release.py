"""`make release` exports a student tree without solutions, and that tree's own checks pass."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from grader import paths
from grader.instructor import release, skeletons


@pytest.mark.skipif(
    not skeletons.pairs() or not (paths.ROOT / ".git").exists(),
    reason="needs the instructor repository (git checkout with solutions)",
)
def release_sensitive() -> list[str]:
    """The test files, the grader's and the course's, that read what a release leaves out
    (solutions, benchmarks, git): only they can behave differently in a student tree; the rest run
    on the same code here. The README commands' check looks for the files the commands name."""
    found = [
        str(f.relative_to(paths.ROOT))
        for here in (paths.ROOT / "grader" / "tests", paths.ROOT / "tests")
        for f in sorted(here.glob("test_*.py"))
        if re.search(r"solutions|benchmarks|\.git\b", f.read_text())
    ]
    return [*found, "tests/test_readme_commands.py"]


def test_release_has_no_solutions_and_passes_its_checks(tmp_path):
    dest = tmp_path / "student"
    out = subprocess.run(
        [sys.executable, "-m", "grader", "release", str(dest)], cwd=paths.ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert not list(dest.glob("lab*/**/solutions")), "solutions leaked into the release"
    assert not (dest / "benchmarks").exists()
    assert (dest / "lab1" / "01_vector_add.cu").exists() and (dest / "Makefile").exists()
    if (paths.ROOT / ".build").exists():
        # a head start only (a build missing there is built again): under make check's workers
        # another test may be building here now, so its work folders stay behind, and a file that
        # goes while it is copied is left out
        try:
            shutil.copytree(
                paths.ROOT / ".build",
                dest / ".build",
                dirs_exist_ok=True,
                ignore=shutil.ignore_patterns("*.work[0-9]*", "build-*.ninja", "*.json.[0-9]*", "*.log.[0-9]*"),
            )
        except shutil.Error:
            pass
    # COURSE_RELEASE_CHECK: of those files, only the tests that read what a release leaves out
    # (conftest.py says how it tells); the others ran on the same code in this checkout
    env = {**os.environ, "GRADER_NO_GPU": "1", "COURSE_RELEASE_CHECK": "1"}
    check = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *release_sensitive(),
            "-q",
            "-p",
            "no:cacheprovider",
            "-k",
            "not release and not forkserver",
        ],
        cwd=dest,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert check.returncode == 0, check.stdout[-3000:]


needs_git = pytest.mark.skipif(not (paths.ROOT / ".git").exists(), reason="needs the instructors' git checkout")


@needs_git
def test_release_carries_the_grading_workflow_pinned_to_this_commit(tmp_path):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=paths.ROOT, capture_output=True, text=True).stdout.strip()
    out = release.release(tmp_path / "student", grader_repo="course-staff/cuda-course")
    text = (tmp_path / "student" / release.WORKFLOW).read_text()
    assert release.WORKFLOW in out.files and len(out) == len(out.files)
    assert "@@" not in text, "a placeholder was left in grade.yml"
    ref = re.search(r'GRADER_REF: "([^"]*)"', text).group(1)
    assert re.fullmatch(r"[0-9a-f]{40}", ref) and ref == head == out.grader_ref
    assert 'GRADER_REPO: "course-staff/cuda-course"' in text and out.grader_repo == "course-staff/cuda-course"
    assert not (tmp_path / "student" / ".github" / "workflows" / "gpu.yml").exists()  # the course's own CI stays home
    assert not list((tmp_path / "student").glob("lab*/**/solutions"))


@needs_git
def test_release_names_origin_or_says_it_could_not(tmp_path, monkeypatch):
    real = release._git

    def no_remote(*args: str) -> str | None:
        return None if args[:1] == ("remote",) else real(*args)

    monkeypatch.setattr(release, "_git", no_remote)
    out = release.release(tmp_path / "a")
    assert out.grader_repo == release.PLACEHOLDER_REPO and any("origin" in n for n in out.notes)
    text = (tmp_path / "a" / release.WORKFLOW).read_text()
    assert f'GRADER_REPO: "{release.PLACEHOLDER_REPO}"' in text and "@@" not in text

    monkeypatch.setattr(
        release, "_git", lambda *a: "git@github.com:course-staff/cuda-course.git" if a[:1] == ("remote",) else real(*a)
    )
    assert release.release(tmp_path / "b").grader_repo == "course-staff/cuda-course"


def test_remote_urls_become_owner_and_name():
    for url in (
        "https://github.com/o/n.git",
        "git@github.com:o/n.git",
        "ssh://git@github.com/o/n",
        "https://someone:ghp_secret@github.com/o/n/",
    ):
        assert release.github_repo(url) == "o/n", url
    assert release.github_repo("/srv/git/course.git") is None and release.github_repo("file:///srv/course") is None


def test_release_refuses_a_grader_repo_that_is_not_owner_and_name(tmp_path):
    with pytest.raises(ValueError, match="owner/name"):
        release.release(tmp_path / "c", grader_repo="https://github.com/o/n")
