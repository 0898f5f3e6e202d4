"""`make release DEST=dir`: the student tree, without reference solutions.

The tree also carries `.github/workflows/grade.yml` (from templates/grade.yml), the workflow that
grades each student's push on the course's GPU runner with the instructors' own grader at a
pinned commit: GRADER_REPO is the instructors' repository on GitHub (`owner/name`, from the
`origin` remote unless given), GRADER_REF the commit this repository is at (`git rev-parse HEAD`).
What the release could not pin is said in `Release.notes`, for the caller to show.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from grader import paths

# instructor-only: the labs' solutions, the benchmark that edits them, and CI that grades them.
# The grader's own fixture tasks (grader/tests/fixtures) stay: they are not course content.
EXCLUDE_FILES = {".github/workflows/gpu.yml"}

TEMPLATE = Path(__file__).parent / "templates" / "grade.yml"
WORKFLOW = Path(".github/workflows/grade.yml")  # where the release carries it
# what grade.yml names when the release cannot tell: the workflow refuses to grade with it
PLACEHOLDER_REPO = "OWNER/COURSE-INSTRUCTOR"
PLACEHOLDER_REF = "UNPINNED"
SHA_RE = re.compile(r"[0-9a-f]{40}")
REPO_RE = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")
# https://github.com/o/n(.git), git@github.com:o/n(.git), ssh://git@github.com/o/n, with or without credentials
_REMOTE_RE = re.compile(r"^(?:[a-z+]+://)?(?:[^@/]+@)?(?P<host>[^/:@]*\.[^/:@]+)[:/](?P<path>.+?)(?:\.git)?/?$")


@dataclass
class Release:
    """What `release` wrote: the files (repository-relative), the grader grade.yml pins, and
    notes for the instructor about anything that will not work as released."""

    files: list[Path]
    grader_repo: str
    grader_ref: str
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.files)

    def __iter__(self) -> Iterator[Path]:
        return iter(self.files)


def instructor_only(rel: Path) -> bool:
    lab_solution = rel.parts[0].startswith("lab") and "solutions" in rel.parts
    return lab_solution or rel.parts[0] == "benchmarks" or str(rel) in EXCLUDE_FILES


def tracked_files() -> list[Path]:
    """Files git tracks, plus new ones it does not ignore."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=paths.ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return [Path(p) for p in out.stdout.split("\0") if p]


def _git(*args: str) -> str | None:
    """A git answer about this repository, or None when git has none (no remote, no commit)."""
    out = subprocess.run(["git", *args], cwd=paths.ROOT, capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def github_repo(url: str) -> str | None:
    """`owner/name` from a remote URL in any of git's spellings; None when it names no such pair.
    Credentials in the URL are dropped: the workflow must never carry them."""
    m = _REMOTE_RE.match(url.strip())
    if not m:
        return None
    parts = [p for p in m.group("path").split("/") if p]
    repo = "/".join(parts[-2:]) if len(parts) >= 2 else ""
    return repo if REPO_RE.fullmatch(repo) else None


def pinned_grader(grader_repo: str | None = None) -> tuple[str, str, list[str]]:
    """(GRADER_REPO, GRADER_REF, notes): which repository and commit grade the students' pushes.

    The commit is this repository's HEAD, so what grades is what the instructors last committed;
    the notes say when that is not what the release copies (uncommitted changes) or when GitHub
    cannot serve it (no remote, or a commit no remote branch holds)."""
    notes: list[str] = []
    repo = grader_repo
    if repo is None:
        url = _git("remote", "get-url", "origin")
        repo = github_repo(url) if url else None
        if repo is None:
            repo = PLACEHOLDER_REPO
            notes.append(
                f"this repository has no `origin` remote on GitHub, so {WORKFLOW} names {PLACEHOLDER_REPO} "
                "and refuses to grade: set GRADER_REPO in it to the repository that grades (owner/name)"
            )
        elif url and "github.com" not in url:
            notes.append(f"`origin` ({repo}) is not on github.com: check GRADER_REPO in {WORKFLOW}")
    ref = _git("rev-parse", "HEAD")
    if ref is None or not SHA_RE.fullmatch(ref):
        ref = PLACEHOLDER_REF
        notes.append(f"this repository has no commit, so {WORKFLOW} pins no grader and refuses to grade: commit first")
        return repo, ref, notes
    if _git("status", "--porcelain"):
        notes.append(
            f"uncommitted changes: the release copies them but the students are graded by the commit {ref[:12]}, "
            "which lacks them; commit, push and release again"
        )
    if repo != PLACEHOLDER_REPO and grader_repo is None and not _git("branch", "-r", "--contains", ref):
        notes.append(f"no remote branch holds {ref[:12]}: push it, or the workflow cannot check the grader out")
    return repo, ref, notes


def workflow(grader_repo: str, grader_ref: str) -> str:
    """grade.yml with the grader it pins filled in; no `@@` placeholder is left."""
    text = TEMPLATE.read_text().replace("@@GRADER_REPO@@", grader_repo).replace("@@GRADER_REF@@", grader_ref)
    left = re.findall(r"@@[A-Z_]+@@", text)
    if left:
        raise ValueError(f"{TEMPLATE} has placeholders release.py does not fill: {sorted(set(left))}")
    return text


def release(dest: Path, grader_repo: str | None = None) -> Release:
    """Writes the student tree into `dest` (a new, empty folder outside this repository), with the
    grading workflow pinned to this repository's HEAD in `grader_repo` (default: `origin`'s)."""
    dest = dest.resolve()
    if dest == paths.ROOT or paths.ROOT in dest.parents:
        raise ValueError(f"DEST must be outside the repository, not {dest}")
    if dest.exists() and any(dest.iterdir()):
        raise ValueError(f"{dest} exists and is not empty: choose a new folder")
    if grader_repo is not None and not REPO_RE.fullmatch(grader_repo):
        raise ValueError(f"the grader repository is written owner/name, not {grader_repo!r}")
    repo, ref, notes = pinned_grader(grader_repo)
    text = workflow(repo, ref)  # before copying: a broken template leaves no half-written release
    copied = []
    for rel in tracked_files():
        if instructor_only(rel) or rel == WORKFLOW:
            continue
        src = paths.ROOT / rel
        if not src.exists():
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
        copied.append(rel)
    (dest / WORKFLOW).parent.mkdir(parents=True, exist_ok=True)
    (dest / WORKFLOW).write_text(text)
    copied.append(WORKFLOW)
    return Release(copied, repo, ref, notes)
