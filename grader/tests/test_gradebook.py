"""Grading students' submissions with the instructor's grader: only the files they own count,
everything else they changed is listed and ignored; a folder of submissions becomes a gradebook
that resumes where it stopped. Runs on any machine (CUDA tasks are skipped without a GPU)."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from grader import cli, paths, toolchain
from grader.instructor import gradebook
from grader.instructor.submissions import SubmissionError, intake, owned_files
from grader.parent import runner
from grader.records import Verdict
from grader.tasks import catalogue

SAXPY = "lab1/03_saxpy.cu"
SPEC = "lab1/tests/test_03_saxpy.py"


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same outcome on every machine: what is graded here is the selection, not the kernels.
    GRADER_NO_GPU reaches the workers' processes too (and makes the batch's default one worker)."""
    monkeypatch.setattr(toolchain, "has_gpu", lambda: False)
    monkeypatch.setattr(toolchain, "gpus", lambda: ())  # cached by earlier tests on a GPU machine
    monkeypatch.setenv("GRADER_FORKSERVER", "0")
    monkeypatch.setenv("GRADER_NO_GPU", "1")


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
    graded = sub.overrides([task])["lab1/03"]["03_saxpy.cu"]  # a copy, made at intake
    assert graded != tmp_path / "ada" / SAXPY and graded.read_bytes() == (tmp_path / "ada" / SAXPY).read_bytes()
    # named by content: the same file in another submission is the same copy (its build is cached)
    other = intake(str(student_tree(tmp_path / "bob")), "bob", tmp_path / "scratch2")
    assert other.overrides([task])["lab1/03"]["03_saxpy.cu"] == graded


def test_a_symbolic_link_is_not_graded(tmp_path: Path) -> None:
    """A link could point at the instructor's solution or a secret the grader would read as root."""
    root = student_tree(tmp_path / "ada")
    secret = tmp_path / "instructor-solution.cu"
    secret.write_text("// the instructor's\n")
    (root / SAXPY).unlink()
    (root / SAXPY).symlink_to(secret)
    sub = intake(str(root), "ada", tmp_path / "scratch")
    assert SAXPY in sub.missing and SAXPY not in sub.owned
    assert any(line.startswith(f"{SAXPY} is a symbolic link") for line in sub.ignored)


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


def rows_of(out: Path) -> dict[str, dict[str, str]]:
    return {r["student"]: r for r in csv.DictReader((out / "gradebook.csv").open())}


def verdicts(out: Path, name: str) -> dict[str, tuple[str, float]]:
    graded = gradebook._load(out, name)
    assert graded is not None, name
    return {r.task_id: (str(r.verdict), r.points) for r in graded.results}


def test_workers_are_the_gpus_this_process_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    assert gradebook.worker_gpus() == []  # no GPU: one worker, in this process
    assert gradebook.worker_gpus(" 0, 1,") == ["0", "1"]
    with pytest.raises(ValueError, match="GPU ids"):
        gradebook.worker_gpus(",")
    two = (toolchain.Gpu("H100", "9.0", "550", 81559, "1980", "2619", "1980"),) * 2
    monkeypatch.setattr(toolchain, "gpus", lambda: two)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gradebook.worker_gpus() == ["0", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # what a scheduler gave this job
    assert gradebook.worker_gpus() == ["2", "3"]


def test_a_task_of_two_gpus_makes_every_worker_a_pair() -> None:
    assert gradebook.worker_groups(["0", "1", "2"], 1) == ["0", "1", "2"]  # one GPU a worker, as before
    assert gradebook.worker_groups(["0", "1", "2", "3"], 2) == ["0,1", "2,3"]
    # the odd one out stays idle: a worker of one GPU would skip what the others' students are graded on
    assert gradebook.worker_groups(["4", "5", "6"], 2) == ["4,5"]
    assert gradebook.worker_groups(["7"], 2) == ["7"]  # fewer than needed: one worker, the task skipped for all
    assert gradebook.worker_groups([], 2) == []
    tasks = catalogue.all_tasks(["lab1"])
    assert gradebook.gpus_needed(tasks) == 1
    assert gradebook.gpus_needed([*tasks, dataclasses.replace(tasks[0], gpus=4)]) == 4


def test_shards_split_the_class_and_share_one_gradebook(tmp_path: Path) -> None:
    subs, out = tmp_path / "subs", tmp_path / "out"
    for name in ("ada", "bob", "cy"):
        student_tree(subs / name)
    entries = gradebook.entries_of(subs)
    halves = [gradebook.shard_of(entries, (i, 2)) for i in range(2)]
    assert halves == [[subs / "ada", subs / "cy"], [subs / "bob"]]  # every other one, in the sorted order
    assert sorted(halves[0] + halves[1]) == entries  # together: each exactly once
    assert gradebook.parse_shard("1/4") == (1, 4)
    for bad in ("4/4", "1", "-1/2", "a/b", "0/0"):
        with pytest.raises(ValueError, match="not a shard"):
            gradebook.parse_shard(bad)
    with pytest.raises(SystemExit):
        cli.main(["gradebook", str(subs), "--shard", "2/2"])

    said: list[str] = []  # two shards, one after the other here, into one shared folder
    opts = runner.Options(timing="off")
    for i in range(2):
        assert gradebook.gradebook(subs, out, opts, said.append, gpus=[], shard=(i, 2)) == 0
    grading = [s.split("] ")[1].removesuffix(": grading") for s in said if s.endswith(": grading")]
    assert grading == ["ada", "cy", "bob"]
    assert set(rows_of(out)) == {"ada", "bob", "cy", "(maximum)"}  # the last shard's book has everyone's
    assert json.loads((out / "throughput-shard1of2.json").read_text())["submissions"] == 1
    said.clear()
    assert gradebook.gradebook(subs, out, opts, said.append, only="bob", gpus=[], shard=(0, 2)) == 0
    assert said == ["bob is graded by another shard, not this one"]


def test_collect_rebuilds_the_gradebook_the_batch_wrote(tmp_path: Path) -> None:
    subs, out = tmp_path / "subs", tmp_path / "out"
    student_tree(subs / "ada", cheat=True)
    student_tree(subs / "bob")
    (subs / "eve.zip").write_bytes(b"broken")
    assert gradebook.gradebook(subs, out, runner.Options(timing="off"), [].append) == 1
    written = (out / "gradebook.csv").read_text()
    (out / "gradebook.csv").unlink()
    assert cli.main(["gradebook", str(subs), "--out", str(out), "--collect"]) == 1  # eve has no grade
    assert (out / "gradebook.csv").read_text() == written
    assert "cannot unpack" in (out / "eve" / "error.txt").read_text()


def test_slurm_writes_an_array_job_and_grades_nothing(tmp_path: Path) -> None:
    subs, out = tmp_path / "subs", tmp_path / "out"
    student_tree(subs / "ada")
    student_tree(subs / "bob")
    assert cli.main(["gradebook", str(subs), "--out", str(out), "--slurm", "4", "--timing", "off"]) == 0
    job = out / "grade.sbatch"
    script = job.read_text()
    need = gradebook.gpus_needed(catalogue.all_tasks())  # 2 once lab 6's peer-memory task is in the course
    assert "#SBATCH --array=0-3\n" in script and f"#SBATCH --gres=gpu:{need}\n" in script
    assert f"#SBATCH --output={out.absolute()}/slurm-%A_%a.log" in script
    assert f"cd {paths.ROOT}" in script and paths.ROOT.is_absolute()
    assert f"{sys.executable} -m grader gradebook {subs.absolute()} --out {out.absolute()}" in script
    assert '--shard "$SLURM_ARRAY_TASK_ID/4" --gpus all --timing off' in script
    assert [p.name for p in out.iterdir()] == ["grade.sbatch"]  # nothing graded
    # what one array task runs: shard 1 of 4 is bob (the second entry)
    env = {**os.environ, "SLURM_ARRAY_TASK_ID": "1"}
    run = subprocess.run(["bash", str(job)], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (out / "bob" / "results.json").exists() and not (out / "ada").exists()


def test_one_worker_per_gpu_grades_as_one_worker_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRADER_NO_GPU", "1")  # the workers' processes, on this machine, see no GPU either
    subs, one, two = tmp_path / "subs", tmp_path / "one", tmp_path / "two"
    student_tree(subs / "ada", cheat=True)
    student_tree(subs / "bob")
    cy = student_tree(subs / "cy")
    end = "    // TODO(lab1/03) end"
    (cy / SAXPY).write_text((cy / SAXPY).read_text().replace(end, "    int i = 0;\n" + end, 1))  # started: skipped here
    opts = runner.Options(timing="off")
    assert gradebook.gradebook(subs, one, opts, [].append, gpus=[]) == 0
    said: list[str] = []
    # two workers: of one GPU each, or of a pair each where a task of the course needs two (lab 6's)
    need = gradebook.gpus_needed(catalogue.all_tasks())
    ids = [str(i) for i in range(2 * need)]
    first, second = gradebook.worker_groups(ids, need)
    assert gradebook.gradebook(subs, two, opts, said.append, gpus=ids) == 0
    assert (two / "gradebook.csv").read_text() == (one / "gradebook.csv").read_text()
    for name in ("ada", "bob", "cy"):
        assert verdicts(two, name) == verdicts(one, name)
        assert (two / name / "grading.log").exists() and not (one / name / "grading.log").exists()
    assert verdicts(two, "cy")["lab1/03"] != verdicts(two, "bob")["lab1/03"]
    assert said[1 if need > 1 else 0 :][:2] == [f"ada: grading on GPU {first}", f"bob: grading on GPU {second}"]
    assert sum(" on GPU " in s and s.endswith(" s)") for s in said) == 3  # "[1/3] ada on GPU 0: 0 points (0.9 s)"
    assert any(s.startswith("graded 3 submissions in ") and f" on {2 * need} GPUs (" in s for s in said)
    throughput = json.loads((two / "throughput.json").read_text())
    assert set(throughput) == {"submissions", "seconds", "gpus", "per_hour"}
    assert throughput["submissions"] == 3 and throughput["gpus"] == 2 * need and throughput["per_hour"] > 0


def test_a_worker_that_fails_is_reported_and_the_others_go_on(tmp_path: Path) -> None:
    subs, out = tmp_path / "subs", tmp_path / "out"
    student_tree(subs / "bob")
    student_tree(subs / "eve")
    opts = runner.Options(timing="off")
    assert gradebook.gradebook(subs, out, opts, [].append, gpus=[]) == 0
    shutil.rmtree(subs / "eve")  # eve hands in a broken archive instead: her earlier grade must go
    (subs / "eve.zip").write_bytes(b"broken")
    said: list[str] = []
    ids = [str(i) for i in range(2 * gradebook.gpus_needed(catalogue.all_tasks()))]  # two workers
    assert gradebook.gradebook(subs, out, opts, said.append, fresh=True, gpus=ids) == 1
    failed = next(s for s in said if "eve on GPU" in s)
    assert "cannot be graded (exit 2)" in failed and "cannot unpack" in failed  # the end of her grading.log
    assert "cannot unpack" in (out / "eve" / "error.txt").read_text()
    assert not (out / "eve" / "results.json").exists()
    assert any("bob on GPU" in s and "points" in s for s in said)
    assert set(rows_of(out)) == {"bob", "(maximum)"}
