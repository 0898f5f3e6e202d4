"""Points in the form GitHub Classroom's autograding reads, for the student release's CI.

The student release's workflow (grader/instructor/templates/grade.yml) ends with
`classroom-resources/autograding-grading-reporter@v1`, the step GitHub Classroom's own autograding
workflows end with. That action reads, for each id in its `runners` input, the environment
variable `<ID>_RESULTS` (the id upper-cased): base64 of a JSON object shaped like the `result`
output of the classroom grader actions (autograding-command-grader, autograding-io-grader):

    {"version": 1, "status": "pass" | "fail" | "error", "max_score": N,
     "tests": [{"name", "status", "score", "max_score", "message", "test_code", "filename",
                "line_no", "execution_time"}, ...]}

What the reporter does with it (its dist/main.js, the code `@v1` runs):
- the points: it adds up `tests[].score` and the top-level `max_score` of every runner whose
  `max_score` is not 0, and writes `Points <score>/<max>` as a notice annotation titled
  "Autograding complete" (and the pair as JSON, titled "Autograding report"): that annotation is
  what Classroom recorded. So `max_score` must be the total, and each test's `score` its points.
- the log: ✅ or ❌ and each test's `name` (` - line N` after it when `line_no` is not 0), then its
  `test_code` when set; a test whose status is "error" is logged by its `message` alone, so that
  message starts with the task's name here. Its table of points counts passed tests
  (passed / tests × max_score), not scores: the notice and the job summary are the points.
- the step fails when a runner's top-level `status` is "fail" (or else "error").
The `message` of a failed test is not in that log; it is kept for classroom.json and for readers
of the result that show it (the reporter's earlier versions did).

One test per task, named like `lab1/03 saxpy`, worth the course's points for it. A pass is
"pass"; a verdict that says nothing about the student's code (the machine lacks something, a bug
in the grader, the task could not run here) is "error", so nobody mistakes a broken runner for a
failing student; every other verdict is "fail". A failed task keeps the points it earned (a task
graded by tests earns those of the tests that passed).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from grader.records import TaskResult, Verdict

FILE = "classroom.json"
# the result is a step output and an environment variable: a long compiler error has no place there
MESSAGE_CHARS = 500
# verdicts that are not about the student's code: the runner or the course needs fixing
NOT_THE_STUDENTS = {Verdict.ENVIRONMENT, Verdict.GRADER_ERROR, Verdict.SKIPPED}
PERF_NOTE = "performance:"  # grader/parent/scoring.py's perf_report lines
PERF_NOTE_CHARS = 160


def status(verdict: Verdict) -> str:
    """The reporter's word for a verdict: pass, fail, or error (not about the student's code)."""
    if verdict == Verdict.PASS:
        return "pass"
    return "error" if verdict in NOT_THE_STUDENTS else "fail"


def _number(x: float) -> int | float:
    """Points as the reporter prints them: 10, not 10.0; 6.67, not 6.666666666666667."""
    x = round(float(x), 2)
    return int(x) if x.is_integer() else x


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def message(r: TaskResult) -> str:
    """The verdict, the first line of the grader's message, and the short performance notes: enough
    to see what happened in the log; the whole report is in the job summary and the artifact."""
    text = str(r.verdict)
    first = _first_line(r.message)
    if first:
        text += f": {first}"
    perf = [n for n in r.notes if n.startswith(PERF_NOTE) and len(n) <= PERF_NOTE_CHARS]
    if perf:
        text += " (" + "; ".join(perf) + ")"
    if status(r.verdict) == "error":
        text = f"{name(r)}: {text}"
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 1] + "…"


def name(r: TaskResult) -> str:
    return f"{r.task_id} {r.title}"


def _filename(r: TaskResult) -> str:
    """The task's file as the student knows it (lab1/03_saxpy.cu), not where it was graded from."""
    parts = Path(r.source).parts
    if r.lab in parts:
        start = len(parts) - 1 - parts[::-1].index(r.lab)
        return "/".join(parts[start:])
    return Path(r.source).name


def one_test(r: TaskResult) -> dict[str, Any]:
    return {
        "name": name(r),
        "status": status(r.verdict),
        "score": _number(r.points),
        "max_score": _number(r.max_points),
        "message": message(r),
        "test_code": f"make test-{r.lab} TASK={r.number}",  # how to run it at home
        "filename": _filename(r),
        "line_no": 0,  # not 0 would print " - line N" after the name
        "execution_time": f"{r.seconds:.1f}s",
    }


def classroom_result(results: list[TaskResult]) -> dict[str, Any]:
    """One reporter `result` for all the tasks graded; its `max_score` is the course's total."""
    tests = [one_test(r) for r in results]
    statuses = {t["status"] for t in tests}
    overall = "error" if "error" in statuses else "fail" if "fail" in statuses else "pass"
    return {
        "version": 1,
        "status": overall,
        "max_score": _number(sum(r.max_points for r in results)),
        "tests": tests,
    }


def encode(result: dict[str, Any]) -> str:
    """Base64 of the JSON, on one line: what the reporter decodes from `<ID>_RESULTS`."""
    return base64.b64encode(json.dumps(result, separators=(",", ":")).encode()).decode("ascii")


def decode(text: str) -> dict[str, Any]:
    """The reporter's reading of `encode`'s output (Buffer.from(text, "base64"), then JSON.parse)."""
    return json.loads(base64.b64decode(text).decode("utf-8"))


def write(results: list[TaskResult], out_dir: Path, github_output: Path | None = None) -> dict[str, Any]:
    """Writes `out_dir/classroom.json` (for the artifact and for instructors) and, inside a GitHub
    Actions step, appends `result=<base64>` to the file $GITHUB_OUTPUT names, so the step's
    `outputs.result` is what the reporter expects in GRADER_RESULTS. Returns the result."""
    result = classroom_result(results)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / FILE).write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    if github_output is not None:
        with github_output.open("a") as f:
            f.write(f"result={encode(result)}\n")
    return result
