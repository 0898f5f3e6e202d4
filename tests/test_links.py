"""Every relative link in the course's Markdown documents leads somewhere: to a file that exists
and, when it names one, to a heading of that file (GitHub's anchor rules). In a student release,
links to what the release leaves out on purpose (solutions, benchmarks, the course's GPU CI) may
lead nowhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from grader import paths
from grader.instructor.release import instructor_only

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def documents() -> list[Path]:
    def hidden(p: Path) -> bool:  # .venv, .build, .pytest_cache, ...
        return any(part.startswith(".") for part in p.relative_to(paths.ROOT).parts)

    return sorted(p for p in paths.ROOT.rglob("*.md") if not hidden(p))


def anchors(doc: Path) -> set[str]:
    """The anchors GitHub makes for a document's headings (and explicit <a id=...> / <a name=...>)."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    in_code = False
    for line in doc.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            found.update(re.findall(r'<a (?:id|name)="([^"]+)"', line))
            continue
        text = re.sub(r"[`*_]|<[^>]+>", "", line.lstrip("#").strip()).lower()
        slug = re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(paths.ROOT)))
def test_relative_links_resolve(doc: Path) -> None:
    broken = []
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)  # links inside code are not links
    for m in LINK.finditer(text):
        target = m.group(1) or m.group(2)
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        where, _, anchor = target.partition("#")
        dest = (doc.parent / where).resolve() if where else doc
        if not dest.exists():
            rel = Path(dest).relative_to(paths.ROOT) if paths.ROOT in dest.parents else None
            if rel is not None and instructor_only(rel):
                continue  # a student release leaves it out on purpose (make release)
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor in {dest.relative_to(paths.ROOT)}")
    assert not broken, f"{doc.relative_to(paths.ROOT)}: " + "; ".join(broken)
