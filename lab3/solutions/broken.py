"""Deliberately broken lab 3 submissions, written as edits to the reference solutions.

tests/test_broken_variants.py applies each edit, grades the result and expects the verdict given
here, as for labs 1 and 2. Task 01's variants need no GPU (its task is graded on the CPU): they are
graded on every machine, CI included.
"""

from __future__ import annotations

from grader.instructor.broken import Variant

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
    # --- task 04 (cuDNN's graph API)
    "04_cudnn.graph_forgets_relu_output": Variant(
        "04_cudnn.cu",
        [
            (
                "    lg->y = g.pointwise(biased, fe::graph::Pointwise_attributes()\n"
                '                                    .set_name("relu")\n'
                "                                    .set_mode(fe::PointwiseMode_t::RELU_FWD)\n"
                "                                    .set_compute_data_type(fe::DataType_t::FLOAT));\n",
                "    lg->y = biased;  // the pre-ReLU tensor marked as the output, the relu node dropped\n",
            )
        ],
        {"wrong"},
        # The custom checks run first: trained conv1 (conv entries, correct), the precision probe
        # (only notes), the cache check (times only). Then the first case, 1x784->1000: about half
        # of y is negative where torch's is 0, off by far more than atol = 0.05. The grader's
        # mismatch message names the entry point.
        "linear_relu_cudnn",
        "the linear graph's output is x·wᵀ + b: the ReLU node is dropped (the issue's 'graph that forgets the"
        " ReLU output')",
    ),
    "04_cudnn.wrong_stride_for_w": Variant(
        "04_cudnn.cu",
        [
            (
                "                         .set_stride({k * n, 1, k})\n",
                "                         .set_stride({k * n, n, 1})\n",
            )
        ],
        {"wrong"},
        # wᵀ [1, in, out] read as if w were stored (in, out) row-major: a legal, in-bounds layout of
        # the same in·out elements, so cuDNN accepts it; every output is another dot product
        # (off by about 1.4) already at 1x784->1000.
        "linear_relu_cudnn",
        "strides that read w's memory as an (in, out) matrix: w used untransposed",
    ),
    # --- task 05 (CUTLASS)
    "05_cutlass.epilogue_without_relu": Variant(
        "05_cutlass.cu",
        [
            (
                "using EpilogueSimt = cutlass::epilogue::thread::LinearCombinationRelu<float, 1, float, float>;",
                "using EpilogueSimt = cutlass::epilogue::thread::LinearCombination<float, 1, float, float>;",
            )
        ],
        {"wrong"},
        # the TF32 entry keeps its ReLU and passes the custom check; the SIMT entry's first case
        # (1x784->1000) keeps the negative half of y. The case's message names the entry point.
        # (Only the SIMT alias is edited: with no LinearCombinationRelu left anywhere the source
        # rule would answer `rule violation` first.)
        "linear_relu_cutlass_simt",
        "the SIMT GEMM's epilogue is LinearCombination instead of LinearCombinationRelu: the bias is added,"
        " the ReLU never applied",
    ),
    "05_cutlass.b_row_major": Variant(
        "05_cutlass.cu",
        [
            ("using LayoutW = cutlass::layout::ColumnMajor;", "using LayoutW = cutlass::layout::RowMajor;"),
            (
                "        {w, in},       // B = wᵀ (in, out), column-major: column j is row j of w\n",
                "        {w, out},      // B = w's memory read as a row-major (in, out) matrix\n",
            ),
        ],
        {"wrong"},
        # legal for every kernel (ldb = out is a multiple of 4 wherever the wide TF32 kernel runs):
        # the product is x·(w's memory as (in, out)), garbage on 1x33->17, exactly x·w on the square
        # 64x256->256: the first TF32 shape already fails the element-wise bound
        "past the TF32 bound",
        "w given as a RowMajor B with ldb = out: the column-major mix-up of task 03 in CUTLASS terms"
        " (x·w instead of x·wᵀ on square shapes)",
    ),
    "05_cutlass.tf32_always_wide": Variant(
        "05_cutlass.cu",
        [("    if (wide) return linear_relu<GemmTf32>(", "    if (true) return linear_relu<GemmTf32>(")],
        {"crash"},
        # 1x33->17: lda = 33 and ldd = 17 are not multiples of 4, so can_implement returns
        # kErrorMisalignedOperand, which the entry returns as cudaErrorMisalignedAddress
        "cudaErrorMisalignedAddress",
        "the 4-floats-per-access TF32 kernel used for every shape: can_implement refuses 33 -> 17",
    ),
    # --- task 06 (a PyTorch extension)
    "06_extension.backward_wrong": Variant(
        "06_extension.py",
        [
            (
                "        grad_w = linear(grad_y.t(), x.t(), grad_y.new_zeros(x.shape[1]))\n",
                "        pass  # grad_w forgotten: it stays None\n",
            )
        ],
        {"wrong"},
        "with respect to `w`",
        "forgets grad_w (None, so autograd gives w no gradient): values and opcheck pass (CPU stand-in), gradcheck "
        "in float64 fails: 'the gradient with respect to `w` disagrees with finite differences of the forward'",
    ),
    "06_extension.backward_transposed": Variant(
        "06_extension.py",
        [
            (
                "        grad_w = linear(grad_y.t(), x.t(), grad_y.new_zeros(x.shape[1]))\n",
                "        grad_w = linear(x.t(), grad_y.t(), grad_y.new_zeros(grad_y.shape[1]))\n",
            )
        ],
        {"wrong"},
        "invalid gradient",
        "computes grad_w as xᵀ·grad_y, (in, out) instead of (out, in): opcheck comes before gradcheck in the kind, "
        "and its second sample (inputs requiring grad) fails test_aot_dispatch_dynamic with autograd's 'returned an "
        "invalid gradient at index 1 - got [33, 17] but expected shape compatible with [17, 33]' (CPU stand-in)",
    ),
    "06_extension.grad_w_halved": Variant(
        "06_extension.py",
        [
            (
                "        grad_w = linear(grad_y.t(), x.t(), grad_y.new_zeros(x.shape[1]))\n",
                "        grad_w = 0.5 * linear(grad_y.t(), x.t(), grad_y.new_zeros(x.shape[1]))\n",
            )
        ],
        {"wrong"},
        "disagrees with finite differences",
        "a grad_w of the right shape and the wrong values: only gradcheck (float64) names it, with respect to `w`",
    ),
    "06_extension.fake_wrong_shape": Variant(
        "06_extension.py",
        [
            (
                "    return x.new_empty((x.shape[0], w.shape[0]))  # contiguous, like the real op's output\n",
                "    return x.new_empty((x.shape[0], x.shape[1]))  # contiguous, like the real op's output\n",
            )
        ],
        {"wrong"},
        "test_faketensor",
        "the fake says (B, in) where the op returns (B, out): values pass, opcheck's test_faketensor fails "
        "(measured on the CPU stand-in: 'Shapes torch.Size([7, 17]) and torch.Size([7, 33]) are not equal')",
    ),
    "06_extension.no_bias": Variant(
        "06_extension.cu",
        [
            (
                "    if (i < B && j < out) y[(size_t)i * out + j] = acc + b[j];\n",
                "    if (i < B && j < out) y[(size_t)i * out + j] = acc;\n",
            )
        ],
        {"wrong"},
        "wrong",
        "the kernel forgets the bias: every output off by |b[j]| ~ N(0, 1), far past atol 2e-3, on the first case",
    ),
    # --- task 07 (faster than PyTorch)
    "07_faster.graph_not_rebuilt_for_new_n": Variant(
        "07_faster.cu",
        [("    auto it = graphs.find(key);\n", "    auto it = graphs.begin();  // any graph will do\n")],
        {"wrong"},
        # graphs_follow_n_and_weights: n=1 captures, n=7 replays it: 6 labels stale from earlier calls
        "labels",
        "the first graph captured is replayed for every n: labels past its n are never written",
    ),
    "07_faster.labels_from_previous_call": Variant(
        "07_faster.cu",
        [
            (
                "    if (n < 1) return cudaErrorInvalidValue;\n",
                "    if (n < 1) return cudaErrorInvalidValue;\n"
                "    static const float* last_images = nullptr;\n"
                "    static int last_n = 0, last_net = -1;\n"
                "    if (images_host == last_images && n == last_n && wt.net == last_net && g_rt.labels_pinned) {\n"
                "        std::memcpy(labels_host, g_rt.labels_pinned, (size_t)n * sizeof(int64_t));\n"
                "        return cudaSuccess;  // the same request again: replay the last answer\n"
                "    }\n"
                "    last_images = images_host, last_n = n, last_net = wt.net;\n",
            )
        ],
        {"wrong"},
        # the cases' second random draw can land at the first draw's address with other images, and
        # the timed calls rotate fresh images through the same pointers: either catches it
        "`labels`",
        "a cache keyed by the images pointer: the timed rotation's fresh images get stale labels",
        timing=True,
    ),
}

# one grading run per batch; a batch holds each task at most once
BATCHES = [
    [
        "01_cpu_inference.weights_not_transposed",
        "02_cuda_mlp.last_batch_padded",
        "03_cublas.column_major_mixup",
        "04_cudnn.graph_forgets_relu_output",
        "05_cutlass.b_row_major",
        "07_faster.graph_not_rebuilt_for_new_n",
        "06_extension.backward_wrong",
    ],
    [
        "01_cpu_inference.no_bias",
        "02_cuda_mlp.weights_not_transposed",
        "03_cublas.epilogue_without_relu",
        "04_cudnn.wrong_stride_for_w",
        "05_cutlass.epilogue_without_relu",
        "06_extension.backward_transposed",
    ],
    [
        "01_cpu_inference.no_relu",
        "02_cuda_mlp.no_bias",
        "03_cublas.tf32_ignored",
        "05_cutlass.tf32_always_wide",
        "06_extension.grad_w_halved",
    ],
    [
        "01_cpu_inference.last_image_dropped",
        "02_cuda_mlp.no_relu",
        "03_cublas.bias_never_added",
        "06_extension.fake_wrong_shape",
    ],
    ["01_cpu_inference.uses_torch", "02_cuda_mlp.argmax_last_tie", "06_extension.no_bias"],
]
SANITIZED: list[str] = []
AT_BUILD: list[str] = []
HUGE: list[str] = []
TIMED: list[str] = ["07_faster.labels_from_previous_call"]  # caught only by the timed rotation
