"""Lab 5's given code generator (lab5/kiln_llm/codegen.py): the `fused` operator's program format
and shape rule, its CPU kernel, the structure its kernels are keyed by, the meta array, the CUDA
source for each dtype (built with nvcc where there is one; no GPU needed), and the compilation
cache, including two broken caches the checks must catch (keyed by name: always a miss; keyed by
the operations only: an f16 node reuses the f32 kernel)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
for lab in ("lab4", "lab5"):
    if str(ROOT / lab) not in sys.path:
        sys.path.insert(0, str(ROOT / lab))

import kiln  # noqa: E402 (after the path set-up above)
import kiln_llm  # noqa: E402, F401 (registers lab 5's operators)
from kiln.ir import DType, Node, TensorType  # noqa: E402
from kiln.runtime import KilnRunError  # noqa: E402
from kiln.shapes import ShapeError, infer_node  # noqa: E402
from kiln_llm import codegen  # noqa: E402


def fused(shapes, program, dtype="float32", name="f"):
    """A `fused` node over inputs of `shapes`, built (and type-checked) by kiln's Builder."""
    b = kiln.Builder(name)
    xs = [b.input(f"{name}{i}", s, dtype) for i, s in enumerate(shapes)]
    y = b.op("fused", *xs, program=program)
    b.output(y)
    return y.node


# --- the program ------------------------------------------------------------------------------------


def test_program_round_trip():
    prog = [("mul", (0, 1)), ("add", (3, 2)), ("silu", (4,)), ("relu", (5,)), ("add", (6, 0))]
    text = codegen.format_program(prog)
    assert text == "mul $0 $1; add $3 $2; silu $4; relu $5; add $6 $0"
    assert codegen.parse_program(text, 3) == prog
    assert codegen.parse_program("  mul $0   $1 ;silu $2", 2) == [("mul", (0, 1)), ("silu", (2,))]


@pytest.mark.parametrize(
    ("text", "n", "words"),
    [
        ("", 1, "string"),
        (["mul", 0, 1], 2, "string"),
        ("tanh $0", 1, "unknown operation 'tanh'"),
        ("mul $0", 1, "mul takes 2 values"),
        ("silu $1", 1, "reads $1"),
        ("add $0 $0; mul $1 $2", 1, "reads $2"),
        ("silu x", 1, "not a value"),
        ("silu $0", 2, "never reads input(s) $1"),
    ],
)
def test_bad_programs(text, n, words):
    with pytest.raises(ShapeError, match=None) as e:
        codegen.parse_program(text, n)
    assert words in str(e.value)


def test_infer_broadcasts_and_checks():
    f32, f16 = DType.float32, DType.float16
    ty = infer_node("t", "fused", [TensorType((4, 1, 8), f32), TensorType((3, 1), f32)], {"program": "add $0 $1"})
    assert ty == TensorType((4, 3, 8), f32)
    ty = infer_node("t", "fused", [TensorType((5,), f16)], {"program": "silu $0; exp $1; neg $2"})
    assert ty == TensorType((5,), f16)
    with pytest.raises(ShapeError, match="dtypes differ"):
        infer_node("t", "fused", [TensorType((5,), f16), TensorType((5,), f32)], {"program": "add $0 $1"})
    with pytest.raises(ShapeError, match="float"):
        infer_node("t", "fused", [TensorType((5,), DType.int64)], {"program": "relu $0"})
    with pytest.raises(ShapeError, match="do not broadcast"):
        infer_node("t", "fused", [TensorType((2, 3), f32), TensorType((4, 3), f32)], {"program": "mul $0 $1"})
    with pytest.raises(ShapeError, match="%t"):
        infer_node("t", "fused", [TensorType((5,), f32)], {"program": "relu $3"})
    with pytest.raises(ShapeError):
        infer_node("t", "fused", [], {"program": "relu $0"})


def test_text_form_round_trip():
    node = fused([(2, 3), (3,)], "mul $0 $1; silu $2", "float16")
    text = kiln.to_text(_graph_of(node))
    assert 'fused(%f0, %f1) {program = "mul $0 $1; silu $2"} : f16[2, 3]' in text
    assert kiln.to_text(kiln.parse(text)) == text


def _graph_of(node: Node) -> kiln.Graph:
    g = kiln.Graph("g", nodes=[*node.inputs, node], outputs=[node])
    g.validate()
    return g


# --- the CPU kernel -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cpu_kernel_computes_in_f32_and_rounds_once(dtype):
    g = torch.Generator().manual_seed(0)
    x, y, z = (torch.randn(s, generator=g).to(dtype) for s in [(2, 1, 5), (3, 1), (5,)])
    node = fused([(2, 1, 5), (3, 1), (5,)], "mul $0 $1; sub $3 $2; silu $4; relu $5; exp $0; add $6 $7; neg $8", dtype)
    got = codegen.fused_cpu(node, [x, y, z])
    xf, yf, zf = x.float(), y.float(), z.float()
    want = -(torch.relu(torch.nn.functional.silu(xf * yf - zf)) + torch.exp(xf))
    assert got.dtype == dtype and got.shape == (2, 3, 5) and got.is_contiguous()
    assert torch.equal(got, want.to(dtype))


# --- the structure, the meta and the source ---------------------------------------------------------------


def test_structure_ignores_names_and_shapes_but_not_dtype_program_or_broadcasting():
    a = fused([(4, 8), (4, 8)], "mul $0 $1; silu $2", name="a")
    b = fused([(2, 3, 5), (2, 3, 5)], "mul $0  $1;silu $2", name="b")
    assert codegen.structure_of(a) == codegen.structure_of(b)
    assert codegen.structure_of(a).key == codegen.structure_of(b).key
    others = [
        fused([(4, 8), (4, 8)], "mul $0 $1; silu $2", "float16"),
        fused([(4, 8), (4, 8)], "add $0 $1; silu $2"),
        fused([(4, 8), (4, 8)], "mul $1 $0; silu $2"),
        fused([(4, 8), (8,)], "mul $0 $1; silu $2"),
        fused([(8,), (4, 8)], "mul $0 $1; silu $2"),
    ]
    keys = {codegen.structure_of(n).key for n in [a, *others]}
    assert len(keys) == 1 + len(others)
    # a leading 1 is not a broadcast: (1, 4, 8) reads like (4, 8)
    c = fused([(1, 4, 8), (4, 8)], "mul $0 $1; silu $2", name="c")
    assert codegen.structure_of(c).dense == (True, True)


def test_fused_meta_matches_torch_broadcasting():
    out = (2, 3, 4, 5)
    for shape in [(2, 3, 4, 5), (3, 1, 5), (5,), (1,), (2, 1, 4, 1), (4, 1)]:
        meta = codegen.fused_meta(out, [shape])
        assert meta[:4] == list(out)
        strides = meta[4:]
        want = torch.arange(torch.Size(shape).numel()).reshape(shape).expand(out)
        flat = torch.arange(torch.Size(shape).numel())
        got = torch.as_strided(flat, out, strides)
        assert torch.equal(got, want), shape
    assert codegen.fused_meta((3,), [(3,), (1,)]) == [1, 1, 1, 3, 3, 3, 3, 1, 1, 1, 1, 0]


@pytest.mark.parametrize(
    ("dtype", "ctype", "conv"),
    [("float32", "typedef float T;", "return v;"), ("float16", "__half", "__float2half_rn"),
     ("bfloat16", "__nv_bfloat16", "__float2bfloat16_rn")],
)  # fmt: skip
def test_source_text(dtype, ctype, conv):
    dense = fused([(4, 8), (4, 8)], "mul $0 $1; silu $2", dtype)
    src = codegen.kernel_source(dense)
    s = codegen.structure_of(dense)
    assert f"COURSE_API cudaError_t {s.symbol}(void* out, const void* const* ins, const int64_t* meta" in src
    assert ctype in src and conv in src
    assert "load(a.in[0][i])" in src and "load(a.in[1][i])" in src
    assert "int64_t i3" not in src, "no input broadcasts: no index arithmetic"
    assert "v2 / (1.0f + expf(-v2))" in src
    assert ("cuda_fp16.h" in src) == (dtype == "float16") and ("cuda_bf16.h" in src) == (dtype == "bfloat16")
    bcast = codegen.kernel_source(fused([(4, 8), (8,)], "mul $0 $1; silu $2", dtype))
    assert "load(a.in[0][i])" in bcast and "a.stride[1][3]" in bcast and "a.stride[0]" not in bcast


# --- building and the cache (nvcc, no GPU) ----------------------------------------------------------------


def _nvcc() -> None:
    from grader import toolchain

    try:
        toolchain.find_nvcc()
    except toolchain.ToolchainError as e:
        pytest.skip(f"no nvcc here: {e}")


def check_cache() -> None:
    """What lab5/tests/test_04_fusion.py checks of the cache, on nodes built by hand."""
    a = fused([(4, 64), (4, 64)], "mul $0 $1; silu $2", name="a")
    b = fused([(2, 3, 8), (2, 3, 8)], "mul $0 $1; silu $2", name="b")
    c = fused([(4, 64), (4, 64)], "mul $0 $1; silu $2", "float16", name="c")
    d = fused([(4, 64), (4, 64)], "add $0 $1; silu $2", name="d")
    for n, name in zip((a, b, c, d), "abcd", strict=True):
        n.name = f"{name}_out"  # (the builder names every one %t0)
    codegen.clear_cache()
    fa, fc = codegen.compile_many([a, c])
    assert codegen.cache_stats() == (0, 2)
    assert codegen.compile_fused(b) is fa
    assert codegen.cache_stats() == (1, 2)
    assert fc is not fa
    assert codegen.compile_fused(d) not in (fa, fc)
    assert codegen.cache_stats() == (1, 3)


def test_cache_hits_by_structure():
    _nvcc()
    check_cache()


@pytest.mark.parametrize(
    "key",
    [
        pytest.param(lambda node: node.name, id="keyed_by_name"),
        pytest.param(lambda node: codegen.structure_of(node).program, id="keyed_by_ops_only"),
    ],
)
def test_broken_caches_are_caught(monkeypatch, key):
    _nvcc()
    monkeypatch.setattr(codegen, "cache_key", key)
    try:
        with pytest.raises(AssertionError):
            check_cache()
    finally:
        codegen.clear_cache()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_generated_kernels_build(dtype):
    """Every op, dense and broadcast inputs, rank 1 to 4: the source compiles and exports its symbol."""
    _nvcc()
    nodes = [
        fused(
            [(2, 3, 4, 5), (3, 1, 5), (5,)], "mul $0 $1; sub $3 $2; silu $4; relu $5; exp $0; add $6 $7; neg $8", dtype
        ),
        fused([(7,)], "relu $0", dtype),
    ]
    fns = codegen.compile_many(nodes)  # one file, one library
    assert all(callable(f) for f in fns) and fns[0] is not fns[1]


def test_build_failure_names_the_node(monkeypatch, tmp_path):
    _nvcc()
    monkeypatch.setattr(codegen, "source_dir", lambda: tmp_path)
    monkeypatch.setattr(codegen, "source_file", lambda structures: "this is not CUDA\n")
    node = fused([(3,)], "neg $0", name="broken")  # the builder names the node %t0
    codegen.clear_cache()
    with pytest.raises(KilnRunError, match=r"%t0 \(fused\) 'neg \$0': building .* failed: .*error"):
        codegen.compile_fused(node)
    codegen.clear_cache()
