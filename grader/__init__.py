"""The course grader: builds student kernels with nvcc, checks them against PyTorch, times them.

Module map (one concern each):
  spec.py        how a task declares its entry points, inputs, reference and rules
  regions.py     TODO regions: skeleton generation and "not started" detection
  static_checks.py  per-lab and per-task source rules
  toolchain.py   finding nvcc, the GPU and its architecture
  build.py       nvcc builds (content-hashed, in parallel through ninja); ptxas.py reads -Xptxas -v
  isolation.py   runs one task in a child process with a timeout; child.py is that process
  ffi.py         ctypes calls with argument checks; buffers.py guarded outputs; compare.py and
                 mismatch.py judge outputs; timing.py times kernels against a torch baseline
  sanitizer.py   compute-sanitizer runs and their findings
  runner.py      grade one task: static checks -> build -> run -> sanitizer -> TaskResult
  rubric.py, report_*.py   scores and reports;  pytest_plugin.py  the pytest front end
  verify.py, release.py, cli.py   instructor commands
"""
