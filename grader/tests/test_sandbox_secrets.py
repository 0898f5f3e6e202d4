"""The sandbox keeps the grader's secrets out of a submission's reach, tested with thieves.

A dishonest student's code, run inside `grader submission`, hunts for what the grader's checkout
holds beyond the task: the reference solutions (`labN/solutions`, the issue's lab 4 planner),
another student's graded copy (`.build/graded/`), the gradebook (`grade-results/`), the labs'
results and `.git`. One thief per task kind, each reporting what it read through a verdict:

- a Python module (the fixture task fixtures/92), which at import reads every target and walks
  PYTHONPATH and the grader's own checkout for them, as the issue's planner did;
- a notebook (fixtures/93), whose cell does the same;
- a CUDA library (lab 1's saxpy) that `#include`s the loot, so its build (nvcc, in the sandbox)
  reads it; and, on a GPU, one whose constructor reads the loot when the library loads;
- a PyTorch extension (fixtures/98, on the CPU), whose constructor reads the loot when it loads
  and whose build probes for it with `__has_include`.

Sandboxed, every read must fail with "No such file or directory", and the verdict says so. A
control without the sandbox (the Python module's, the CUDA build's; on a GPU, the loading
library's) shows that the same thief does read the loot, and each sandboxed report must show
that its thief ran and tried every target: no assertion passes because a thief never ran or
looked in the wrong place. The tests skip, with the reason, where the sandbox cannot hold (no
namespaces) or the tree has no solutions (a student release).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from grader import paths, toolchain
from grader.instructor.broken import materialize
from grader.records import Verdict
from grader.tests.test_sandbox import NO_SANDBOX

FIXTURES = Path(__file__).parent / "fixtures"
PYTHON_SPEC = FIXTURES / "python" / "tests" / "test_92_tinystats.py"
NOTEBOOK_SPEC = FIXTURES / "notebook" / "tests" / "test_93_running_mean.py"
EXT_SPEC = FIXTURES / "torch_ext" / "tests" / "test_98_scaled_add_cpu.py"
CUDA_SPEC = paths.ROOT / "lab1" / "tests" / "test_03_saxpy.py"
MISSING = "No such file or directory"

pytestmark = pytest.mark.skipif(bool(NO_SANDBOX), reason=f"the sandbox cannot hold here: {NO_SANDBOX}")


@pytest.fixture(scope="module")
def loot() -> Iterator[dict[str, Path]]:
    """What a thief wants, by name: files of the checkout, two of them planted by this test (another
    student's graded copy, a gradebook entry) and removed after it."""
    solution = paths.ROOT / "lab4" / "solutions" / "kiln" / "planner.py"
    if not solution.is_file():
        pytest.skip("this tree has no reference solutions (a student release): nothing to steal")
    tag = uuid.uuid4().hex[:12]
    graded = paths.BUILD / "graded"
    made_graded = not graded.exists()
    other = graded / f"lab1-03-thief{tag}" / "03_saxpy.cu"
    other.parent.mkdir(parents=True, exist_ok=True)
    other.write_text(f'// another student\'s saxpy\nstatic const char *other_student = "loot-{tag}";\n')
    results = paths.ROOT / "grade-results"
    made_results = not results.exists()
    gradebook = results / f"thief{tag}" / "summary.md"
    gradebook.parent.mkdir(parents=True)
    gradebook.write_text(f"# another student's grade: 97 of 100 (loot-{tag})\n")
    targets = {
        "solution": solution,  # the issue's theft
        "cuda-solution": paths.ROOT / "lab1" / "solutions" / "03_saxpy.cu",
        "other-student": other,
        "gradebook": gradebook,
        "lab-results": paths.ROOT / "lab3" / "results" / "reference-bench.json",
        "git": paths.ROOT / ".git" / "HEAD",
    }
    targets = {k: p for k, p in targets.items() if p.is_file()}  # a tree without .git: the rest still count
    try:
        yield targets
    finally:
        shutil.rmtree(other.parent, ignore_errors=True)
        if made_graded and not any(graded.iterdir()):  # (another run may have put copies there since)
            graded.rmdir()
        shutil.rmtree(results if made_results else gradebook.parent, ignore_errors=True)


# --- the thieves ---------------------------------------------------------------------------------


def python_thief(targets: dict[str, Path]) -> str:
    """Python that reads each target and hunts the checkout as the issue's planner did (through
    PYTHONPATH and the grader's own location); what it found goes into `_FOUND`."""
    paths_by_label = {k: str(p) for k, p in targets.items()}
    return f"""
import glob as _glob, hashlib as _hashlib, os as _os
_FOUND = []
for _label, _path in {paths_by_label!r}.items():
    try:
        with open(_path, "rb") as _f:
            _FOUND.append("STO" + "LE %s %s" % (_label, _hashlib.sha256(_f.read()).hexdigest()[:12]))
    except OSError as _e:
        _FOUND.append("not %s: %s" % (_label, _e.strerror))
import grader as _grader
_bases = [_p for _p in _os.environ.get("PYTHONPATH", "").split(_os.pathsep) if _p]
_bases.append(_os.path.dirname(_os.path.dirname(_os.path.abspath(_grader.__file__))))
_hits = set()
for _b in _bases:
    for _pattern in ("*/solutions/*", "*/solutions/*/*", ".build/graded/*/*", ".git/*", "grade-results/*/*",
                     "*/results/*"):
        _hits.update(_glob.glob(_os.path.join(_b, _pattern)))
_FOUND.append("hunted %d files" % len(_hits))
"""


def native_thief(targets: dict[str, Path]) -> str:
    """C++ that probes for each target at build time (__has_include) and reads it when its
    library loads (a constructor), then ends the task process: its output is the report."""
    probes = " || ".join(f'__has_include("{p}")' for p in targets.values())
    loot = ", ".join(f'{{"{k}", "{p}"}}' for k, p in targets.items())
    return f"""#include <cerrno>
#include <cstdio>
#include <cstring>
#include <unistd.h>
#if {probes}
#define THIEF_BUILD "the build saw the loot"
#else
#define THIEF_BUILD "the build saw nothing"
#endif
__attribute__((constructor)) static void thief_on_load() {{
    const char *loot[][2] = {{{loot}}};
    for (auto &l : loot) {{
        FILE *f = std::fopen(l[1], "rb");
        if (f) {{
            std::fprintf(stderr, "THIEF STO" "LE %s\\n", l[0]);
            std::fclose(f);
        }} else {{
            std::fprintf(stderr, "THIEF not %s: %s\\n", l[0], std::strerror(errno));
        }}
    }}
    std::fprintf(stderr, "THIEF %s\\n", THIEF_BUILD);
    std::fflush(stderr);
    _exit(97);  // not abort(): Python's fault handler would print over the report
}}
"""


def build_thief(targets: dict[str, Path]) -> str:
    """A CUDA source whose build fails either way, saying what it reached: `#error` when the
    preprocessor can see any target, else the include of another student's copy fails. (That
    include spells the path with a `/./`: GCC silently skips an `#include` of a path an earlier
    `__has_include` found missing, GCC bug 80753.)"""
    probes = " || ".join(f'__has_include("{p}")' for p in targets.values())
    other = targets["other-student"]
    return f"""#if {probes}
#error "THIEF: the build reached the grader's files"
#endif
#include "{other.parent}/./{other.name}"
"""


def thieves(targets: dict[str, Path], *, sandboxed: bool) -> dict[Path, dict[str, Path]]:
    """spec -> the thief's files, for every kind this machine can run. The controls are the Python
    module's (the same hunt the notebook's cell runs) and the CUDA build's; the extension's (a
    second cold build, a minute) is left out, since its sandboxed report shows that it ran and
    opened each target. The two runs' files lie apart, so neither reuses a library the other built."""
    run = "sandboxed" if sandboxed else "plain"
    report = """
def mean(xs: list[float]) -> float:  # noqa: F811 - the thief's report, as a failing test
    raise AssertionError("HOSTILE " + " | ".join(_FOUND))
"""
    anchor = "from tinystats.checks import require_nonempty\n"
    module = materialize(
        FIXTURES / "python" / "variants" / "pass.py",
        [(anchor, anchor + python_thief(targets)), ("    return best\n", "    return best\n" + report)],
        f"thief-python-{run}",
        "a thief: reads the grader's secrets at import",
    )
    saxpy = paths.ROOT / "lab1" / "solutions" / "03_saxpy.cu"
    course = '#include "course.h"\n'
    built = materialize(saxpy, [(course, course + build_thief(targets))], f"thief-build-{run}", "a thief at build time")
    jobs = {PYTHON_SPEC: {"tinystats/stats.py": module}, CUDA_SPEC: {"03_saxpy.cu": built}}
    if not sandboxed:
        return jobs
    cell = "result = running_mean(data)\n"
    raises = '\nraise RuntimeError("HOSTILE " + " | ".join(_FOUND))\n'
    jobs[NOTEBOOK_SPEC] = {
        "93_running_mean.ipynb": materialize(
            FIXTURES / "notebook" / "variants" / "pass.ipynb",
            [(cell, python_thief(targets) + raises + cell)],
            f"thief-notebook-{run}",
            "a thief: reads the grader's secrets in a cell",
        )
    }
    head = "#include <cstdint>\n"
    jobs[EXT_SPEC] = {
        "98_scaled_add_cpu.cpp": materialize(
            FIXTURES / "torch_ext" / "98_scaled_add_cpu.cpp",
            [(head, head + native_thief(targets))],
            f"thief-ext-{run}",
            "a thief: reads the grader's secrets when it loads",
        )
    }
    return jobs


def grade(jobs: dict[Path, dict[str, Path]], *, sandboxed: bool) -> dict[str, dict]:
    """Grades each spec with its thief's files in one grading process of its own (as a CI job
    does); task id -> its result as JSON."""
    files = {str(spec): {rel: str(path) for rel, path in given.items()} for spec, given in jobs.items()}
    script = f"""
import json
from pathlib import Path
from grader.parent import runner
from grader.tasks.catalogue import load_task
jobs = {files!r}
tasks = [load_task(Path(spec)) for spec in jobs]
overrides = {{t.task_id: {{k: Path(v) for k, v in jobs[t.spec_file].items()}} for t in tasks}}
opts = runner.Options(timing="off", sandbox={sandboxed})
for r in runner.grade(tasks, opts, overrides):
    print("RESULT " + json.dumps(r.to_dict()), flush=True)
"""
    env = {**os.environ, "GRADER_FORKSERVER": "0", "PYTHONPATH": str(paths.ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=paths.ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    results = [json.loads(line[len("RESULT ") :]) for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(results) == len(jobs), f"the grading process failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return {f"{r['lab']}/{r['number']}": r for r in results}


@pytest.fixture(scope="module")
def robbed(loot: dict[str, Path]) -> dict[str, dict]:
    return grade(thieves(loot, sandboxed=True), sandboxed=True)


@pytest.fixture(scope="module")
def unguarded(loot: dict[str, Path]) -> dict[str, dict]:
    return grade(thieves(loot, sandboxed=False), sandboxed=False)


def _report(result: dict) -> str:
    text = json.dumps(result)
    if result["verdict"] == "environment":  # this machine cannot run the kind at all (a notebook without nbclient)
        pytest.skip(f"this machine cannot grade the thief's kind: {result['message'][:300]}")
    assert "HOSTILE" in text, f"the thief did not run: {result['verdict']}: {result['message'][:800]}"
    return text


def _stolen_nothing(text: str, loot: dict[str, Path]) -> None:
    assert "STOLE" not in text, text[:2000]
    for label in loot:
        assert f"not {label}: {MISSING}" in text, f"{label}: {text[:2000]}"


# --- the tests -----------------------------------------------------------------------------------


def test_a_python_thief_reads_the_checkout_unsandboxed(unguarded: dict, loot: dict) -> None:
    text = _report(unguarded["fixtures/92"])
    for label in loot:
        assert f"STOLE {label} " in text, f"the control should read {label}: {text[:2000]}"
    assert "hunted 0 files" not in text


@pytest.mark.parametrize("task", ["fixtures/92", "fixtures/93"], ids=["python-module", "notebook"])
def test_a_python_thief_finds_nothing_in_the_sandbox(task: str, robbed: dict, loot: dict) -> None:
    result = robbed[task]
    text = _report(result)
    _stolen_nothing(text, loot)
    assert "hunted 0 files" in text  # the hunt through PYTHONPATH and the checkout came back empty
    assert result["verdict"] == Verdict.WRONG and MISSING in result["message"], result["message"]
    assert any("of the grader's checkout only" in h for h in result["sandbox"]), result["sandbox"]


def test_a_cuda_build_reaches_the_loot_unsandboxed(unguarded: dict) -> None:
    result = unguarded["lab1/03"]
    assert result["verdict"] == Verdict.COMPILE_ERROR and "THIEF" in result["message"], result["message"]


def test_a_cuda_build_in_the_sandbox_cannot_include_the_loot(robbed: dict, loot: dict) -> None:
    """nvcc runs in the sandbox: the preprocessor finds no target, and including another
    student's graded copy fails with the compiler's own words."""
    result = robbed["lab1/03"]
    message = result["message"]
    assert result["verdict"] == Verdict.COMPILE_ERROR and "THIEF" not in message, message
    assert MISSING in message and loot["other-student"].name in message, message


def test_a_torch_extension_that_reads_the_loot_when_it_loads_finds_nothing(robbed: dict, loot: dict) -> None:
    """Its build (in the task process) probes for every target, its constructor opens each; it
    then ends the process, so the verdict is a crash that quotes its report."""
    result = robbed["fixtures/98"]
    message = result["message"]
    assert result["verdict"] == Verdict.CRASH and "exit code 97" in message, message
    assert "THIEF the build saw nothing" in message and "STOLE" not in message, message
    for label in loot:
        assert f"THIEF not {label}: {MISSING}" in message, message


@pytest.mark.gpu
@pytest.mark.skipif(not toolchain.has_gpu(), reason="a CUDA library is loaded only on a GPU machine")
def test_a_cuda_library_that_reads_the_loot_when_it_loads_finds_nothing(loot: dict) -> None:
    saxpy = paths.ROOT / "lab1" / "solutions" / "03_saxpy.cu"
    course = '#include "course.h"\n'
    for sandboxed in (False, True):  # each its own file: a library built unsandboxed saw the loot
        edits = [(course, course + native_thief(loot))]
        lib = materialize(saxpy, edits, f"thief-load-{sandboxed}", "a thief when it loads")
        result = grade({CUDA_SPEC: {"03_saxpy.cu": lib}}, sandboxed=sandboxed)["lab1/03"]
        message = result["message"]
        assert result["verdict"] == Verdict.CRASH and "exit code 97" in message, message
        if not sandboxed:  # the control: the same library reads everything
            assert all(f"THIEF STOLE {label}" in message for label in loot), message
            assert "THIEF the build saw the loot" in message, message
            continue
        assert "THIEF the build saw nothing" in message and "STOLE" not in message, message
        for label in loot:
            assert f"THIEF not {label}: {MISSING}" in message, message
