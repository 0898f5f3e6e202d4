"""Instructor commands: python -m grader {verify,skeletons,release}."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grader.instructor import skeletons
from grader.tasks.regions import RegionError


def say(text: str) -> None:
    print(text, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m grader")
    sub = p.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("verify", help="every skeleton fails, every reference solution passes")
    v.add_argument("labs", nargs="*", help="e.g. lab1 (default: all)")
    s = sub.add_parser("skeletons", help="regenerate student files from labN/solutions/*.cu")
    s.add_argument("--check", action="store_true", help="only report files that differ")
    r = sub.add_parser("release", help="export a student tree without solutions")
    r.add_argument("dest", type=Path)
    a = p.parse_args(argv)

    if a.cmd == "verify":
        from grader.instructor.verify import verify

        return verify(a.labs, say)
    if a.cmd == "skeletons":
        try:
            if a.check:
                drift = skeletons.drifted()
                for f in drift:
                    say(f"{f} differs from its solution's skeleton: run `make skeletons`")
                return 1 if drift else 0
            for f in skeletons.write_all():
                say(f"wrote {f}")
            return 0
        except RegionError as e:
            say(f"error: {e}")
            return 1
    if a.cmd == "release":
        from grader.instructor.release import release

        try:
            copied = release(a.dest)
        except ValueError as e:
            say(f"error: {e}")
            return 2
        say(f"released {len(copied)} files to {a.dest} (no solutions); check it with: cd {a.dest} && make check")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
