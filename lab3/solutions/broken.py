"""Deliberately broken lab 3 submissions, written as edits to the reference solutions.

tests/test_broken_variants.py applies each edit, grades the result and expects the verdict given
here, as for labs 1 and 2. Task 01's variants need no GPU (its task is graded on the CPU): they are
graded on every machine, CI included. Each names the class of mistake it stands for, one of the
classes its task's spec lists in `mistakes`.
"""

from __future__ import annotations

from grader.instructor.broken import Variant

# task 02's ReLU kernel as the reference writes it: two variants replace it
RELU_KERNEL = (
    "__global__ void relu_kernel(float* __restrict__ y, size_t n) {\n"
    "    const size_t stride = (size_t)gridDim.x * blockDim.x;\n"
    "    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)\n"
    "        y[i] = fmaxf(y[i], 0.0f);\n"
    "}\n"
)

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
        mistake="transposed weights",
    ),
    "01_cpu_inference.no_bias": Variant(
        "01_cpu_inference.cpp",
        [("            float acc = b[j];\n", "            float acc = 0.0f;\n")],
        {"wrong"},
        "wrong",
        "the dot products start from 0 instead of the bias",
        mistake="missing bias",
    ),
    "01_cpu_inference.no_relu": Variant(
        "01_cpu_inference.cpp",
        [("        h[i] = h[i] > 0.0f ? h[i] : 0.0f;\n", "")],
        {"wrong"},
        "wrong",
        "relu_cpu leaves the negative hidden values in",
        mistake="missing ReLU",
    ),
    "01_cpu_inference.last_image_dropped": Variant(
        "01_cpu_inference.cpp",
        [("        for (int64_t i = 0; i < batch; ++i) {\n", "        for (int64_t i = 0; i + 1 < batch; ++i) {\n")],
        {"wrong"},
        "wrong",
        "the image loop stops one short: the last image's logits stay 0",
        mistake="short image loop",
    ),
    "01_cpu_inference.uses_torch": Variant(
        "01_cpu_inference.cpp",
        [
            (
                "#include <cstdint>\n",
                "#include <cstdint>\n#define LIBRARY_HEADER <ATen/ATen.h>\n#include LIBRARY_HEADER\n"
                "namespace lib = at;\n",
            ),
            (
                "    // TODO(lab3/01) begin: y[i][j]",
                "    {\n        auto t = [](const float* p, int64_t r, int64_t c) {\n"
                "            return lib::from_blob(const_cast<float*>(p), {r, c}, lib::kFloat);\n        };\n"
                "        lib::Tensor out_view = t(y, batch, out);\n"
                "        lib::addmm_out(out_view, t(b, 1, out).expand({batch, out}), t(x, batch, in),"
                " t(w, out, in).t());\n"
                "        return;\n    }\n    // TODO(lab3/01) begin: y[i][j]",
            ),
        ],
        {"rule violation"},
        "as compiled, calls at::",
        "ATen's addmm does the layer, reached through an include macro and a namespace alias that a text rule"
        " on `at::` and `#include <ATen` does not see; the compiled object refers to at::_ops::addmm_out",
        mistake="a library does the work",
    ),
    "01_cpu_inference.unrolled_by_8_no_remainder": Variant(
        "01_cpu_inference.cpp",
        [
            (
                "            float acc = b[j];\n"
                "            for (int64_t k = 0; k < in; ++k) {\n"
                "                acc += xi[k] * wj[k];\n"
                "            }\n",
                "            float part[8] = {};  // eight independent sums, so the multiplies overlap\n"
                "            for (int64_t k = 0; k + 8 <= in; k += 8)\n"
                "                for (int u = 0; u < 8; ++u) part[u] += xi[k + u] * wj[k + u];\n"
                "            float acc = b[j] + ((part[0] + part[1]) + (part[2] + part[3])) +\n"
                "                        ((part[4] + part[5]) + (part[6] + part[7]));\n",
            )
        ],
        {"wrong"},
        # 784 and 1000 are multiples of 8: every case of the network's widths passes (another summation
        # order, well within 1e-4); 13 -> 1001 -> 7 loses 5 of fc1's 13 terms and 1 of fc2's 1001
        "13->1001->7",
        "the dot product unrolled by 8 into eight partial sums, with no loop for the in % 8 terms left over",
        mistake="widths not a multiple of the unroll",
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
        mistake="padded last batch",
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
        mistake="transposed weights",
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
        "forgets the bias: every output off by |b[j]|, far past linear's atol of 5e-4",
        mistake="missing bias",
    ),
    "02_cuda_mlp.no_relu": Variant(
        "02_cuda_mlp.cu",
        [("        CUDA_CHECK(relu_inplace(h, rows * HIDDEN));\n", "")],
        {"wrong"},
        "wrong",
        "mlp_predict skips the ReLU between the layers: the trained network's labels differ from torch's on"
        " images that are no near ties (the custom check, first), and the random cases' labels too",
        mistake="missing ReLU",
    ),
    "02_cuda_mlp.argmax_last_tie": Variant(
        "02_cuda_mlp.cu",
        [("        if (r[c] > best) best = r[c], at = c;", "        if (r[c] >= best) best = r[c], at = c;")],
        {"wrong"},
        "wrong",
        "argmax keeps the last of equal values in each lane: the tie rows (small integers) get a higher index"
        " than torch.argmax (only the 1000-class cases: with 10 or 17 classes a lane holds one class)",
        mistake="argmax ties",
    ),
    "02_cuda_mlp.relu_float4_no_remainder": Variant(
        "02_cuda_mlp.cu",
        [
            (
                RELU_KERNEL,
                "__global__ void relu_kernel(float* __restrict__ y, size_t n) {\n"
                "    const size_t stride = (size_t)gridDim.x * blockDim.x;\n"
                "    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;\n"
                "    if (reinterpret_cast<uintptr_t>(y) % 16 == 0) {  // four floats per access where allowed\n"
                "        float4* y4 = reinterpret_cast<float4*>(y);\n"
                "        for (size_t i = first; i < n / 4; i += stride) {\n"
                "            float4 v = y4[i];\n"
                "            v.x = fmaxf(v.x, 0.0f), v.y = fmaxf(v.y, 0.0f);\n"
                "            v.z = fmaxf(v.z, 0.0f), v.w = fmaxf(v.w, 0.0f);\n"
                "            y4[i] = v;\n"
                "        }\n"
                "        return;\n"
                "    }\n"
                "    for (size_t i = first; i < n; i += stride) y[i] = fmaxf(y[i], 0.0f);\n"
                "}\n",
            )
        ],
        {"wrong"},
        # the network's h holds rows·1000 values and the unaligned check's 140 take the scalar loop; the
        # case 7x33->17 gives relu 119 values whose last three are negative, and they stay negative
        "relu_inplace",
        "a float4 ReLU (on aligned pointers) that handles n / 4 groups of four and forgets the n % 4 values after them",
        mistake="widths not a multiple of the vector width",
    ),
    "02_cuda_mlp.relu_float4_assumes_alignment": Variant(
        "02_cuda_mlp.cu",
        [
            (
                RELU_KERNEL,
                "__global__ void relu_kernel(float* __restrict__ y, size_t n) {\n"
                "    const size_t stride = (size_t)gridDim.x * blockDim.x;\n"
                "    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;\n"
                "    float4* y4 = reinterpret_cast<float4*>(y);  // four floats per access\n"
                "    for (size_t i = first; i < n / 4; i += stride) {\n"
                "        float4 v = y4[i];\n"
                "        v.x = fmaxf(v.x, 0.0f), v.y = fmaxf(v.y, 0.0f);\n"
                "        v.z = fmaxf(v.z, 0.0f), v.w = fmaxf(v.w, 0.0f);\n"
                "        y4[i] = v;\n"
                "    }\n"
                "    for (size_t i = n / 4 * 4 + first; i < n; i += stride) y[i] = fmaxf(y[i], 0.0f);  // the rest\n"
                "}\n",
            )
        ],
        {"crash"},
        # every case's h starts on a 512-byte boundary; the check unaligned_pointers gives relu_inplace
        # h + 1 float: the 16-byte loads fault ("misaligned address" during check unaligned_pointers)
        "unaligned",
        "a float4 ReLU with its remainder loop, that casts y to float4* without asking whether y is 16-byte aligned",
        mistake="unaligned pointers",
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
        mistake="transpose mix-up",
    ),
    "03_cublas.epilogue_without_relu": Variant(
        "03_cublas.cu",
        [
            (
                "bias_epilogue ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;",
                "bias_epilogue ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;",
            )
        ],
        {"wrong"},
        # linear_gemmex passes everything; linear_relu_lt's first call, in the check unaligned_pointers
        # (64x256->256), keeps the negative half of y. The mismatch message names the entry point.
        "linear_relu_lt",
        "the BIAS (and DEFAULT) epilogue instead of RELU_BIAS (and RELU): the bias is added, the ReLU never applied",
        mistake="missing ReLU",
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
        mistake="TF32 flag ignored",
    ),
    "03_cublas.bias_never_added": Variant(
        "03_cublas.cu",
        [("    const float beta = 1.0f;  // add to the bias already in y\n", "    const float beta = 0.0f;\n")],
        {"wrong"},
        "past the TF32 bound",
        "beta = 0 overwrites the broadcast bias: y = x·wᵀ without b",
        mistake="missing bias",
    ),
    "03_cublas.lt_in_tf32": Variant(
        "03_cublas.cu",
        [
            (
                "    CUBLAS_CHECK(cublasLtMatmulDescCreate(&lt.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));\n",
                "    CUBLAS_CHECK(cublasLtMatmulDescCreate(&lt.op, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F));\n",
            )
        ],
        {"wrong"},
        # linear_relu_lt must be float32: TF32 is off by about 3e-4 rms at K = 256, against atol 5e-5, in
        # the unaligned check's 64x256->256 or (if no TF32 kernel takes 4-byte-aligned operands) the cases
        "linear_relu_lt",
        "cuBLASLt's operation made with CUBLAS_COMPUTE_32F_FAST_TF32: the contract asks for float32 without TF32",
        mistake="TF32 where float32 was asked",
    ),
    # --- task 04 (cuDNN's graph API)
    "04_cudnn.graph_forgets_relu_output": Variant(
        "04_cudnn.cpp",
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
        mistake="missing ReLU",
    ),
    "04_cudnn.wrong_stride_for_w": Variant(
        "04_cudnn.cpp",
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
        mistake="wrong strides",
    ),
    "04_cudnn.graph_rebuilt_every_call": Variant(
        "04_cudnn.cpp",
        [
            (
                "    auto found = g_linear.find(key);\n    if (found == g_linear.end()) {\n",
                "    auto found = g_linear.end();  // a fresh graph for this call; the map keeps the first one\n"
                "    if (found == g_linear.end()) {\n",
            )
        ],
        {"wrong"},
        # every call validates, lowers, asks the heuristics and compiles a plan again (milliseconds), then
        # runs the graph the map already held: the values are right, linear_graph_is_cached's times are not
        "built again",
        "the graph map is written but never looked up: every call builds its graph and plan again",
        mistake="graph rebuilt every call",
    ),
    "04_cudnn.direct_filter_transposed": Variant(
        "04_cudnn.cu",
        [
            (
                "acc = fmaf(xc[row * W + col], wc[r * S + s], acc);",
                "acc = fmaf(xc[row * W + col], wc[s * R + r], acc);",
            )
        ],
        {"wrong"},
        # in bounds for every R, S (s·R + r < R·S); the trained conv1's 5x5 filters are not symmetric, so
        # the check trained_conv1_matches_torch already fails the direct entry
        "conv2d_bias_relu_direct",
        "the direct kernel reads tap (r, s) of the filter at s·R + r: each filter transposed",
        mistake="filter taps transposed",
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
        # the TF32 entry keeps its ReLU and passes the TF32 check; the SIMT entry's first call, in the
        # check unaligned_pointers (64x784->1000), keeps the negative half of y; its message names the entry.
        # (Only the SIMT alias is edited: with no LinearCombinationRelu left anywhere the source
        # rule would answer `rule violation` first.)
        "linear_relu_cutlass_simt",
        "the SIMT GEMM's epilogue is LinearCombination instead of LinearCombinationRelu: the bias is added,"
        " the ReLU never applied",
        mistake="missing ReLU",
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
        mistake="transpose mix-up",
    ),
    "05_cutlass.tf32_always_wide": Variant(
        "05_cutlass.cu",
        [("    if (wide) return linear_relu<GemmTf32>(", "    if (true) return linear_relu<GemmTf32>(")],
        {"crash"},
        # 1x33->17: lda = 33 and ldd = 17 are not multiples of 4, so can_implement returns
        # kErrorMisalignedOperand, which the entry returns as cudaErrorMisalignedAddress
        "cudaErrorMisalignedAddress",
        "the 4-floats-per-access TF32 kernel used for every shape: can_implement refuses 33 -> 17",
        mistake="widths not a multiple of 4",
    ),
    "05_cutlass.wide_kernel_by_widths_only": Variant(
        "05_cutlass.cu",
        [
            (
                "    const bool wide = in % 4 == 0 && out % 4 == 0 && aligned16(x) && aligned16(w) && aligned16(b) &&"
                " aligned16(y);\n",
                "    const bool wide = in % 4 == 0 && out % 4 == 0;  // rows of 16 bytes: four floats per access\n",
            )
        ],
        {"crash"},
        # every case's pointers are 16-byte aligned; in the check unaligned_pointers (64x784->1000, x at
        # + 1 float) can_implement answers kErrorMisalignedOperand, returned as cudaErrorMisalignedAddress
        "unaligned",
        "the TF32 entry picks the 4-floats-per-access kernel by the widths alone, not by the pointers' alignment",
        mistake="unaligned pointers",
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
        mistake="backward formula",
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
        "and its run with inputs requiring grad fails test_aot_dispatch_dynamic with autograd's 'returned an "
        "invalid gradient at index 1 - got [33, 17] but expected shape compatible with [17, 33]' (CPU stand-in)",
        mistake="backward formula",
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
        mistake="backward formula",
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
        mistake="fake shape",
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
        "the kernel forgets the bias: every output off by |b[j]| ~ N(0, 1), far past atol 5e-4, on the first case",
        mistake="missing bias",
    ),
    "06_extension.products_in_tf32": Variant(
        "06_extension.cu",
        [
            (
                "        for (int kk = 0; kk < TILE; ++kk) acc += xs[ty][kk] * ws[tx][kk];\n",
                "        for (int kk = 0; kk < TILE; ++kk) {\n"
                "            if constexpr (sizeof(T) == 4) {  // both factors rounded to TF32's 10 mantissa bits\n"
                "                const unsigned ua = (__float_as_uint(xs[ty][kk]) + 0x1000u) & 0xffffe000u;\n"
                "                const unsigned uc = (__float_as_uint(ws[tx][kk]) + 0x1000u) & 0xffffe000u;\n"
                "                const float a = __uint_as_float(ua), c = __uint_as_float(uc);\n"
                "                acc += a * c;\n"
                "            } else {\n"
                "                acc += xs[ty][kk] * ws[tx][kk];\n"
                "            }\n"
                "        }\n",
            )
        ],
        {"wrong"},
        "wrong",
        "float32 products of inputs rounded to TF32 (what a tensor-core kernel in TF32 computes; float64 stays"
        " exact, so gradcheck passes): about 3e-4 rms off at K = 784, under the worst-case bound of 2e-3 for"
        " every output of 64x784->1000 (1.4e-3 at most, simulated on the CPU) but past 5e-4 for some 9%",
        mistake="precision downgrade",
    ),
    "06_extension.launch_on_default_stream": Variant(
        "06_extension.cu",
        [
            (
                "    linear_kernel<T><<<grid, block, 0, stream>>>(x, w, b, y, B, in, out);\n",
                "    linear_kernel<T><<<grid, block>>>(x, w, b, y, B, in, out);\n",
            )
        ],
        {"wrong"},
        # the cases, opcheck, gradcheck and compile all run on torch's default stream, which is stream 0:
        # only runs_on_the_callers_stream, on a non-blocking side stream, sees the kernel start before the
        # sleep and the copy of the new x queued ahead of it
        "caller's stream",
        "the kernel launched without its stream argument, on the legacy default stream",
        mistake="wrong stream",
    ),
    "06_extension.synchronizes_in_the_op": Variant(
        "06_extension.cu",
        [
            (
                "    linear_kernel<T><<<grid, block, 0, stream>>>(x, w, b, y, B, in, out);\n"
                "    CUDA_CHECK(cudaGetLastError());\n",
                "    linear_kernel<T><<<grid, block, 0, stream>>>(x, w, b, y, B, in, out);\n"
                "    CUDA_CHECK(cudaGetLastError());\n"
                "    CUDA_CHECK(cudaDeviceSynchronize());  // the kernel's own errors surface here, at the call\n",
            )
        ],
        {"wrong"},
        # right values everywhere, the side stream included (the sync waits for its sleep too); CUDA refuses
        # a device synchronization while torch.cuda.graph captures
        "CUDA graph",
        "the launch waits for the whole device after the kernel, to report the kernel's errors at the call",
        mistake="not capturable",
    ),
    "06_extension.forward_by_aten": Variant(
        "06_extension.cu",
        [
            (
                "#include <cstddef>\n",
                "#include <ATen/ops/addmm.h>\n#include <ATen/ops/from_blob.h>\n\n#include <cstddef>\n",
            ),
            (
                "    linear_kernel<T><<<grid, block, 0, stream>>>(x, w, b, y, B, in, out);\n",
                "    namespace lib = at;  // the product by ATen (cuBLAS), spelled so that no text rule sees it\n"
                "    int device = 0;\n"
                "    CUDA_CHECK(cudaGetDevice(&device));\n"
                "    const auto opts = lib::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value)"
                ".device(c10::Device(c10::DeviceType::CUDA, device));\n"
                "    const auto xt = lib::from_blob(const_cast<T*>(x), {B, in}, opts);\n"
                "    const auto wt = lib::from_blob(const_cast<T*>(w), {out, in}, opts);\n"
                "    const auto bt = lib::from_blob(const_cast<T*>(b), {out}, opts);\n"
                "    auto yt = lib::from_blob(y, {B, out}, opts);\n"
                "    lib::addmm_out(yt, bt, xt, wt.t());\n",
            ),
        ],
        {"rule violation"},
        "as compiled, calls at::_ops::addmm",
        "the launcher wraps the raw pointers as tensors and has ATen's addmm_out (cuBLAS) compute y, through a"
        " namespace alias: the compiled .cu refers to at::_ops::addmm_out",
        mistake="a library does the work",
    ),
    "06_extension.grad_x_by_broadcast": Variant(
        "06_extension.py",
        [
            (
                "        grad_x = linear(grad_y, w.t(), grad_y.new_zeros(w.shape[1]))\n",
                "        grad_x = (grad_y.unsqueeze(2) * w.unsqueeze(0)).sum(1)  # (B, out, 1) * (1, out, in)\n",
            )
        ],
        # right values (gradcheck, opcheck, compile and the training pass), no matmul spelled for a rule
        # on the source to see: backward_calls_the_op counts one lab3ext::linear where two are due. The
        # rules' replacement by checks of the observed run may name it first, as a rule violation
        {"wrong", "rule violation"},
        "lab3ext",
        "grad_x as a broadcast product summed over out, not through torch.ops.lab3ext.linear as the contract asks",
        mistake="backward not through the op",
    ),
    # --- task 07 (faster than PyTorch)
    "07_faster.graph_not_rebuilt_for_new_n": Variant(
        "07_faster.cu",
        [("    auto it = graphs.find(key);\n", "    auto it = graphs.begin();  // any graph will do\n")],
        {"wrong"},
        # weights_read_at_every_call's n = 7 graph is replayed for the TF32 probe's n = 256 (or, where the
        # stale labels happen to match, for graphs_follow_n_and_weights' n = 1 and the whole test set's chunks)
        "labels",
        "the first graph captured is replayed for every n: labels past its n are never written",
        mistake="graph replayed for another n",
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
        mistake="replayed results",
    ),
    "07_faster.lt_in_tf32": Variant(
        "07_faster.cu",
        [
            (
                "    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));\n",
                "    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F));\n",
            )
        ],
        {"wrong"},
        # the in-place check's margins of 1e4 hold in TF32; float32_not_tf32's pixels 1 + 2^-12 become 1,
        # hidden unit 0 becomes 0 and every label 1
        "TF32",
        "the linear layers' cuBLASLt plans compute in TF32 (CUBLAS_COMPUTE_32F_FAST_TF32)",
        mistake="TF32",
    ),
    "07_faster.weights_copied_once": Variant(
        "07_faster.cu",
        [
            (
                "static cudaError_t infer(const Weights& wt, const float* images_host, int n, int64_t* labels_host) {\n"
                "    if (n < 1) return cudaErrorInvalidValue;\n",
                "static cudaError_t infer(const Weights& given, const float* images_host, int n,"
                " int64_t* labels_host) {\n"
                "    if (n < 1) return cudaErrorInvalidValue;\n"
                "    // the model copied into buffers of our own, once per weight address: later calls skip it\n"
                "    static std::map<const float*, float*> kept;\n"
                "    const size_t sizes[2][8] = {\n"
                "        {(size_t)HIDDEN * PIXELS, HIDDEN, (size_t)CLASSES * HIDDEN, CLASSES},\n"
                "        {CONV1 * 25, CONV1, CONV2 * CONV1 * 25, CONV2, (size_t)HIDDEN * FEATURES, HIDDEN,\n"
                "         (size_t)CLASSES * HIDDEN, CLASSES}};\n"
                "    Weights wt = given;\n"
                "    for (int i = 0; i < (given.net == CNN ? 8 : 4); ++i) {\n"
                "        float*& copy = kept[given.w[i]];\n"
                "        if (copy == nullptr) {\n"
                "            const size_t bytes = sizes[given.net][i] * sizeof(float);\n"
                "            CUDA_CHECK(cudaMalloc(&copy, bytes));\n"
                "            CUDA_CHECK(cudaMemcpy(copy, given.w[i], bytes, cudaMemcpyDeviceToDevice));\n"
                "        }\n"
                "        wt.w[i] = copy;\n"
                "    }\n",
            )
        ],
        {"wrong"},
        # new addresses get new copies (the cases, graphs_follow_n_and_weights' moved weights): only a
        # change in place, in weights_read_at_every_call, is missed, and every label stays 5
        "in place",
        "the weights copied once per address into buffers of its own: values changed in place are never seen",
        mistake="weights snapshotted",
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
    [
        "01_cpu_inference.uses_torch",
        "02_cuda_mlp.argmax_last_tie",
        "06_extension.no_bias",
    ],
    [
        "01_cpu_inference.unrolled_by_8_no_remainder",
        "02_cuda_mlp.relu_float4_no_remainder",
        "03_cublas.lt_in_tf32",
        "06_extension.launch_on_default_stream",
    ],
    [
        "02_cuda_mlp.relu_float4_assumes_alignment",
        "05_cutlass.wide_kernel_by_widths_only",
        "06_extension.synchronizes_in_the_op",
    ],
    ["04_cudnn.direct_filter_transposed", "07_faster.weights_copied_once"],
    ["04_cudnn.graph_rebuilt_every_call", "06_extension.grad_x_by_broadcast", "07_faster.lt_in_tf32"],
    ["06_extension.forward_by_aten"],
    ["06_extension.products_in_tf32"],
]
SANITIZED: list[str] = []
AT_BUILD: list[str] = []
HUGE: list[str] = []
TIMED: list[str] = ["07_faster.labels_from_previous_call"]  # caught only by the timed rotation
