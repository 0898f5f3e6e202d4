"""Deliberately broken lab 3 submissions, written as edits to the reference solutions.

tests/test_broken_variants.py applies each edit, grades the result and expects the verdict given
here, as for labs 1 and 2. Task 01's variants need no GPU (its task is graded on the CPU): they are
graded on every machine, CI included.
"""

from __future__ import annotations

from grader.tests.variants import Variant

VARIANTS: dict[str, Variant] = {
    # --- task 01 (CPU inference in C++)
    "01_cpu_inference.weights_not_transposed": Variant(
        "01_cpu_inference.cpp",
        [
            ("        const float* wj = w + j * in;  // row j of w: the weights of output j, contiguous\n", ""),
            ("                acc += xi[k] * wj[k];\n", "                acc += xi[k] * w[k * out + j];\n"),
        ],
        {"wrong"},
        "wrong",
        "reads w as if it were (in, out), as in the math's x·W: w[k][j] instead of torch's w[j][k]"
        " (in bounds, every value wrong)",
    ),
    "01_cpu_inference.no_bias": Variant(
        "01_cpu_inference.cpp",
        [("            float acc = b[j];\n", "            float acc = 0.0f;\n")],
        {"wrong"},
        "wrong",
        "the dot products start from 0 instead of the bias",
    ),
    "01_cpu_inference.no_relu": Variant(
        "01_cpu_inference.cpp",
        [("        h[i] = h[i] > 0.0f ? h[i] : 0.0f;\n", "")],
        {"wrong"},
        "wrong",
        "relu_cpu leaves the negative hidden values in",
    ),
    "01_cpu_inference.last_image_dropped": Variant(
        "01_cpu_inference.cpp",
        [("        for (int64_t i = 0; i < batch; ++i) {\n", "        for (int64_t i = 0; i + 1 < batch; ++i) {\n")],
        {"wrong"},
        "wrong",
        "the image loop stops one short: the last image's logits stay 0",
    ),
    "01_cpu_inference.uses_torch": Variant(
        "01_cpu_inference.cpp",
        [("#include <cstdint>\n", "#include <cstdint>\n#include <ATen/ATen.h>  // at::matmul would do the work\n")],
        {"rule violation"},
        "plain C++",
        "includes ATen: the source rule forbids torch, ATen and BLAS in the student's file",
    ),
    # --- task 02 (the network on the student's own kernels)
    "02_cuda_mlp.last_batch_padded": Variant(
        "02_cuda_mlp.cu",
        [
            (
                "        const int rows = n - start < batch ? n - start : batch;  // the last batch may be short\n",
                "        const int rows = batch;  // the seed's way: a full last batch, padding and all\n",
            )
        ],
        {"wrong", "crash"},
        "out of bounds",
        "runs a full last batch: reads up to batch - 1 images past x and writes their labels past the end of labels",
    ),
    "02_cuda_mlp.weights_not_transposed": Variant(
        "02_cuda_mlp.cu",
        [
            (
                "        ws[ty][tx] = (col0 + ty < out && k < in) ? w[(size_t)(col0 + ty) * in + k] : 0.0f;\n",
                "        ws[ty][tx] = (col0 + ty < out && k < in) ? w[(size_t)k * out + (col0 + ty)] : 0.0f;\n",
            )
        ],
        {"wrong"},
        "wrong",
        "indexes w as (in, out) instead of torch's (out, in): in bounds, but every output is another dot product",
    ),
    "02_cuda_mlp.no_bias": Variant(
        "02_cuda_mlp.cu",
        [
            (
                "    if (i < B && j < out) y[(size_t)i * out + j] = acc + b[j];\n",
                "    if (i < B && j < out) y[(size_t)i * out + j] = acc;\n",
            )
        ],
        {"wrong"},
        "wrong",
        "forgets the bias: every output off by |b[j]|, far past linear's atol of 2e-3",
    ),
    "02_cuda_mlp.no_relu": Variant(
        "02_cuda_mlp.cu",
        [("        CUDA_CHECK(relu_inplace(h, rows * HIDDEN));\n", "")],
        {"wrong"},
        "wrong",
        "mlp_predict skips the ReLU between the layers: the trained network's labels differ from torch's on"
        " images that are no near ties (the custom check, first), and the random cases' labels too",
    ),
    "02_cuda_mlp.argmax_last_tie": Variant(
        "02_cuda_mlp.cu",
        [("        if (r[c] > best) best = r[c], at = c;", "        if (r[c] >= best) best = r[c], at = c;")],
        {"wrong"},
        "wrong",
        "argmax keeps the last of equal values in each lane: the tie rows (small integers) get a higher index"
        " than torch.argmax (only the 1000-class cases: with 10 or 17 classes a lane holds one class)",
    ),
    # --- task 03 (cuBLAS and cuBLASLt)
    "03_cublas.column_major_mixup": Variant(
        "03_cublas.cu",
        [
            (
                "CUBLAS_OP_T, CUBLAS_OP_N, out, B, in, &alpha, w, CUDA_R_32F, in, x,",
                "CUBLAS_OP_N, CUBLAS_OP_N, out, B, in, &alpha, w, CUDA_R_32F, out, x,",
            )
        ],
        {"wrong"},
        # the TF32 check runs before the cases, first on 1x33->17: w's memory read as a column-major
        # (out, in) matrix is garbage there, and exactly wᵀ on the square 64x256->256 (x·w, not x·wᵀ)
        "past the TF32 bound",
        "w read without its transpose (OP_N, lda = out): a legal call whose result is x·w on square shapes",
    ),
    "03_cublas.epilogue_without_relu": Variant(
        "03_cublas.cu",
        [
            (
                "const uint32_t epilogue = CUBLASLT_EPILOGUE_RELU_BIAS;",
                "const uint32_t epilogue = CUBLASLT_EPILOGUE_BIAS;",
            )
        ],
        {"wrong"},
        # linear_gemmex passes everything; linear_relu_lt's first case (1x784->1000) keeps the
        # negative half of y. The grader's mismatch message names the entry point.
        "linear_relu_lt",
        "the BIAS epilogue instead of RELU_BIAS: the bias is added, the ReLU never applied",
    ),
    "03_cublas.tf32_ignored": Variant(
        "03_cublas.cu",
        [
            (
                "tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;",
                "CUBLAS_COMPUTE_32F;  // tf32 ignored",
            )
        ],
        {"wrong"},
        # passes the TF32 bound (float32 is within it), then 4096³ with tf32=1 equals tf32=0 bit for bit
        # (judged on compute capability >= 8.0 only)
        "bit for bit",
        "the tf32 flag ignored: CUBLAS_COMPUTE_32F always",
    ),
    "03_cublas.bias_never_added": Variant(
        "03_cublas.cu",
        [("    const float beta = 1.0f;  // add to the bias already in y\n", "    const float beta = 0.0f;\n")],
        {"wrong"},
        "past the TF32 bound",
        "beta = 0 overwrites the broadcast bias: y = x·wᵀ without b",
    ),
}

# one grading run per batch; a batch holds each task at most once
BATCHES = [
    ["01_cpu_inference.weights_not_transposed", "02_cuda_mlp.last_batch_padded", "03_cublas.column_major_mixup"],
    ["01_cpu_inference.no_bias", "02_cuda_mlp.weights_not_transposed", "03_cublas.epilogue_without_relu"],
    ["01_cpu_inference.no_relu", "02_cuda_mlp.no_bias", "03_cublas.tf32_ignored"],
    ["01_cpu_inference.last_image_dropped", "02_cuda_mlp.no_relu", "03_cublas.bias_never_added"],
    ["01_cpu_inference.uses_torch", "02_cuda_mlp.argmax_last_tie"],
]
SANITIZED: list[str] = []
AT_BUILD: list[str] = []
HUGE: list[str] = []
TIMED: list[str] = []
