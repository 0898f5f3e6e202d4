"""Checks on the source text that need no compiler: not-started detection and rules."""

from __future__ import annotations

import re
from dataclasses import dataclass

from grader.records import Verdict
from grader.tasks.regions import RegionError, find_regions, is_untouched, not_started
from grader.tasks.spec import Task

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_STRING = re.compile(r'"(?:\\.|[^"\\\n])*"')


def _blank(match: re.Match[str]) -> str:
    return "\n" * match.group(0).count("\n") or " "  # keeps line numbers right


def strip_comments(source: str) -> str:
    """Source without comments or string contents, so a mention in prose breaks no rule."""
    return _COMMENT.sub(_blank, _STRING.sub('""', source))


@dataclass
class StaticOutcome:
    verdict: Verdict | None  # None: nothing stops the task here
    message: str
    notes: list[str]


def check_source(task: Task, source: str, where: str) -> StaticOutcome:
    try:
        regions = find_regions(source, where)
    except RegionError as e:
        return StaticOutcome(Verdict.RULE, f"{e} (restore the TODO markers from the skeleton)", [])
    if regions and not_started(source, where):
        return StaticOutcome(
            Verdict.NOT_STARTED,
            f"every TODO({task.task_id}) region in {where} is still empty: write your code between "
            f"the `begin` and `end` lines",
            [],
        )
    notes = [
        f"{where}:{r.begin_line}: TODO({r.tag}) region is still untouched ({r.hint})"
        for r in regions
        if is_untouched(r)
    ]
    code = _COMMENT.sub(_blank, source)
    code_no_strings = strip_comments(source)
    for rule in task.rules:
        # includes live inside <> or "", so the library rule reads the comment-free code as is
        text = code if "include" in rule.pattern else code_no_strings
        found = re.search(rule.pattern, text)
        if rule.kind == "forbid" and found:
            line = text[: found.start()].count("\n") + 1
            return StaticOutcome(Verdict.RULE, f"{where}:{line}: `{found.group(0).strip()}`: {rule.why}", notes)
        if rule.kind == "require" and not found:
            return StaticOutcome(Verdict.RULE, f"{where}: {rule.why}", notes)
    return StaticOutcome(None, "", notes)
