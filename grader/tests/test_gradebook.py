"""Grading students' submissions with the instructor's grader: only the files they own count,
everything else they changed is listed and ignored; a folder of submissions becomes a gradebook
that resumes where it stopped. Runs on any machine (CUDA tasks are skipped without a GPU)."""

from __future__ import annotations

import csv
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from grader import paths, toolchain
from grader.instructor import gradebook
from grader.instructor.submissions import SubmissionError, intake, owned_files
from grader.parent import runner
from grader.records import Verdict
from grader.tasks import catalogue

SAXPY = "lab1/03_saxpy.cu"
SPEC = "lab1/tests/test_03_saxpy.py"


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same outcome on every machine: what is graded here is the selection, not the kernels."""
    monkeypatch.setattr(toolchain, "has_gpu", lambda: False)
    monkeypatch.setenv("GRADER_FORKSERVER", "0")


def student_tree(dest: Path, solve_saxpy: bool = False, cheat: bool = False) -> Path:
    """A student's checkout: the course's files as they are, saxpy solved or not, tests tampered or not."""
    for rel in [*sorted(owned_files()), SPEC, "Makefile"]:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(paths.ROOT / rel, dest / rel)
    solution = paths.ROOT / "lab1" / "solutions" / "03_saxpy.cu"
    if solve_saxpy:
        if not solution.exists():
            pytest.skip("no reference solutions here (a student release)")
        shutil.copy(solution, dest / SAXPY)
    if cheat:  # a test that passes whatever the kernel does, and a file of their own
        (dest / SPEC).write_text("def test_saxpy():\n    pass\n")
        (dest / "notes.txt").write_text("hi\n")
    return dest


def test_only_the_files_the_student_owns_are_taken(tmp_path: Path) -> None:
    sub = intake(str(student_tree(tmp_path / "ada", cheat=True)), "ada", tmp_path / "scratch")
    assert set(sub.owned) == owned_files() and not sub.missing
    assert f"changed {SPEC}: ignored" in sub.ignored and "added notes.txt: ignored" in sub.ignored
    assert "changed Makefile: ignored" not in sub.ignored  # unchanged files are not news
    task = next(t for t in catalogue.all_tasks(["lab1"]) if t.number == "03")
    assert sub.overrides([task]) == {"lab1/03": {"03_saxpy.cu": tmp_path / "ada" / SAXPY}}


def test_the_digest_names_exactly_what_is_graded(tmp_path: Path) -> None:
    root = student_tree(tmp_path / "ada")
    first = intake(str(root), "ada", tmp_path / "s1").digest
    (root / SPEC).write_text("# tampered\n")  # not theirs: the same files are graded
    assert intake(str(root), "ada", tmp_path / "s2").digest == first
    (root / SAXPY).write_text((root / SAXPY).read_text() + "// an edit\n")
    assert intake(str(root), "ada", tmp_path / "s3").digest != first


def test_archives_and_git_repositories_are_read_alike(tmp_path: Path) -> None:
    root = student_tree(tmp_path / "src" / "ada-main")
    zipped = tmp_path / "ada.zip"
    with zipfile.ZipFile(zipped, "w") as z:
        for p in root.rglob("*"):
            z.write(p, p.relative_to(root.parent))  # one top folder, as GitHub's archives have
    tarred = tmp_path / "ada.tar.gz"
    with tarfile.open(tarred, "w:gz") as tar:
        tar.add(root, arcname=".")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(root)]
    subprocess.run([*git[:5], "init", "-q", str(root)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "work"], check=True)
    digests = set()
    for i, origin in enumerate([str(root), str(zipped), str(tarred), root.as_uri()]):
        sub = intake(origin, "ada", tmp_path / f"scratch{i}")
        assert not sub.missing, (origin, sub.missing)
        digests.add(sub.digest)
    assert len(digests) == 1
    assert len(intake(root.as_uri(), "ada", tmp_path / "scratch9").commit) == 40


def test_unreadable_submissions_say_why(tmp_path: Path) -> None:
    bad = tmp_path / "bob.zip"
    bad.write_bytes(b"not a zip")
    with pytest.raises(SubmissionError, match="cannot unpack"):
        intake(str(bad), "bob", tmp_path / "s")
    with pytest.raises(SubmissionError, match="does not exist"):
        intake(str(tmp_path / "nobody"), "nobody", tmp_path / "s2")


def test_a_gradebook_grades_resumes_and_regrades_one(tmp_path: Path) -> None:
    subs, out = tmp_path / "subs", tmp_path / "out"
    student_tree(subs / "ada", solve_saxpy=True, cheat=True)
    student_tree(subs / "bob")
    (subs / "eve.zip").write_bytes(b"broken")
    said: list[str] = []
    opts = runner.Options(timing="off")
    assert gradebook.gradebook(subs, out, opts, said.append) == 1  # eve could not be read; the batch went on
    rows = {r["student"]: r for r in csv.DictReader((out / "gradebook.csv").open())}
    assert set(rows) == {"ada", "bob", "(maximum)"} and "lab1/03" in rows["ada"] and "lab1" in rows["ada"]
    assert any("eve: cannot be graded" in s for s in said)
    ada = (out / "ada" / "summary.md").read_text()
    assert f"changed {SPEC}: ignored" in ada and "files taken hash to" in ada
    results = gradebook._load(out, "ada")
    assert results is not None
    saxpy = next(r for r in results.results if r.task_id == "lab1/03")
    assert saxpy.verdict == Verdict.SKIPPED  # built with the instructor's spec, not the tampered test
    bob = next(r for r in gradebook._load(out, "bob").results if r.task_id == "lab1/03")  # type: ignore[union-attr]
    assert bob.verdict == Verdict.NOT_STARTED

    said.clear()  # a second run keeps what did not change
    gradebook.gradebook(subs, out, opts, said.append)
    assert sum("unchanged since it was graded, kept" in s for s in said) == 2

    said.clear()  # a changed submission is graded again; --only regrades one student
    (subs / "bob" / SAXPY).write_text((subs / "bob" / SAXPY).read_text() + "// started\n")
    gradebook.gradebook(subs, out, opts, said.append)
    assert any("bob: grading" in s for s in said) and any("ada: unchanged" in s for s in said)
    said.clear()
    assert gradebook.gradebook(subs, out, opts, said.append, only="ada") == 0
    assert any("ada: grading" in s for s in said) and not any("bob" in s for s in said)
    rows = {r["student"]: r for r in csv.DictReader((out / "gradebook.csv").open())}
    assert set(rows) == {"ada", "bob", "(maximum)"}  # the others stay in the book
