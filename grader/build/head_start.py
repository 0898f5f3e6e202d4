"""Starts a lab's nvcc builds before pytest has started, so that the edit loop waits for the longer
of the two, not for both one after the other.

`make test-labN` runs this in the background, then pytest. pytest needs about half a second to
start and collect (its own imports, the task specs') before the grader builds anything, and the
build of one small task takes a second or more of nvcc; started first, the build is half done
when the grader asks for it. The units come from the last graded run of the lab (`.build/<lab>/
units.json`, written by the runner), so this process imports neither pytest nor the specs: the
files are read as they are now, and a unit whose files changed is built under its new key. The
grader then finds the build made, or waits for it to finish (nvcc.build_all locks each unit), and
never builds a unit twice. A task never graded before, a changed spec, or any failure here costs
nothing but the time pytest would have spent anyway: this process only ever builds, silently.

A PyTorch-extension task is built by cpp_extension in its task process, which starts after
pytest has, and would then spend half a second importing cpp_extension before ninja ran. Its last
run's build directory is remembered too (`.build/<lab>/extensions.json`), and ninja runs there at
once, under the lock the task process builds under: the edited kernel's file is recompiled and the
library linked while pytest starts, and the task process, which waits for that lock, finds the
library made and loads it as it is (grader/child/torch_ext.py).

    python -m grader.build.head_start lab1 [--task 03] [--solutions]
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import json
import subprocess
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

from grader import paths
from grader.build import nvcc
from grader.build.nvcc import BuildUnit

_TUPLES = ("sources", "flags", "libraries", "include_packages", "include_dirs")


def _record_file(lab: str) -> Path:
    return paths.BUILD / lab / "units.json"


def remember(lab: str, variant: str, units: Iterable[BuildUnit], arch: str) -> None:
    """Keeps, per task, the unit this run built for `variant` (student or solution) and the
    architecture the run built for: what the next head start of the lab builds."""
    file = _record_file(lab)
    try:
        known = json.loads(file.read_text())
    except (OSError, ValueError):
        known = {}
    for unit in units:
        entry = {k: [str(v) for v in getattr(unit, k)] if k in _TUPLES else getattr(unit, k) for k in _fields()}
        known[f"{unit.name} {variant}"] = {"unit": entry, "arch": arch}
    file.parent.mkdir(parents=True, exist_ok=True)
    paths.write_atomically(file, json.dumps(known, indent=1, sort_keys=True))


def _fields() -> list[str]:
    return [f.name for f in dataclasses.fields(BuildUnit)]


def recalled(lab: str, variant: str, task: str | None = None) -> list[tuple[BuildUnit, str]]:
    """The units `remember` kept for this lab and variant (one task's: `task` is 03 or lab1/03),
    with their architectures; none where the record is missing or unreadable."""
    try:
        known = json.loads(_record_file(lab).read_text())
        found = []
        for key, entry in known.items():
            name, kept_variant = key.rsplit(" ", 1)
            if kept_variant != variant or (task and name not in (task, f"{lab}/{task}")):
                continue
            fields = {
                k: tuple(map(Path, v)) if k in ("sources", "include_dirs") else v for k, v in entry["unit"].items()
            }
            fields.update({k: tuple(fields[k]) for k in _TUPLES})
            found.append((BuildUnit(**fields), entry["arch"]))
        return found
    except (OSError, ValueError, KeyError, TypeError):
        return []


def _extension_record(lab: str) -> Path:
    return paths.BUILD / lab / "extensions.json"


def extension_lock(build: Path) -> Path:
    """The lock a PyTorch-extension build directory is built under (flock, exclusive): the task
    process's cpp_extension.load and the head start's ninja never run there at once."""
    return build.with_name(build.name + ".lock")


def remember_extension(lab: str, variant: str, task_id: str, build: Path) -> None:
    """Keeps the build directory a PyTorch-extension task's run built in (student or solution):
    what the next head start of the lab runs ninja in."""
    file = _extension_record(lab)
    try:
        known = json.loads(file.read_text())
    except (OSError, ValueError):
        known = {}
    if known.get(f"{task_id} {variant}") == str(build):
        return
    known[f"{task_id} {variant}"] = str(build)
    file.parent.mkdir(parents=True, exist_ok=True)
    paths.write_atomically(file, json.dumps(known, indent=1, sort_keys=True))


def recalled_extensions(lab: str, variant: str, task: str | None = None) -> list[Path]:
    """The build directories `remember_extension` kept for this lab and variant (one task's, when
    `task` is given as 06 or lab3/06)."""
    try:
        known = json.loads(_extension_record(lab).read_text())
        found = []
        for key, build in known.items():
            name, kept_variant = key.rsplit(" ", 1)
            # a record copied from another checkout names its folders: never build there
            inside = Path(build).resolve().is_relative_to(paths.BUILD.resolve())
            if inside and kept_variant == variant and (not task or name in (task, f"{lab}/{task}")):
                found.append(Path(build))
        return found
    except (OSError, ValueError, AttributeError, TypeError):
        return []


def refresh_extension(build: Path) -> None:
    """ninja in a build directory cpp_extension wrote before (its build.ninja, whose commands name
    the sources by their paths): the files edited since are compiled again and the library linked,
    under the directory's lock. Silent: a failed compile is compiled again, and reported, by the
    task process's own build."""
    binary = nvcc.find_ninja()
    if binary is None or not (build / "build.ninja").is_file():
        return
    with open(extension_lock(build), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run([binary, "-C", str(build)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.build.head_start", description=__doc__.split("\n\n")[0])
    parser.add_argument("lab")
    parser.add_argument("--task")
    parser.add_argument("--solutions", action="store_true")
    args = parser.parse_args(argv)
    variant = "solution" if args.solutions else "student"
    extensions = [
        threading.Thread(target=refresh_extension, args=(build,))
        for build in recalled_extensions(args.lab, variant, args.task)
    ]
    for thread in extensions:
        thread.start()
    by_arch: dict[str, list[BuildUnit]] = {}
    for unit, arch in recalled(args.lab, variant, args.task):
        if all(s.exists() for s in unit.sources):
            by_arch.setdefault(arch, []).append(unit)
    for arch, units in by_arch.items():
        try:
            nvcc.build_all(units, arch=arch)
        except Exception:  # the grader builds again and reports whatever went wrong
            break
    for thread in extensions:
        thread.join()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
