"""Lab 4's given front half of kiln: shape inference and its messages, the builder, the text form
(exact round trips and every parse error), and the order of a buffer's reads and writes that
Graph.validate checks. CPU only; the student's modules are not imported."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

LAB4 = Path(__file__).resolve().parents[1] / "lab4"
if str(LAB4) not in sys.path:
    sys.path.insert(0, str(LAB4))

import kiln  # noqa: E402 (after the path set-up above)
from kiln import ops  # noqa: E402
from kiln.ir import DType, IRError, TensorType  # noqa: E402
from kiln.shapes import ShapeError, broadcast_shapes, check_graph, infer_node  # noqa: E402
from kiln.text import ParseError, parse, to_text  # noqa: E402

F32 = DType.float32


def tt(*shape: int, dtype: DType = F32) -> TensorType:
    return TensorType(shape, dtype)


# --- broadcasting and shape inference ---------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "out"),
    [
        ((3, 5), (3, 5), (3, 5)),
        ((1, 5), (3, 1), (3, 5)),
        ((4, 1, 8), (3, 1), (4, 3, 8)),
        ((5,), (2, 3, 5), (2, 3, 5)),
        ((1,), (7,), (7,)),
        ((2, 1, 4, 1), (1, 3, 1, 5), (2, 3, 4, 5)),
    ],
)
def test_broadcast_shapes(a, b, out):
    assert broadcast_shapes(a, b) == out
    assert broadcast_shapes(b, a) == out


@pytest.mark.parametrize(("a", "b"), [((2, 3), (4, 3)), ((3,), (4,)), ((3, 5), (3,)), ((2, 2), (3, 3, 2))])
def test_broadcast_shapes_rejects(a, b):
    with pytest.raises(ShapeError, match="do not broadcast"):
        broadcast_shapes(a, b)


def test_matmul_error_names_node_rule_and_shapes():
    with pytest.raises(ShapeError) as err:
        infer_node("t3", "matmul", [tt(4, 784), tt(1000, 10)], {})
    assert str(err.value) == "%t3 (matmul): inner dimensions differ: f32[4, 784] @ f32[1000, 10]: 784 != 1000"
    assert err.value.node == "%t3 (matmul)"


@pytest.mark.parametrize(
    ("op", "inputs", "attrs", "words"),
    [
        ("add", [tt(2, 3), tt(2, 3, dtype=DType.float16)], {}, ["dtypes differ", "f32[2, 3]", "f16[2, 3]"]),
        ("add", [tt(2, 3), tt(4, 3)], {}, ["do not broadcast", "[2, 3]", "[4, 3]"]),
        ("matmul", [tt(4, 8, dtype=DType.int64), tt(8, 2, dtype=DType.int64)], {}, ["float"]),
        ("matmul", [tt(8), tt(8, 2)], {}, ["rank >= 2"]),
        ("matmul", [tt(2, 4, 8), tt(3, 8, 2)], {}, ["batch dimensions", "[2]", "[3]"]),
        ("relu", [tt(3, dtype=DType.int64)], {}, ["float"]),
        ("reshape", [tt(2, 3)], {"shape": [4, 2]}, ["element counts differ", "6 != 8"]),
        ("reshape", [tt(2, 3)], {"shape": [1, 1, 1, 2, 3]}, ["rank 1 to 4"]),
        ("reshape", [tt(2, 3)], {"shape": "6"}, ["list of ints"]),
        ("permute", [tt(2, 3, 4)], {"dims": [0, 1, 1]}, ["permutation"]),
        ("permute", [tt(2, 3)], {"dims": [0, 1, 2]}, ["permutation"]),
        ("slice", [tt(4, 6)], {"starts": [0], "ends": [2]}, ["one (start, end) pair"]),
        ("slice", [tt(4, 6)], {"starts": [0, 3], "ends": [2, 3]}, ["axis 1", "[3, 3)"]),
        ("slice", [tt(4, 6)], {"starts": [0, 0], "ends": [5, 6]}, ["axis 0", "<= 4"]),
        ("slice", [tt(4, 6)], {"starts": [-1, 0], "ends": [2, 6]}, ["axis 0"]),
        ("slice_update", [tt(4, 6), tt(6), tt(2, dtype=DType.int64)], {}, ["ranks differ"]),
        ("slice_update", [tt(4, 6), tt(1, 7), tt(2, dtype=DType.int64)], {}, ["larger"]),
        ("slice_update", [tt(4, 6), tt(1, 6), tt(2)], {}, ["i64[2]"]),
        ("slice_update", [tt(4, 6), tt(1, 6), tt(3, dtype=DType.int64)], {}, ["i64[2]"]),
        ("add", [tt(2)], {}, ["takes 2 inputs"]),
        ("permute", [tt(2, 3)], {}, ["missing", "dims"]),
        ("relu", [tt(2)], {"alpha": 1}, ["unknown", "alpha"]),
    ],
)
def test_rules_broken(op, inputs, attrs, words):
    with pytest.raises(ShapeError) as err:
        infer_node("t7", op, inputs, attrs)
    message = str(err.value)
    assert message.startswith(f"%t7 ({op}): "), message
    for w in words:
        assert w in message, message


@pytest.mark.parametrize(
    ("op", "inputs", "attrs", "out"),
    [
        ("add", [tt(4, 1, 8), tt(3, 1)], {}, tt(4, 3, 8)),
        ("matmul", [tt(2, 1, 4, 8), tt(3, 8, 5)], {}, tt(2, 3, 4, 5)),
        ("matmul", [tt(5, 4, 8), tt(8, 2)], {}, tt(5, 4, 2)),
        ("silu", [tt(3, dtype=DType.bfloat16)], {}, tt(3, dtype=DType.bfloat16)),
        ("reshape", [tt(2, 3, 4)], {"shape": [24]}, tt(24)),
        ("permute", [tt(2, 3, 4)], {"dims": [2, 0, 1]}, tt(4, 2, 3)),
        ("slice", [tt(4, 6)], {"starts": [1, 0], "ends": [3, 6]}, tt(2, 6)),
        ("slice_update", [tt(4, 6), tt(1, 6), tt(2, dtype=DType.int64)], {}, tt(4, 6)),
    ],
)
def test_rules_kept(op, inputs, attrs, out):
    assert infer_node("t0", op, inputs, attrs) == out


def test_views_are_declared():
    assert ops.get("reshape").view_of == 0
    assert ops.get("slice_update").view_of == 0
    for name in ("add", "mul", "matmul", "relu", "silu", "permute", "slice"):
        assert ops.get(name).view_of is None
    for name in ("input", "constant", "buffer"):
        assert ops.get(name).arity == 0 and ops.get(name).attrs == ("name",)


# --- the builder --------------------------------------------------------------------------------


def mlp() -> kiln.Graph:
    b = kiln.Builder("mlp")
    x = b.input("x", (4, 784), "float32")
    w1 = b.constant("fc1.weight", torch.randn(1000, 784))
    h = (x @ w1.permute(1, 0) + torch.randn(1000)).relu()
    w2 = b.constant("fc2.weight", torch.randn(10, 1000))
    return b.output(h @ w2.permute(1, 0))


def everything() -> kiln.Graph:
    """Every core operator once, a buffer updated at run-time offsets, two outputs."""
    b = kiln.Builder("every op")
    x = b.input("x", (2, 3, 4), "f16")
    cache = b.buffer("kv cache", (2, 8, 4), torch.float16)
    pos = b.input("pos", (3,), "int64")
    y = (x * 0.5 + x).silu()[:, 1:3]  # (2, 2, 4)
    cache = cache.slice_update(y, pos)  # (2, 8, 4)
    z = cache.reshape(16, 4).relu() @ b.constant("w", torch.randn(4, 3, dtype=torch.float16))
    return b.output(z.permute(1, 0), cache)


def fibonacci(levels: int) -> kiln.Graph:
    """The deep shared DAG: t[i] = t[i-1] + t[i-2], each node read by the next two."""
    b = kiln.Builder("fib")
    prev, cur = b.input("a", (8,), "float32"), b.input("b", (8,), "float32")
    for _ in range(levels):
        prev, cur = cur, prev + cur
    return b.output(cur)


def test_builder_builds_a_valid_graph():
    g = mlp()
    g.validate()
    check_graph(g)
    assert [n.name for n in g.nodes] == [
        "x",
        "fc1.weight",
        "t0",
        "t1",
        "const0",
        "t2",
        "t3",
        "fc2.weight",
        "t4",
        "t5",
    ]
    assert g.outputs == [g.node("t5")]
    assert g.node("t5").type == tt(4, 10)
    assert set(g.constants) == {"fc1.weight", "const0", "fc2.weight"}
    assert g.node("const0").type == tt(1000)


def test_builder_names_and_operands():
    g = everything()
    assert g.name == "every_op"
    assert g.node("kv_cache").attrs == {"name": "kv cache"}
    const = g.node("const0")  # 0.5 became a one-element constant of x's dtype
    assert const.type == tt(1, dtype=DType.float16)
    assert g.constants["const0"].item() == 0.5
    assert g.node("t3").attrs == {"starts": [0, 1, 0], "ends": [2, 3, 4]}
    assert [o.type for o in g.outputs] == [tt(3, 16, dtype=DType.float16), tt(2, 8, 4, dtype=DType.float16)]


def test_builder_reflected_operands():
    b = kiln.Builder("r")
    x = b.input("x", (2, 3))
    y = torch.ones(3) + x
    z = 2.0 * y
    w = torch.ones(4, 2) @ z
    b.output(w)
    assert [n.op for n in b.graph.nodes] == ["input", "constant", "add", "constant", "mul", "constant", "matmul"]
    assert y.node.inputs[1] is x.node and w.shape == (4, 3)


def test_builder_indexing():
    b = kiln.Builder("i")
    x = b.input("x", (4, 5, 6))
    assert x[1:3].shape == (2, 5, 6)
    assert x[-1].shape == (1, 5, 6)  # an int keeps its axis
    assert x[:, 2:, :-1].node.attrs == {"starts": [0, 2, 0], "ends": [4, 5, 5]}
    for bad in (slice(0, 4, 2), (0, 0, 0, 0), 4, 1.5):
        with pytest.raises(IRError):
            x[bad]
    with pytest.raises(ShapeError):
        x[3:3]


def test_builder_reshape_permute():
    b = kiln.Builder("r")
    x = b.input("x", (4, 6))
    assert x.reshape(2, -1, 3).shape == (2, 4, 3)
    assert x.reshape((24,)).shape == (24,)
    assert x.permute(1, 0).shape == (6, 4)
    assert x.permute([1, 0]).node.attrs == {"dims": [1, 0]}
    with pytest.raises(IRError):
        x.reshape(-1, -1)
    with pytest.raises(IRError):
        x.reshape(5, -1)


def test_builder_errors_at_the_line_that_built():
    b = kiln.Builder("e")
    x = b.input("x", (4, 784))
    w = b.input("w", (1000, 10))
    with pytest.raises(ShapeError, match=r"%t0 \(matmul\): inner dimensions differ"):
        x @ w
    with pytest.raises(ShapeError, match="dtypes differ"):
        x + b.input("i", (784,), "i64")
    with pytest.raises(IRError, match="taken"):
        b.input("x", (1,))
    with pytest.raises(IRError, match="taken"):
        b.buffer("x", (1,))  # sanitized names collide too
    with pytest.raises(ShapeError, match="must be a buffer"):
        x.slice_update(x[0:1], b.input("o", (2,), "int64"))
    other = kiln.Builder("other").input("y", (4, 784))
    with pytest.raises(IRError, match="another graph"):
        x + other
    with pytest.raises(IRError, match="operand"):
        x + "one"
    with pytest.raises(IRError, match="unknown dtype"):
        b.input("q", (1,), "f64")
    with pytest.raises(IRError, match="rank"):
        b.input("r", (1, 1, 1, 1, 1))
    with pytest.raises(IRError, match="unknown operator"):
        b.op("gelu", x)
    with pytest.raises(IRError):
        b.op("input", x)


def test_builder_output_checks():
    b = kiln.Builder("o")
    with pytest.raises(IRError, match="no output"):
        b.output()
    x = b.input("x", (2,))
    assert b.output(x, x.relu()).outputs[0] is x.node


def test_slice_update_with_constant_offsets_and_chains():
    b = kiln.Builder("c")
    cache = b.buffer("cache", (3, 4))
    c1 = cache.slice_update(b.input("v", (1, 4)), [0, 0])
    c2 = c1.slice_update(b.input("u", (1, 4)), [1, 0])  # a chain: updates in order
    b.output(c2)
    assert b.graph.constants["const0"].dtype == torch.int64
    check_graph(b.graph)


def cache_graph() -> tuple[kiln.Builder, kiln.Tensor, kiln.Tensor]:
    """A (4, 3) buffer and one slice_update of it: (builder, the buffer, the update)."""
    b = kiln.Builder("kv")
    cache = b.buffer("cache", (4, 3))
    return b, cache, cache.slice_update(b.input("v", (1, 3)), b.input("pos", (2,), "int64"))


def test_buffer_reads_in_order_of_writes():
    """Each node that stands for a buffer names one version of it; a read of a version must come
    before the buffer's next write (list order is what both executors run, and one copy of the
    bytes exists). The message names the reader and the writer."""
    b = kiln.Builder("kv")
    cache = b.buffer("cache", (4, 3))
    old = cache.relu()  # before the write: the contents the run started with
    new = cache.slice_update(b.input("v", (1, 3)), b.input("pos", (2,), "int64"))
    b.output(old, new.reshape(12).relu(), new)  # after it: through the update's node

    # the same edges, the read moved below the write: still a topological order, another meaning
    g = b.graph
    g.nodes.remove(old.node)
    g.nodes.insert(g.nodes.index(new.node) + 1, old.node)
    with pytest.raises(IRError) as err:
        g.validate()
    for words in ("%t0 (relu) reads %cache", "before %t1 (slice_update) wrote", "read %t1"):
        assert words in str(err.value), str(err.value)

    b = kiln.Builder("kv")
    cache = b.buffer("cache", (4, 3))
    view = cache.reshape(12)  # a view taken before the write, read after it
    upd = cache.slice_update(b.input("v", (1, 3)), [0, 0])
    with pytest.raises(IRError, match=r"%t2 \(relu\) reads %t0 \(buffer %cache\).*%t1 \(slice_update\)"):
        b.output(view.relu(), upd)

    b, cache, upd = cache_graph()  # two writes into one version: %t0 would not name what it wrote
    cache.slice_update(b.input("u", (1, 3)), [0, 0])
    with pytest.raises(IRError, match=r"%t1 \(slice_update\) reads %cache.*%t0 \(slice_update\)"):
        b.output(upd)

    b, cache, upd = cache_graph()  # an output is read after the run: the last version only
    upd2 = upd.slice_update(b.input("u", (1, 3)), [0, 0])
    with pytest.raises(IRError, match=r"output %t0 \(buffer %cache\).*%t1 \(slice_update\).*return %t1"):
        b.output(upd, upd2)

    b = kiln.Builder("self")
    cache = b.buffer("cache", (4, 3))
    with pytest.raises(IRError, match=r"%t0 \(slice_update\) writes into buffer %cache and reads it"):
        b.output(cache.slice_update(cache, [0, 0]))


def test_parse_rejects_a_read_after_the_write():
    """The text form runs the same check: the read of %c sits below the write into it."""
    text = """\
graph g {
  %c = buffer {name = "c"} : f32[4]
  %v = input {name = "v"} : f32[2]
  %o = input {name = "o"} : i64[1]
  %u = slice_update(%c, %v, %o) : f32[4]
  %r = relu(%c) : f32[4]
  return %r, %u
}
"""
    with pytest.raises(IRError) as err:
        parse(text)
    assert "%r (relu) reads %c" in str(err.value) and "%u (slice_update)" in str(err.value), str(err.value)
    ok = text.replace("  %u = slice_update(%c, %v, %o) : f32[4]\n", "").replace(
        "  %r = relu(%c) : f32[4]\n", "  %r = relu(%c) : f32[4]\n  %u = slice_update(%c, %v, %o) : f32[4]\n"
    )
    assert to_text(parse(ok)) == ok


# --- the text form --------------------------------------------------------------------------------

MLP_TEXT = """\
graph mlp {
  %x = input {name = "x"} : f32[4, 784]
  %fc1.weight = constant {name = "fc1.weight"} : f32[1000, 784]
  %t0 = permute(%fc1.weight) {dims = [1, 0]} : f32[784, 1000]
  %t1 = matmul(%x, %t0) : f32[4, 1000]
  %t2 = relu(%t1) : f32[4, 1000]
  return %t2
}
"""


def test_text_matches_the_documented_form():
    b = kiln.Builder("mlp")
    x = b.input("x", (4, 784), "float32")
    w = b.constant("fc1.weight", torch.zeros(1000, 784))
    b.output((x @ w.permute(1, 0)).relu())
    assert to_text(b.graph) == MLP_TEXT
    g = parse(MLP_TEXT)
    assert to_text(g) == MLP_TEXT
    assert g.constants == {}
    assert [n.name for n in g.inputs] == ["x"]


@pytest.mark.parametrize("make", [mlp, everything, lambda: fibonacci(100)])
def test_round_trip(make):
    g = make()
    text = to_text(g)
    back = parse(text)
    assert to_text(back) == text
    assert [n.type for n in back.nodes] == [n.type for n in g.nodes]
    assert [n.attrs for n in back.nodes] == [n.attrs for n in g.nodes]
    # a node read twice is one object in the parsed graph too
    for old, new in zip(g.nodes, back.nodes, strict=True):
        assert [g.nodes.index(i) for i in old.inputs] == [back.nodes.index(i) for i in new.inputs]


def _test_op() -> str:
    """An operator with float, string and bool attributes, as lab 5 registers its own."""
    name = "test_scaled"
    if name not in ops.REGISTRY:
        ops.register(ops.OpDef(name, 1, lambda ts, attrs: ts[0], attrs=("alpha", "label", "flag", "axes")))
    return name


@pytest.mark.parametrize("alpha", [0.5, 1e-05, -2.0, 1e20, float("inf")])
def test_round_trip_attribute_values(alpha):
    b = kiln.Builder("attrs")
    x = b.input("x", (2,))
    b.output(b.op(_test_op(), x, alpha=alpha, label='a "quoted" \\ name', flag=True, axes=[]))
    text = to_text(b.graph)
    back = parse(text)
    assert to_text(back) == text
    attrs = back.nodes[1].attrs
    assert attrs["alpha"] == alpha and isinstance(attrs["alpha"], float)
    assert attrs["label"] == 'a "quoted" \\ name' and attrs["flag"] is True and attrs["axes"] == []


def test_parse_skips_comments_and_blank_lines():
    text = '# a model\ngraph g {\n\n  %x = input {name = "x"} : f32[3]  # the input\n  return %x\n}\n'
    assert to_text(parse(text)) == 'graph g {\n  %x = input {name = "x"} : f32[3]\n  return %x\n}\n'


def body(*lines: str, ret: str = "%y") -> str:
    return "graph g {\n" + "".join(f"  {line}\n" for line in lines) + f"  return {ret}\n}}\n"


X = '%x = input {name = "x"} : f32[4]'


@pytest.mark.parametrize(
    ("text", "error", "words"),
    [
        (body(X, "%y = relu(%z) : f32[4]"), ParseError, ["line 3, column 13", "%z", "never defined"]),
        (body(X, "%y = relu(%w) : f32[4]", "%w = relu(%x) : f32[4]"), ParseError, ["line 3", "further down"]),
        (body(X, "%y = relu(%y) : f32[4]"), ParseError, ["line 3", "%y", "further down"]),
        (body(X, "%x = relu(%x) : f32[4]", ret="%x"), ParseError, ["line 3, column 3", "defined twice"]),
        (body(X, "%y = gelu(%x) : f32[4]"), ParseError, ["line 3, column 8", "unknown operator 'gelu'"]),
        (body(X, "%y = relu(%x) : f32[5]"), ShapeError, ["line 3", "%y (relu)", "f32[5]", "f32[4]"]),
        (body(X, "%y = add(%x, %x) : f16[4]"), ShapeError, ["line 3", "f16[4]"]),
        (body(X, "%y = matmul(%x, %x) : f32[4]"), ShapeError, ["line 3", "%y (matmul)", "rank >= 2"]),
        (body(X, "%y = relu(%x) : f32[4"), ParseError, ["line 4, column 3", "expected ',' or ']'", "'return'"]),
        (body(X, "%y = relu(%x) f32[4]"), ParseError, ["line 3, column 17", "expected ':'"]),
        (body(X, "%y = relu(%x) : f64[4]"), ParseError, ["line 3", "unknown dtype 'f64'"]),
        (body(X, "%y = relu(%x) : f32[0]"), ParseError, ["line 3", "positive"]),
        (body(X, "%y = relu(%x) : f32[2.5]"), ParseError, ["line 3", "dimension"]),
        (body(X, "%y = permute(%x) {dims = [0], dims = [0]} : f32[4]"), ParseError, ["line 3", "given twice"]),
        (body(X, "%y = permute(%x) {dims = [0.5]} : f32[4]"), ParseError, ["line 3", "an int"]),
        (body(X, "%y = permute(%x) {dims = } : f32[4]"), ParseError, ["line 3", "attribute value"]),
        (body(X, "%y = relu(%x) : f32[4]", ret="%q"), ParseError, ["line 4", "%q", "no such node"]),
        (body(X, "%y = relu(%x) : f32[4]", ret=""), ParseError, ["line 5", "expected an output"]),
        (body('%x = input {name = "x", dims = [1]} : f32[4]', ret="%x"), IRError, ["%x (input)", "one attribute"]),
        (body("%x = input : f32[4]", ret="%x"), IRError, ["%x (input)", "name"]),
        (body(X, "%y = relu(%x) : f32[4]") + "extra", ParseError, ["line 6, column 1", "end of text"]),
        (body(X, "%y = relu(%x) : f32[4] @"), ParseError, ["line 3, column 26", "unexpected character '@'"]),
        ("graph {\n}\n", ParseError, ["line 1, column 7", "graph's name"]),
        ("grph g {\n}\n", ParseError, ["line 1, column 1", "'graph'"]),
        (body(X, '%y = relu(%x) {label = "open} : f32[4]'), ParseError, ["line 3"]),
        (body(X, "%y = relu(x) : f32[4]"), ParseError, ["line 3, column 13", "operand (%name)"]),
        (
            body(
                '%c = buffer {name = "c"} : f32[4]',
                '%o = input {name = "o"} : i64[1]',
                X,
                "%y = slice_update(%x, %x, %o) : f32[4]",
            ),
            ShapeError,
            ["%y (slice_update)", "must be a buffer"],
        ),
    ],
)
def test_parse_errors(text, error, words):
    with pytest.raises(error) as err:
        parse(text)
    assert isinstance(err.value, IRError)
    for w in words:
        assert w in str(err.value), str(err.value)


def test_printing_refuses_what_cannot_parse_back():
    g = parse(MLP_TEXT)
    g.nodes[0].name = "x y"
    with pytest.raises(IRError, match="names"):
        to_text(g)
    g = parse(MLP_TEXT)
    g.nodes[3].attrs["bad"] = {"a": 1}
    with pytest.raises(IRError, match="attribute value"):
        to_text(g)
