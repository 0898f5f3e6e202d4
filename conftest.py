"""Loads the grader's pytest plugin for every test run in this repository, and, for the check of a
student release (tests/test_release.py), keeps only the tests that can behave differently there."""

from __future__ import annotations

import ast
import functools
import inspect
import os
import re
import textwrap

import pytest

pytest_plugins = ["grader.pytest_plugin"]

# What a student release leaves out. A test whose code, its fixtures' and marks', and the module's
# top-level names that they use, mention none of these runs the same code in the release as in
# this checkout, where make check has just run it; tests/test_readme_commands.py is always kept
# (it looks for the files the README's commands name).
RELEASE_SENSITIVE = re.compile(r"solutions|benchmarks|\.git\b|skeletons\.pairs|broken\.")
ALWAYS_IN_RELEASE_CHECK = ("tests/test_readme_commands.py",)
_RELEASE_CHECK = pytest.StashKey[bool]()


def _code(source: str) -> str:
    """`source` without its comments and docstrings: a test that only mentions, in prose, what a
    release leaves out (\"not under solutions/, so a release keeps it\") reads none of it."""
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return source  # a fragment ast cannot read: judged as written
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


@functools.cache
def _sensitive_names(module_file: str) -> frozenset[str]:
    """The module's top-level names (constants, helpers, marks) whose definitions mention what a
    release leaves out, directly or through another such name."""
    text = open(module_file, encoding="utf-8").read()
    defs: dict[str, str] = {}
    for node in ast.parse(text).body:
        segment = _code(ast.get_source_segment(text, node) or "")
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            defs[node.name] = segment
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        defs[n.id] = segment
    tainted = {name for name, src in defs.items() if RELEASE_SENSITIVE.search(src)}
    while True:
        more = {
            name
            for name, src in defs.items()
            if name not in tainted and any(re.search(rf"\b{re.escape(t)}\b", src) for t in tainted)
        }
        if not more:
            return frozenset(tainted)
        tainted |= more


def _reads_what_a_release_leaves_out(item: pytest.Item) -> bool:
    if item.nodeid.startswith(ALWAYS_IN_RELEASE_CHECK):
        return True
    parts = [getattr(item, "function", None)]
    info = getattr(item, "_fixtureinfo", None)
    for defs in info.name2fixturedefs.values() if info else ():
        parts += [d.func for d in defs]
    texts = [repr(m.args) + repr(m.kwargs) for m in item.iter_markers()]
    for part in parts:
        try:
            texts.append(_code(inspect.getsource(part)))
        except (OSError, TypeError):
            return True  # no source to read: keep the test
    module = getattr(getattr(item, "module", None), "__file__", None)
    names = _sensitive_names(module) if module else frozenset()
    return any(RELEASE_SENSITIVE.search(t) or any(re.search(rf"\b{re.escape(n)}\b", t) for n in names) for t in texts)


def pytest_configure(config: pytest.Config) -> None:
    # taken out of the environment at once: the runs of pytest that these tests start (a task
    # graded in a process of its own) select nothing of the kind
    config.stash[_RELEASE_CHECK] = os.environ.pop("COURSE_RELEASE_CHECK", "") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.stash.get(_RELEASE_CHECK, False):
        return
    keep = [i for i in items if _reads_what_a_release_leaves_out(i)]
    config.hook.pytest_deselected(items=[i for i in items if i not in keep])
    items[:] = keep
