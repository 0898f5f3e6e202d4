"""The course grader: builds student code, runs it isolated, checks it against PyTorch, times it.

The folders follow the processes and roles:
  tasks/       how a task is declared and found; imported by every process, never imports torch
               at load: spec.py (Task, CudaTask and their parts), torch_ext.py, python.py and
               notebook.py (the other kinds), ladder.py, elementwise.py (the common shape in one
               call), rules.py, regions.py (TODO regions), seeds.py (the inputs' seeds),
               catalogue.py (every task, by id)
  build/       building CUDA tasks in the grading process: nvcc.py (units of sources, flags and
               libraries; ninja; a cache keyed on every input), ptxas.py, objects.py, packages.py
               (libraries and header wheels); shared_library (__init__.py) for the labs' compilers
  parent/      the grading process: runner.py (static checks -> build -> task process -> score),
               isolation.py and forkserver.py (task processes), static_checks.py (rules on the
               source and on what was compiled), sanitizer.py, scoring.py; never imports child/
  child/       the task process, where student code runs: __main__.py reads a ChildJob and hands
               it to its kind's runner (cudalib.py, torch_ext.py, pytests.py, notebook.py; ladder.py
               and profiling.py for CUDA tasks); ffi.py, buffers.py, compare.py, mismatch.py and
               timing.py are their tools; forkserver.py is the warm interpreter it is forked from
  report/      what a grade says: terminal.py (the student's table), files.py (JSON, Markdown),
               ladders.py (README tables and plots), envinfo.py
  instructor/  verify.py, release.py, skeletons.py, calibration.py, doctor.py, bench.py, profile.py
  records.py   the typed records that cross between the processes (ChildJob, ChildReport, TaskResult)
  pytest_plugin.py, cli.py   the front ends: pytest (make test-labN), python -m grader (everything else)
"""
