"""Deliberately broken lab 1 submissions, written as edits to the reference solutions.

tests/test_broken_variants.py applies each edit, grades the result and expects the verdict
given here. Keeping them as edits means they follow the solutions: if a solution changes so
that an edit no longer applies, the test says so instead of grading a stale copy.
"""

from __future__ import annotations

from grader.instructor.broken import Variant

SAXPY_BODY = "    if (i < n) out[i] = alpha * x[i] + y[i];"

VARIANTS: dict[str, Variant] = {
    "00_device_query.block_local_index": Variant(
        "00_device_query.cu",
        [
            (
                "    int g = blockIdx.x * blockDim.x + threadIdx.x;\n",
                "    int g = threadIdx.x;  // the thread's number\n",
            )
        ],
        {"wrong"},
        "wrong",
        "indexes the slots by threadIdx.x alone: every block writes the first block's slots",
        mistake="global index",
    ),
    "00_device_query.bad_index_succeeds": Variant(
        "00_device_query.cu",
        [
            (
                "    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));\n",
                "    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return cudaSuccess;  // nothing here\n",
            )
        ],
        {"wrong"},
        "does not exist",
        "a failed query returns cudaSuccess with the structure unfilled",
        mistake="swallowed error",
    ),
    "01_vector_add.no_guard": Variant(
        "01_vector_add.cu",
        [
            ("    if (i < n) c[i] = a[i] + b[i];", "    c[i] = a[i] + b[i];  // one thread per element"),
            ("<<<1, n>>>", "<<<1, (n + 31) / 32 * 32>>>"),  # whole warps
        ],
        {"wrong"},
        "out of bounds",
        "launches whole warps and has no `i < n` guard: the spare threads of the last warp write past the end",
        mistake="tail",
    ),
    "01_vector_add.never_written": Variant(
        "01_vector_add.cu",
        [("    if (i < n) c[i] = a[i] + b[i];", "    float sum = (i < n) ? a[i] + b[i] : 0.0f;\n    (void)sum;")],
        {"wrong"},
        "never written",
        "computes but never stores",
        mistake="never written",
    ),
    "02_matrix_add.guard_off_by_one": Variant(
        "02_matrix_add.cu",
        [("row < rows", "row <= rows")],
        {"wrong"},
        "out of bounds",
        "a guard that lets one row past the end",
        mistake="off-by-one guard",
    ),
    "03_saxpy.no_guard": Variant(
        "03_saxpy.cu",
        [(SAXPY_BODY, "    out[i] = alpha * x[i] + y[i];")],
        {"wrong"},
        "out of bounds",
        "no bounds guard",
        mistake="tail",
    ),
    "03_saxpy.infinite_loop": Variant(
        "03_saxpy.cu",
        [(SAXPY_BODY, "    for (int k = i; k < n; k += 0) out[k] = alpha * x[k] + y[k];")],
        {"timeout"},
        "never finishes",
        "a loop that never ends",
        mistake="hang",
    ),
    "03_saxpy.illegal_address": Variant(
        "03_saxpy.cu",
        [(SAXPY_BODY, "    if (i < n) out[i + ((size_t)(i + 1) << 36)] = alpha * x[i] + y[i];")],
        {"crash"},
        "illegal memory access",
        "writes hundreds of GB past its output",
        mistake="illegal address",
    ),
    "03_saxpy.skips_repeated_calls": Variant(
        "03_saxpy.cu",
        [
            (
                "COURSE_API cudaError_t saxpy(int n, float alpha, const float* x, const float* y, float* out) {\n",
                "COURSE_API cudaError_t saxpy(int n, float alpha, const float* x, const float* y, float* out) {\n"
                "    // remembers the argument lists it has computed, and returns at once when one comes again\n"
                "    struct Args { int n; float alpha; const float* x; const float* y; float* out; };\n"
                "    static Args seen[64];\n"
                "    static int calls = 0;\n"
                "    for (int k = 0; k < calls && k < 64; ++k) {\n"
                "        const Args& a = seen[k];\n"
                "        if (a.n == n && a.alpha == alpha && a.x == x && a.y == y && a.out == out)\n"
                "            return cudaSuccess;\n"
                "    }\n"
                "    seen[calls++ % 64] = Args{n, alpha, x, y, out};\n",
            )
        ],
        {"wrong"},
        "recognised its arguments",
        "skips its work when called again with the same arguments (a timer that repeats one call saw 11x the copy"
        " bandwidth)",
        mistake="replayed results",
    ),
    "03_saxpy.skips_a_repeat_of_the_last_call": Variant(
        "03_saxpy.cu",
        [
            (
                "COURSE_API cudaError_t saxpy(int n, float alpha, const float* x, const float* y, float* out) {\n",
                "COURSE_API cudaError_t saxpy(int n, float alpha, const float* x, const float* y, float* out) {\n"
                "    // the same call as the last one: its output is already there\n"
                "    static const float* last_x = nullptr;\n"
                "    static float* last_out = nullptr;\n"
                "    if (x == last_x && out == last_out) return cudaSuccess;\n"
                "    last_x = x;\n"
                "    last_out = out;\n",
            )
        ],
        {"wrong"},
        # caught where it first skips: the repeated call, or a case whose fresh buffers the
        # allocator handed out at the previous call's addresses (a plain mismatch then)
        "wrong",
        "skips a call that repeats the previous one's pointers (the grader once blamed a private stream for it)",
        mistake="replayed results",
    ),
    "03_saxpy.private_stream": Variant(
        "03_saxpy.cu",
        [
            (
                "    saxpy_kernel<<<blocks, THREADS>>>(n, alpha, x, y, out);\n",
                "    static cudaStream_t stream = nullptr;  // a stream of its own, which nobody waits on\n"
                "    if (stream == nullptr) CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));\n"
                "    saxpy_kernel<<<blocks, THREADS, 0, stream>>>(n, alpha, x, y, out);\n",
            )
        ],
        {"wrong"},
        "a stream the grader does not wait on",
        "launches on a private non-blocking stream and returns without waiting",
        timing=True,
        mistake="wrong stream",
    ),
    "04_swap_pairs.writes_input": Variant(
        "04_swap_pairs.cu",
        [
            (
                "        out[g + 1] = tile[t2];\n",
                "        out[g + 1] = tile[t2];\n        const_cast<float*>(in)[g] = 0.0f;\n",
            )
        ],
        {"wrong"},
        "was modified",
        "overwrites its input",
        mistake="writes its input",
    ),
    "04_swap_pairs.sync_misplaced": Variant(
        "04_swap_pairs.cu",
        [
            (
                "    const int base = blockIdx.x * TILE;  // first element of this block\n",
                "    const int base = blockIdx.x * TILE;  // first element of this block\n    __syncthreads();\n",
            ),
            (
                "    // other warps, which may not have run yet. Every thread reaches this barrier.\n"
                "    __syncthreads();\n",
                "",
            ),
        ],
        {"wrong", "sanitizer"},
        "",
        "the barrier sits before the loads, so nothing orders loads and reads",
        mistake="race",
    ),
    "03_saxpy.thrust_alias": Variant(
        "03_saxpy.cu",
        [
            (
                '#include "course.h"\n',
                '#include "course.h"\n\n'
                "#define LIBHDR <thrust/transform.h>\n"
                "#define POLICY <thrust/execution_policy.h>\n"
                "#include LIBHDR\n"
                "#include POLICY\n"
                "namespace lib = thrust;\n\n"
                "struct Axpy {\n"
                "    float alpha;\n"
                "    __device__ float operator()(float xi, float yi) const { return alpha * xi + yi; }\n"
                "};\n",
            ),
            (
                "    constexpr int THREADS = 256;\n"
                "    int blocks = (n + THREADS - 1) / THREADS;\n"
                "    saxpy_kernel<<<blocks, THREADS>>>(n, alpha, x, y, out);\n",
                "    lib::transform(lib::device, x, x + n, y, out, Axpy{alpha});\n",
            ),
        ],
        {"rule violation"},
        "thrust/transform.h",
        "Thrust through a macro-spelled #include and a namespace alias: no library name is spelled out",
        mistake="library by spelling",
    ),
    "04_swap_pairs.shared_unused": Variant(
        "04_swap_pairs.cu",
        [
            ("        if (g < n) tile[k] = in[g];\n", "        (void)g;\n"),
            (
                "        out[g] = tile[t2 + 1];\n        out[g + 1] = tile[t2];\n",
                "        out[g] = in[g + 1];\n        out[g + 1] = in[g];\n",
            ),
            ("        out[g] = tile[t2];  // odd n", "        out[g] = in[g];  // odd n"),
        ],
        {"rule violation"},
        "0 bytes of shared memory",
        "a __shared__ tile declared but never used and a bare __syncthreads(): swaps straight from global memory",
        mistake="dead code",
    ),
    "05_silu.unchecked": Variant(
        "05_silu.cu",
        [
            ("    if (n > SIZE_MAX / sizeof(float)) return cudaErrorMemoryAllocation;\n", ""),
            ("CUDA_CHECK(cudaMalloc(&d_x, bytes));", "cudaMalloc(&d_x, bytes);"),
            ("CUDA_CHECK(cudaMalloc(&d_y, bytes));", "cudaMalloc(&d_y, bytes);"),
            (
                "CUDA_CHECK(cudaMemcpy(d_x, x, bytes, cudaMemcpyHostToDevice));",
                "cudaMemcpy(d_x, x, bytes, cudaMemcpyHostToDevice);",
            ),
            ("        CUDA_CHECK(cudaGetLastError());\n", ""),
            (
                "CUDA_CHECK(cudaMemcpy(y, d_y, bytes, cudaMemcpyDeviceToHost));",
                "cudaMemcpy(y, d_y, bytes, cudaMemcpyDeviceToHost);",
            ),
            ("    cudaError_t err = run();", "    cudaError_t err = run();\n    err = cudaSuccess;"),
        ],
        {"wrong"},
        "returned cudaSuccess",
        "checks no runtime call",
        mistake="unchecked errors",
    ),
    "05_silu.leaks": Variant(
        "05_silu.cu",
        [("    keep_first(cudaFree(d_y));\n", "")],
        {"wrong"},
        "leaks",
        "never frees one of its buffers",
        mistake="leak",
    ),
    "05_silu.leaks_on_failure": Variant(
        "05_silu.cu",
        [("    cudaError_t err = run();\n", "    cudaError_t err = run();\n    if (err != cudaSuccess) return err;\n")],
        {"wrong"},
        "leaked",
        "returns at the first error, before the frees: a failed second allocation leaks the first",
        mistake="leak on failure",
    ),
    "06_max_pool.sync_misplaced": Variant(
        "06_max_pool.cu",
        [
            ("    }\n    __syncthreads();\n\n    const int r", "    }\n\n    const int r"),
            (
                "    const int col0 = blockIdx.x * TILE;\n",
                "    const int col0 = blockIdx.x * TILE;\n    __syncthreads();\n",
            ),
        ],
        {"wrong", "sanitizer"},
        "",
        "the barrier sits before the loads instead of between loads and reads",
        mistake="race",
    ),
    "02_matrix_add.int_offsets": Variant(
        "02_matrix_add.cu",
        [("size_t i = (size_t)row * cols + col;", "int i = row * cols + col;")],
        {"wrong", "crash"},
        "",
        "32-bit flat offsets: row * cols overflows past 2^31 elements",
        huge=True,
        mistake="32-bit offsets",
    ),
    "07_histogram.no_zero": Variant(
        "07_histogram.cu",
        [("    CUDA_CHECK(cudaMemsetAsync(bins, 0, BINS * sizeof(unsigned int)));\n", "")],
        {"wrong"},
        "wrong",
        "forgets to zero the bins",
        mistake="bins not zeroed",
    ),
}

# one grading run per batch: each batch mixes tasks, so a hang or a crash must not stop the rest
BATCHES = [
    [
        "01_vector_add.never_written",
        "02_matrix_add.guard_off_by_one",
        "03_saxpy.infinite_loop",
        "04_swap_pairs.writes_input",
        "05_silu.unchecked",
        "06_max_pool.sync_misplaced",
        "07_histogram.no_zero",
    ],
    ["03_saxpy.illegal_address", "05_silu.leaks", "00_device_query.block_local_index", "01_vector_add.no_guard"],
    ["00_device_query.bad_index_succeeds", "03_saxpy.skips_repeated_calls"],
    ["03_saxpy.skips_a_repeat_of_the_last_call"],
    ["03_saxpy.no_guard", "04_swap_pairs.shared_unused", "05_silu.leaks_on_failure"],
    ["03_saxpy.thrust_alias"],
]
SANITIZED = ["04_swap_pairs.sync_misplaced"]  # graded with compute-sanitizer as well
# verdicts the build decides (the rules judge what was compiled): graded on a machine without a GPU too
AT_BUILD = ["03_saxpy.thrust_alias", "04_swap_pairs.shared_unused"]
HUGE = ["02_matrix_add.int_offsets"]  # graded with the cases past 2^31 elements (tens of GB of GPU memory)
# graded with timing on (quick): they pass every correctness check and game only the timed calls
TIMED = ["03_saxpy.private_stream"]
