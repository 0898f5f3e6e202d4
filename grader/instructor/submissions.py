"""A student's submission, graded by the instructor's own grader.

From a submission (a folder, a git repository or URL, a .zip or .tar.gz) only the files the
student owns are taken: the task files the catalogue lists (`labN/<source>` for every task's
`sources`). Everything else the submission changed (its tests, specs, conftest.py, Makefile, the
grader itself) is ignored and listed, so a student who edits a test cannot make it pass. What was
graded is named by its commit (for git) and a hash of the files taken.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from grader import paths
from grader.tasks import catalogue
from grader.tasks.spec import Task

# never compared: build outputs, environments, version control
SKIP_PARTS = {".git", ".venv", ".build", "__pycache__", ".pytest_cache", ".ruff_cache", "grade-results"}


class SubmissionError(ValueError):
    """The submission cannot be read (no such folder, a broken archive, a clone that failed)."""


@dataclass
class Submission:
    name: str  # the student, as the gradebook names them
    root: Path  # the submission's files, as unpacked
    origin: str  # what was given: a path, an archive or a git URL
    commit: str = ""  # for git: the commit graded
    owned: dict[str, Path] = field(default_factory=dict)  # repo-relative owned path -> file in the submission
    missing: list[str] = field(default_factory=list)  # owned files the submission lacks
    ignored: list[str] = field(default_factory=list)  # "changed lab1/tests/test_03_saxpy.py: ignored", ...

    @property
    def digest(self) -> str:
        """A hash of exactly what is graded: the owned files' paths and contents."""
        h = hashlib.sha256()
        for rel in sorted(self.owned):
            h.update(rel.encode() + b"\0" + self.owned[rel].read_bytes() + b"\0")
        return h.hexdigest()[:16]

    def overrides(self, tasks: list[Task]) -> dict[str, dict[str, Path]]:
        """Per task, which file stands for each of its sources (for runner.grade). A file the
        submission lacks stands as a path that does not exist: the task says so."""
        out: dict[str, dict[str, Path]] = {}
        for t in tasks:
            keys = {rel: owned_path(t, rel) for rel in t.sources}
            out[t.task_id] = {rel: self.owned.get(key, self.root / key) for rel, key in keys.items()}
        return out


def owned_path(task: Task, rel: str) -> str:
    """The repo-relative path of one of a task's student files, e.g. lab1/03_saxpy.cu."""
    return f"{task.lab}/{rel}"


def owned_files(tasks: list[Task] | None = None) -> set[str]:
    return {owned_path(t, rel) for t in tasks or catalogue.all_tasks() for rel in t.sources}


def unpack(origin: str, dest: Path) -> tuple[Path, str]:
    """The submission's files under `dest` (a folder is used where it is) and its git commit."""
    src = Path(origin)
    if src.is_dir():
        root = src.resolve()
    elif src.is_file() and src.suffix == ".zip":
        root = _extract(lambda: zipfile.ZipFile(src).extractall(dest), dest)
    elif src.is_file() and src.name.endswith((".tar.gz", ".tgz", ".tar")):
        root = _extract(lambda: _untar(src, dest), dest)
    elif "://" in origin or origin.endswith(".git") or origin.startswith("git@"):
        target = dest / "repo"
        out = subprocess.run(
            ["git", "clone", "--quiet", "--depth", "1", origin, str(target)], capture_output=True, text=True
        )
        if out.returncode != 0:
            raise SubmissionError(f"git clone {origin} failed: {out.stderr.strip().splitlines()[-1:]}")
        root = target
    else:
        raise SubmissionError(f"{origin}: not a folder, a .zip, a .tar.gz or a git URL")
    return root, _commit(root)


def _untar(src: Path, dest: Path) -> None:
    with tarfile.open(src) as tar:
        tar.extractall(dest, filter="data")  # no links out of dest, no device files


def _extract(do: object, dest: Path) -> Path:
    try:
        do()  # type: ignore[operator]
    except (OSError, zipfile.BadZipFile, tarfile.TarError) as e:
        raise SubmissionError(f"cannot unpack the archive: {e}") from None
    entries = [p for p in dest.iterdir() if p.name not in SKIP_PARTS]
    # an archive of one folder (repo-name/lab1/...) is that folder
    return entries[0] if len(entries) == 1 and entries[0].is_dir() and not entries[0].name.startswith("lab") else dest


def _commit(root: Path) -> str:
    if not (root / ".git").exists():
        return ""
    out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else ""


def _files(root: Path) -> set[str]:
    return {
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and not SKIP_PARTS & set(p.relative_to(root).parts)
    }


def intake(origin: str, name: str, scratch: Path) -> Submission:
    """Reads one submission: the owned files it has, the ones it lacks, and what else it changed."""
    if not (Path(origin).exists() or "://" in origin or origin.endswith(".git") or origin.startswith("git@")):
        raise SubmissionError(f"{origin} does not exist")
    scratch.mkdir(parents=True, exist_ok=True)
    root, commit = unpack(origin, scratch)
    sub = Submission(name=name, root=root, origin=origin, commit=commit)
    owned = owned_files()
    present = _files(root)
    # what is graded is a copy of each task's files, made here: the student's tree is never read
    # again, the sandbox's user can read the copies, and a folder named by their content keeps
    # the build cache warm for files many students share (say, an untouched task)
    for task in catalogue.all_tasks():
        keys = {owned_path(task, rel): rel for rel in task.sources}
        taken: dict[str, Path] = {}
        for key in keys:
            if key not in present:
                if key not in sub.missing:
                    sub.missing.append(key)
            elif _linked(root, key):
                if key not in sub.missing:
                    sub.missing.append(key)
                    sub.ignored.append(
                        f"{key} is a symbolic link (or lies under one): not graded, only plain files are"
                    )
            else:
                taken[key] = root / key
        h = hashlib.sha256()
        for key in sorted(taken):
            h.update(key.encode() + b"\0" + taken[key].read_bytes() + b"\0")
        folder = paths.BUILD / "graded" / f"{task.lab}-{task.number}-{h.hexdigest()[:16]}"
        for key, src in taken.items():
            dest = folder / keys[key]
            dest.parent.mkdir(parents=True, exist_ok=True)
            if not dest.exists():  # (several workers may copy the same file: each writes its own, then renames)
                tmp = dest.with_name(f".{dest.name}.{os.getpid()}")
                shutil.copyfile(src, tmp)
                os.chmod(tmp, 0o644)  # the sandbox's user reads it
                os.replace(tmp, dest)
            sub.owned[key] = dest
    sub.missing.sort()
    for rel in sorted(present - owned):
        mine = paths.ROOT / rel
        if not mine.is_file():
            sub.ignored.append(f"added {rel}: ignored")
        elif _linked(root, rel) or mine.read_bytes() != (root / rel).read_bytes():
            sub.ignored.append(f"changed {rel}: ignored")
    return sub


def _linked(root: Path, rel: str) -> bool:
    """Whether a path of the submission is, or passes through, a symbolic link: one could point
    at the instructor's solutions or at a secret, which the grader would then read as its own."""
    p = root
    for part in Path(rel).parts:
        p = p / part
        if p.is_symlink():
            return True
    return False


def clear(scratch: Path) -> None:
    shutil.rmtree(scratch, ignore_errors=True)
