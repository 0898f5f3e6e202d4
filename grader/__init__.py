"""The course grader: builds student code, runs it isolated, checks it against PyTorch, times it.

The folders follow the processes and roles:
  tasks/       how a task is declared (spec.py: Task and its kinds, rules.py, regions.py) and
               found (catalogue.py); imported by every process, never imports torch at load
  build/       building student code in the grading process: nvcc.py (ninja, content-hashed), ptxas.py
  parent/      the grading process: runner.py (static checks -> build -> task process -> score),
               isolation.py and forkserver.py (task processes), static_checks.py, sanitizer.py, scoring.py
  child/       the task process, where student code runs: __main__.py reads a ChildJob and hands
               it to the runner of its kind (cudalib.py, ...); ffi.py, buffers.py, compare.py,
               mismatch.py and timing.py are its tools
  report/      what a grade says: terminal.py (the student's table), files.py (JSON, Markdown), envinfo.py
  instructor/  verify.py, release.py, skeletons.py, calibration.py
  records.py   the typed records that cross between the processes (ChildJob, ChildReport, TaskResult)
  pytest_plugin.py, cli.py   the front ends: pytest (make test-labN), python -m grader (instructors)
"""
