"""Runs a notebook task in the task process: validate with nbformat, execute with nbclient.

The student's cells run one by one in a fresh kernel (its working folder is the notebook's own
in the lab, so relative data paths work as in Jupyter); a cell that raises ends the run, named by
its position in the notebook. Then each of the task's checks runs as one more cell in the same
kernel, where the student's variables live, and becomes one TestOutcome with its points, so the
task earns partial credit like a Python-module task.

A cell that runs past the task's `cell_timeout` is stopped by nbclient and reported with its
cell; a kernel that dies (os._exit, a segfault in native code, out of memory) is a crash. The
kernel runs in a session of its own (jupyter_client starts it so), but it watches this process
and exits within a second when the grading process kills this one for running past `timeout`.

nbformat, nbclient and ipykernel are only needed here: where they are missing the task's verdict
is `environment`, with the pip command, and no other task is affected.
"""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grader import paths
from grader.records import ChildJob, Phase, Stage, TestOutcome, Verdict
from grader.tasks.notebook import NotebookCheck, NotebookTask

if TYPE_CHECKING:
    from grader.child.__main__ import Recorder

PACKAGES = "nbformat nbclient ipykernel"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_NOISE = ("without encryption",)  # ipykernel's warning about local TCP, on every start
LOG_LINES = 8


def pip_command() -> str:
    return f"{paths.rel(Path(sys.executable))} -m pip install {PACKAGES}"


@dataclass
class Outcome:
    verdict: Verdict | None = None  # None: every cell ran; the checks' outcomes decide
    message: str = ""
    tests: list[TestOutcome] = field(default_factory=list)


def error_text(output: dict[str, Any] | None, fallback: str) -> str:
    """`Name: value` of a cell's error, and the line it was raised at (the traceback's last arrow)."""
    if not output:
        return fallback
    head = f"{output.get('ename', 'Error')}: {output.get('evalue', '')}".rstrip(": ")
    lines = [_ANSI.sub("", ln) for tb in output.get("traceback", []) for ln in str(tb).splitlines()]
    arrows = [ln.strip() for ln in lines if ln.lstrip().startswith("---->") or ln.lstrip().startswith("-->")]
    return head + (f"\n  at: {arrows[-1]}" if arrows else "")


def _error_output(cell: Any) -> dict[str, Any] | None:
    return next((o for o in reversed(cell.get("outputs", [])) if o.get("output_type") == "error"), None)


def _tail(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    lines = [ln for ln in lines if ln.strip() and not any(n in ln for n in _NOISE)][-LOG_LINES:]
    return "\nthe kernel's last output:\n" + "\n".join(lines) if lines else ""


def _exit_of(client: Any) -> str:
    """How the kernel process ended, where jupyter_client lets us see it."""
    process = getattr(getattr(getattr(client, "km", None), "provisioner", None), "process", None)
    code = process.poll() if process is not None else None
    if code is None:
        return ""
    if code < 0:
        try:
            return f" ({signal.Signals(-code).name})"
        except ValueError:
            return f" (signal {-code})"
    return f" (exit code {code})"


async def execute(task: NotebookTask, nb: Any, checks: list[NotebookCheck], rec: Recorder) -> Outcome:
    """The notebook's cells, then the checks, in one fresh kernel."""
    from nbclient import NotebookClient

    client = NotebookClient(
        nb,
        timeout=task.cell_timeout,
        kernel_name=task.kernel,
        shutdown_kernel="immediate",
        resources={"metadata": {"path": str((task.lab_dir() / task.source).parent)}},
    )
    rec.at(Stage.CHECKING, "starting the notebook's kernel")
    # the kernel's own stdout and stderr (native code's prints, a fatal error) go to a log beside the
    # report: quoted when the kernel dies, and gone with the task's scratch folder
    log = rec.scratch / "kernel.log"
    with open(log, "wb") as sink:
        async with client.async_setup_kernel(stdout=sink, stderr=sink):
            return await _cells(task, client, nb, checks, rec, log)


async def _cells(
    task: NotebookTask, client: Any, nb: Any, checks: list[NotebookCheck], rec: Recorder, log: Path
) -> Outcome:
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    out = Outcome()
    first_check = len(nb.cells) - len(checks)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        check = checks[index - first_check] if index >= first_check else None
        where = f"check `{check.name}`" if check else f"cell {index + 1}"
        rec.at(Stage.CHECKING, where)
        try:
            await client.async_execute_cell(cell, index, execution_count=client.code_cells_executed + 1)
        except CellExecutionError as e:
            text = error_text(_error_output(cell), f"{e.ename}: {e.evalue}")
            if check is None:
                out.verdict, out.message = Verdict.WRONG, f"{where} raised {text}"
                return out
            out.tests.append(TestOutcome(check.name, "failed", float(check.points), text))
        except CellTimeoutError:
            out.verdict = Verdict.TIMEOUT
            out.message = (
                f"{where} ran longer than {task.cell_timeout:g} s (the task's cell_timeout) and was stopped: "
                f"an infinite loop, or a computation far slower than it needs to be"
            )
            return out
        except DeadKernelError:
            out.verdict = Verdict.CRASH
            out.message = (
                f"the notebook's kernel died{_exit_of(client)} in {where}: os._exit or sys.exit in a cell, "
                f"a crash in native code (a segfault through ctypes or a CUDA error), or out of memory" + _tail(log)
            )
            return out
        else:
            if check is not None:
                out.tests.append(TestOutcome(check.name, "passed", float(check.points)))
        if check is not None:  # each check's outcome on disk as soon as it is known
            rec.report.tests = out.tests
            rec.flush()
    return out


def run(task: NotebookTask, job: ChildJob, rec: Recorder) -> None:
    try:
        import nbformat
        from jupyter_client.kernelspec import NoSuchKernel
    except ImportError as e:
        rec.set(
            verdict=Verdict.ENVIRONMENT,
            message=f"notebook tasks need nbformat, nbclient and ipykernel; this Python lacks {e.name or e}: "
            f"{pip_command()}",
        )
        return
    path = Path(job.sources[task.source])
    where = paths.rel(path)
    rec.at(Stage.CHECKING, "validating the notebook")
    try:
        nb = nbformat.read(path, as_version=4, capture_validation_error={})
        nbformat.validate(nb)
    except nbformat.ValidationError as e:
        rec.set(verdict=Verdict.WRONG, message=f"{where} is not a valid notebook (nbformat): {e.message}")
        return
    except ValueError as e:  # nbformat's NotJSONError, an unknown nbformat version
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        rec.set(verdict=Verdict.WRONG, message=f"{where} is not a valid notebook (nbformat): {first}")
        return
    checks = task.check_list()
    nb.cells += [nbformat.v4.new_code_cell(c.code) for c in checks]
    try:
        out = asyncio.run(execute(task, nb, checks, rec))
    except NoSuchKernel:
        rec.set(
            verdict=Verdict.ENVIRONMENT,
            message=f"no Jupyter kernel named `{task.kernel}` on this machine: {pip_command()}",
        )
        return
    if out.verdict is not None:
        rec.set(verdict=out.verdict, message=out.message, tests=out.tests)
        return
    failed = [t for t in out.tests if t.outcome != "passed"]
    if not failed:
        rec.set(verdict=Verdict.PASS, message="", tests=out.tests, phase=Phase(Stage.DONE))
        return
    lines = [f"{len(failed)} of {len(out.tests)} checks failed:"]
    for t in failed:
        head, *rest = t.message.splitlines() or [t.outcome]
        lines += [f"  {t.name}: {head}", *(f"    {r}" for r in rest)]
    rec.set(verdict=Verdict.WRONG, message="\n".join(lines), tests=out.tests, phase=Phase(Stage.DONE))
