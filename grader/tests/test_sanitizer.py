from pathlib import Path

from grader.parent.sanitizer import parse

RACE = """\
========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at k(float *)+0xb0 in /x/lab1/04_swap_pairs.cu:24
=========     and Read access at k(float *)+0xc0 in /x/lab1/04_swap_pairs.cu:27 [1024 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""

HAZARD = """\
========= Warning: (Warp Level Programming) Potential RAW hazard detected at __shared__ 0x404 in block (0,0,0) :
=========     Write Thread (1,0,0) at swap_pairs_kernel(const float *, float *, int)+0x230 in 04_swap_pairs.cu:28
=========     Read Thread (0,0,0) at swap_pairs_kernel(const float *, float *, int)+0x5f0 in 04_swap_pairs.cu:34
=========     Current Value : 111
========= Warning: (Warp Level Programming) Potential RAW hazard detected at __shared__ 0x405 in block (0,0,0) :
=========     Write Thread (1,0,0) at swap_pairs_kernel(const float *, float *, int)+0x230 in 04_swap_pairs.cu:28
=========     Read Thread (0,0,0) at swap_pairs_kernel(const float *, float *, int)+0x5f0 in 04_swap_pairs.cu:34
"""

MEMCHECK = """\
========= Invalid __global__ write of size 4 bytes
=========     at saxpy_kernel(int, float, const float *, const float *, float *)+0x70 in /x/lab1/03_saxpy.cu:17
=========     by thread (255,0,0) in block (3,0,0)
=========     Address 0x7f0000000400 is out of bounds
=========     Saved host backtrace up to driver entry point at kernel launch time
========= Invalid __global__ read of size 4 bytes
=========     at at::native::some_torch_kernel()+0x70 in /torch/Loops.cuh:99
"""


def test_racecheck_finding_names_both_lines():
    (f,) = parse("racecheck", RACE, Path("lab1/04_swap_pairs.cu"))
    assert f.line == 24 and "line 27" in f.what and "1024 hazards" in f.detail


def test_memcheck_keeps_only_the_task_source():
    (f,) = parse("memcheck", MEMCHECK, Path("lab1/03_saxpy.cu"))
    assert (f.line, f.what) == (17, "Invalid __global__ write of size 4 bytes")
    assert "thread (255,0,0) of block (3,0,0)" in str(f)


def test_hazard_report_format_is_read_once_per_pair_of_lines():
    (f,) = parse("racecheck", HAZARD, Path("lab1/04_swap_pairs.cu"))
    assert f.line == 28 and "RAW hazard within a warp (write at line 28, read at line 34)" in f.what


def test_a_sanitizer_that_could_not_run_is_never_a_clean_run():
    from grader.parent.sanitizer import outcome

    clean = outcome("memcheck", "========= ERROR SUMMARY: 0 errors\n", True, [], "x.log")
    assert clean.status == "clean"
    refused = outcome(
        "memcheck",
        "========= Error: Target application terminated before first instrumented API call\n",
        False,
        [],
        "x.log",
    )
    assert refused.status == "not run" and "terminated before" in refused.detail and "x.log" in refused.detail
    silent = outcome("racecheck", "", True, [], "x.log")  # the task ran but the tool printed no summary
    assert silent.status == "not run" and "printed nothing" in silent.detail


HELPER_RACE = """\
========= Warning: Potential WAR hazard detected at __shared__ 0x1200 in block (0,0,0) :
=========     Read Thread (64,0,0) at hgemm_mma_kernel(int)+0x9c0 in /c/grader/include/course_mma.h:93
=========     Write Thread (0,0,0) at hgemm_mma_kernel(int)+0x3f0 in /c/grader/include/course_mma.h:53
========= Warning: Potential RAW hazard detected at __shared__ 0x80 in block (0,0,0) :
=========     Write Thread (1,0,0) at void at::native::reduce_kernel()+0x230 in /torch/Reduce.cuh:28
=========     Read Thread (0,0,0) at void at::native::reduce_kernel()+0x5f0 in /torch/Reduce.cuh:34
"""


def test_a_race_inside_the_course_helpers_is_the_kernels_race():
    """A stage refilled too early races between cp_async_16 and ldmatrix_x4, both inlined from
    course_mma.h: the task's own file never appears in the report. The header counts only when the
    build read it; a race inside torch's code never counts."""
    from grader.parent.sanitizer import findings

    sources, headers = ["/s/lab2/15_tensor_core.cu"], ["/c/grader/include/course.h", "/c/grader/include/course_mma.h"]
    (f,) = findings("racecheck", HELPER_RACE, sources, headers)
    assert f.file == "grader/include/course_mma.h" and f.line == 93 and "line 53" in f.what
    assert "inlined into your kernel" in f.detail
    assert findings("racecheck", HELPER_RACE, sources, headers[:1]) == []
    assert findings("racecheck", HELPER_RACE, sources, ["/elsewhere/include/course_mma.h"]) == []
