"""Lab 5's given operator definitions (lab5/kiln_llm/ops.py): the types they infer, the rules they
enforce and the messages that name them, the text form's round trip of their attributes. CPU only;
no kernel runs (the student's kiln_llm/cpu.py is imported by the package, never called)."""

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
from kiln import ops  # noqa: E402
from kiln.ir import DType, TensorType  # noqa: E402
from kiln.shapes import ShapeError, infer_node  # noqa: E402
from kiln.text import parse, to_text  # noqa: E402

F32, F16, BF16, I64 = DType.float32, DType.float16, DType.bfloat16, DType.int64


def tt(*shape: int, dtype: DType = F32) -> TensorType:
    return TensorType(shape, dtype)


POS = tt(1, dtype=I64)
FREQ = tt(8, dtype=F32)  # head_dim 16


@pytest.mark.parametrize(
    ("op", "inputs", "attrs", "out"),
    [
        ("embedding", [tt(50, 32, dtype=BF16), tt(7, dtype=I64)], {}, tt(7, 32, dtype=BF16)),
        ("rmsnorm", [tt(7, 32, dtype=F16), tt(32, dtype=F16)], {"eps": 1e-5}, tt(7, 32, dtype=F16)),
        ("rmsnorm", [tt(2, 3, 32), tt(32)], {"eps": 1e-6}, tt(2, 3, 32)),
        ("linear", [tt(7, 32), tt(96, 32)], {}, tt(7, 96)),
        ("linear_add", [tt(1, 96), tt(32, 96), tt(1, 32)], {}, tt(1, 32)),
        (
            "linear_swiglu",
            [tt(7, 32, dtype=BF16), tt(64, 32, dtype=BF16), tt(64, 32, dtype=BF16)],
            {},
            tt(7, 64, dtype=BF16),
        ),
        ("rope", [tt(7, 4, 16, dtype=F16), POS, FREQ], {"layout": "half"}, tt(7, 4, 16, dtype=F16)),
        ("rope", [tt(1, 2, 16), POS, FREQ], {"layout": "interleaved"}, tt(1, 2, 16)),
        ("kv_update", [tt(64, 2, 16), tt(7, 2, 16), POS], {}, tt(64, 2, 16)),
        ("attention", [tt(7, 8, 16), tt(64, 2, 16), tt(64, 2, 16), POS], {"scale": 0.25}, tt(7, 8, 16)),
        ("attention", [tt(1, 4, 16), tt(64, 4, 16), tt(64, 4, 16), POS], {"scale": 0.25}, tt(1, 4, 16)),
    ],
)
def test_rules_kept(op, inputs, attrs, out):
    assert infer_node("t0", op, inputs, attrs) == out


@pytest.mark.parametrize(
    ("op", "inputs", "attrs", "words"),
    [
        ("embedding", [tt(50, 32), tt(7)], {}, ["tokens", "i64[T]"]),
        ("embedding", [tt(50, 32), tt(1, 7, dtype=I64)], {}, ["tokens", "i64[T]"]),
        ("embedding", [tt(50), tt(7, dtype=I64)], {}, ["table", "rank 2"]),
        ("embedding", [tt(50, 32, dtype=I64), tt(7, dtype=I64)], {}, ["float"]),
        ("rmsnorm", [tt(7, 32), tt(16)], {"eps": 1e-5}, ["f32[16]", "f32[32]", "last dimension"]),
        ("rmsnorm", [tt(7, 32), tt(32, dtype=F16)], {"eps": 1e-5}, ["dtypes differ"]),
        ("rmsnorm", [tt(7, 32), tt(32)], {"eps": 0.0}, ["eps", "positive"]),
        ("rmsnorm", [tt(7, 32), tt(32)], {"eps": True}, ["eps"]),
        ("linear", [tt(7, 32), tt(96, 16)], {}, ["in-features differ", "32 != 16", "[out, in]"]),
        ("linear", [tt(7, 32), tt(32)], {}, ["rank 2"]),
        ("linear", [tt(2, 7, 32), tt(96, 32)], {}, ["rank 2"]),
        ("linear", [tt(7, 32, dtype=F16), tt(96, 32)], {}, ["dtypes differ"]),
        ("linear_add", [tt(7, 32), tt(96, 32), tt(7, 32)], {}, ["residual", "f32[7, 96]"]),
        ("linear_swiglu", [tt(7, 32), tt(64, 32), tt(48, 32)], {}, ["one shape"]),
        ("rope", [tt(7, 4, 15), POS, tt(7)], {"layout": "half"}, ["even"]),
        ("rope", [tt(7, 64), POS, FREQ], {"layout": "half"}, ["rank 3"]),
        ("rope", [tt(7, 4, 16), POS, tt(16)], {"layout": "half"}, ["inv_freq", "f32[8]"]),
        ("rope", [tt(7, 4, 16, dtype=F16), POS, tt(8, dtype=F16)], {"layout": "half"}, ["inv_freq", "f32[8]"]),
        ("rope", [tt(7, 4, 16), tt(1), FREQ], {"layout": "half"}, ["pos", "i64[1]"]),
        ("rope", [tt(7, 4, 16), tt(2, dtype=I64), FREQ], {"layout": "half"}, ["pos", "i64[1]"]),
        ("rope", [tt(7, 4, 16), POS, FREQ], {"layout": "gptj"}, ["layout", "'half'", "'interleaved'"]),
        ("kv_update", [tt(64, 2, 16), tt(7, 4, 16), POS], {}, ["[2, 16]"]),
        ("kv_update", [tt(4, 2, 16), tt(7, 2, 16), POS], {}, ["do not fit"]),
        ("kv_update", [tt(64, 2, 16, dtype=F16), tt(7, 2, 16), POS], {}, ["dtypes differ"]),
        ("kv_update", [tt(64, 2, 16), tt(7, 2, 16), tt(1)], {}, ["pos", "i64[1]"]),
        ("attention", [tt(7, 6, 16), tt(64, 4, 16), tt(64, 4, 16), POS], {"scale": 0.25}, ["6 query heads", "4 kv"]),
        ("attention", [tt(7, 8, 32), tt(64, 2, 16), tt(64, 2, 16), POS], {"scale": 0.25}, ["head_dim", "32 != 16"]),
        ("attention", [tt(7, 8, 16), tt(64, 2, 16), tt(32, 2, 16), POS], {"scale": 0.25}, ["one shape"]),
        ("attention", [tt(70, 8, 16), tt(64, 2, 16), tt(64, 2, 16), POS], {"scale": 0.25}, ["70 queries", "64 rows"]),
        ("attention", [tt(7, 8, 16), tt(64, 2, 16), tt(64, 2, 16), POS], {"scale": "0.25"}, ["scale", "number"]),
        ("attention", [tt(7, 8, 16), tt(64, 2, 16), tt(64, 2, 16), POS], {}, ["missing", "scale"]),
        ("attention", [tt(7, 8, 16), tt(64, 2, 16), tt(64, 2, 16)], {"scale": 0.25}, ["takes 4 inputs"]),
    ],
)
def test_rules_broken(op, inputs, attrs, words):
    with pytest.raises(ShapeError) as err:
        infer_node("t7", op, inputs, attrs)
    message = str(err.value)
    assert message.startswith(f"%t7 ({op}): "), message
    for w in words:
        assert w in message, message


def test_views_and_arity():
    assert ops.get("kv_update").view_of == 0
    for name in ("embedding", "rmsnorm", "linear", "linear_add", "linear_swiglu", "rope", "attention"):
        assert ops.get(name).view_of is None, name
    arity = {"embedding": 2, "rmsnorm": 2, "linear": 2, "linear_add": 3, "linear_swiglu": 3}
    arity |= {"rope": 3, "kv_update": 3, "attention": 4}
    for name, n in arity.items():
        assert ops.get(name).arity == n, name


def test_a_layer_round_trips_through_text():
    """Every lab 5 operator in one graph: the text form prints the float and string attributes
    and parses them back to the same graph."""
    b = kiln.Builder("layer")
    tokens, pos = b.input("tokens", (3,), "int64"), b.input("pos", (1,), "int64")
    x = b.op("embedding", b.constant("emb", torch.randn(10, 32)), tokens)
    h = b.op("rmsnorm", x, b.constant("norm", torch.ones(32)), eps=1e-5)
    q = b.op(
        "rope",
        b.op("linear", h, b.constant("wq", torch.randn(32, 32))).reshape(3, 2, 16),
        pos,
        b.constant("rope.inv_freq", torch.rand(8)),
        layout="interleaved",
    )
    cache = b.op("kv_update", b.buffer("k_cache", (8, 2, 16)), q, pos)
    a = b.op("attention", q, cache, cache, pos, scale=0.25).reshape(3, 32)
    y = b.op("linear_add", a, b.constant("wo", torch.randn(32, 32)), x)
    w1, w3 = b.constant("w1", torch.randn(48, 32)), b.constant("w3", torch.randn(48, 32))
    g = b.output(b.op("linear_swiglu", y, w1, w3))
    text = to_text(g)
    assert 'layout = "interleaved"' in text and "eps = 1e-05" in text and "scale = 0.25" in text, text
    assert to_text(parse(text)) == text


def appended(read_after: bool) -> kiln.Graph:
    """One decode step through the fused attention_append, which writes both caches and returns
    the attention; `read_after` adds a node that reads the key cache after that write."""
    b = kiln.Builder("append")
    q, k, v = b.input("q", (1, 4, 16)), b.input("k", (1, 2, 16)), b.input("v", (1, 2, 16))
    pos, freq = b.input("pos", (1,), "int64"), b.constant("rope.inv_freq", torch.rand(8))
    kc, vc = b.buffer("k_cache", (8, 2, 16)), b.buffer("v_cache", (8, 2, 16))
    a = b.op("attention_append", q, k, v, kc, vc, pos, freq, scale=0.25, layout="half")
    return b.output(a, *([b.op("attention", q, kc, vc, pos, scale=0.25)] if read_after else []))


def test_hidden_cache_writes_are_printed_and_checked():
    """The fused attention writes the caches but returns the attention: the text form says the
    writes, and a read of a cache after them is refused as a read of contents already overwritten."""
    for name, writes in {"kv_update": (0,), "rope_kv_update": (0,), "attention_append": (3, 4)}.items():
        assert ops.get(name).writes == writes, name
    assert ops.get("attention_append_qkv").writes == (1, 2)
    text = to_text(appended(read_after=False))
    (line,) = [x for x in text.splitlines() if "attention_append" in x]
    assert line.endswith("  # writes %k_cache, %v_cache"), line
    assert to_text(parse(text)) == text  # the comment is for the reader: the parser skips it
    with pytest.raises(kiln.IRError, match=r"%t1 \(attention\) reads %k_cache.*%t0 \(attention_append\)"):
        appended(read_after=True).validate()


def test_builder_names_the_node_of_a_bad_layer():
    b = kiln.Builder("bad")
    x = b.input("x", (3, 32), "float32")
    with pytest.raises(ShapeError, match=r"%t0 \(linear\): x f32\[3, 32\] times w.T"):
        b.op("linear", x, b.constant("wq", torch.randn(32, 16)))
