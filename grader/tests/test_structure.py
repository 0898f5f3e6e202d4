"""The grader's architecture, held by tests: which process's code may import which."""

from __future__ import annotations

import ast
from pathlib import Path

from grader import paths

GRADER = paths.ROOT / "grader"


def imported(path: Path) -> list[tuple[int, str]]:
    """Every module `path` imports, at any depth (a function's own imports too), with its line."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_grading_process_never_imports_the_task_process_code() -> None:
    """grader/parent runs in the grading process, grader/child in the task process where student
    code runs: the parent starts children by module name and reads their records, never their code."""
    bad = [
        f"{paths.rel(f)}:{line} imports {name}"
        for f in sorted((GRADER / "parent").rglob("*.py"))
        for line, name in imported(f)
        if under(name, "grader.child")
    ]
    assert not bad, "\n".join(bad)


def test_the_labs_build_through_the_public_build_function() -> None:
    """Lab code outside the tests builds CUDA with grader.build.shared_library (and reads its
    libraries' error codes with cuda_error_string), not the build's internals, which change with
    the grader."""
    labs = [f for lab in paths.labs() for f in sorted(lab.rglob("*.py")) if "tests" not in f.parts]
    bad = [
        f"{paths.rel(f)}:{line} imports {name}"
        for f in labs
        for line, name in imported(f)
        if under(name, "grader.build")
        and name
        not in (
            "grader.build",
            "grader.build.BuildError",
            "grader.build.shared_library",
            "grader.build.cuda_error_string",
        )
    ]
    assert not bad, "\n".join(bad)


def test_the_imports_checks_see_imports_inside_functions(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from grader.child.__main__ import main\n")
    assert (2, "grader.child.__main__.main") in imported(f)
