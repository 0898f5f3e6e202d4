"""Checks for lab4/kiln/passes.py: constant folding, graded on the CPU (the GPU check is left out there).

Every folded graph is run next to the graph it came from, on the same inputs, by a small torch
interpreter in this file that follows task 02's contract (so the checks need neither your CPU
executor nor your kernels): the outputs must agree, and every folded constant must have its node's
shape and dtype. The graphs: the chapter's MLP, whose two weight permutes must become constants
(11 nodes down to 9, the weights gone, the text parsing back); a chain of reshape, permute, add, relu
and mul over weights that must fold into one constant, with a diamond inside; nodes that read a
weight AND an input, directly or through a chain (weight -> add(input) -> permute), which must stay;
a buffer read before its write and written by slice_update, run three times (each run reads the last one's write:
a buffer is state, not a zero constant); f16 and bf16 chains whose values round differently when the
whole chain is computed in float32 (2048 + 1 - 2048 is 0 in f16, 1 in float32); the caller's graph,
constants dict and weights checked unchanged, and the folded constants unchanged after the caller
changes its weights in place (a folded reshape must not be a view); existing constants named fold0
and fold1, and reserved names; an unread input and an unread slice_update, which must stay; the size
cap at 2^20 elements (a broadcast add past it stays, one at it folds, a permute of a larger weight
folds); outputs that are folded nodes (one of them twice, one also read later) or weights; and what
the pass cannot evaluate: an operator with no fold evaluator, a parsed graph (no constant values) and
weights on the meta device. Last, `kiln.compile` folds by default and not with fold=False, and a
graph compiled with share_with gets folded names the other executor does not hold.

Tolerances: add, mul, relu, permute, reshape and slice are exact in any dtype (one rounding at most),
so the folded run must give what the unfolded run gives to within test_02's tolerances (f32 1e-5,
f16 1e-3, bf16 8e-3), which leave room for another summation order in a folded matmul but not for a
whole f16 or bf16 rounding step, zeros or a pass-through.

TASK.mistakes names the class of mistake each case is there to catch; lab4/solutions/broken.py
has a broken variant for each.

The point tests import kiln inside their bodies: the grading process loads this file too and
must not run student code.
"""

from __future__ import annotations

import pytest
import torch

from grader.tasks import PythonTask

KERNELS = ["kiln/kernels/pointwise.cu", "kiln/kernels/matmul.cu", "kiln/kernels/layout.cu"]

TASK = PythonTask(
    lab="lab4",
    number="08",
    title="constant folding",
    sources=["kiln/passes.py"],
    # only the GPU check (left out without a GPU) runs these: compile(..., "cuda") on a folded graph
    builds_on=[*KERNELS, "kiln/planner.py", "kiln/cuda.py", "kiln/capture.py"],
    mistakes={
        "input dependence": "test_input_dependent_nodes_stay: weight -> add(input) -> permute, and a matmul of"
        " an input by a weight, must stay nodes",
        "buffer state": "test_buffers_are_state: relu of a buffer read before its write, run three times; each"
        " run reads what the one before it wrote",
        "precision": "test_half_precision_rounds_per_node: f16 and bf16 chains (2048 + 1 - 2048) that give 0"
        " rounded per node and 1 through float32",
        "caller's graph": "test_caller_graph_unchanged: the caller's text, nodes, constants dict and weights"
        " after the pass, and the folded constants after the caller changes its weights",
        "name collision": "test_names_do_not_collide: constants already named fold0 and fold1, reserved names,"
        " and compile with share_with",
        "dead constants": "test_mlp_permutes_fold and test_chains_fold_to_one_constant: weights and folded"
        " intermediates nobody reads are removed (node counts)",
        "live work removed": "test_keeps_inputs_and_writes: an unread input and an unread slice_update stay",
        "size cap": "test_size_cap: a broadcast add of 2^21 elements stays, one of 2^20 folds, a permute of a"
        " weight past 2^20 folds",
        "folded outputs": "test_folded_outputs: outputs that are folded nodes (one twice, one also read later)"
        " or weights",
        "node order": "test_mlp_permutes_fold: a folded constant must come before the matmul that reads it"
        " (the result validates and parses back)",
        "chains": "test_chains_fold_to_one_constant: reshape -> permute -> add -> relu -> mul over weights"
        " folds into one constant",
        "what cannot be evaluated": "test_what_cannot_be_evaluated_stays: an operator without a fold"
        " evaluator, a parsed graph without values, weights on the meta device",
    },
)

TOL = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    torch.float16: {"rtol": 1e-3, "atol": 1e-3},
    torch.bfloat16: {"rtol": 8e-3, "atol": 8e-3},
    torch.int64: {"rtol": 0, "atol": 0},
}
CAP = 1 << 20  # the contract's FOLD_MAX_ELEMENTS


def rand(shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


# --- a reference interpreter, task 02's contract, so the checks need no student executor ----------


def _slice_update(node, args):
    target, value, offsets = args
    at = [int(o) for o in offsets.tolist()]
    target[tuple(slice(o, o + v) for o, v in zip(at, value.shape, strict=True))].copy_(value)
    return target


def _matmul(node, args):
    a, b = args
    if a.dtype in (torch.float16, torch.bfloat16):
        return torch.matmul(a.float(), b.float()).to(a.dtype)
    return torch.matmul(a, b)


REFERENCE = {
    "add": lambda n, a: a[0] + a[1],
    "mul": lambda n, a: a[0] * a[1],
    "relu": lambda n, a: torch.relu(a[0]),
    "silu": lambda n, a: torch.nn.functional.silu(a[0]),
    "matmul": _matmul,
    "reshape": lambda n, a: a[0].reshape(n.attrs["shape"]),
    "permute": lambda n, a: a[0].permute(n.attrs["dims"]).contiguous(),
    "slice": lambda n, a: a[0][tuple(slice(s, e) for s, e in zip(n.attrs["starts"], n.attrs["ends"], strict=True))],
    "slice_update": _slice_update,
    "test_fold_twice": lambda n, a: a[0] * 2,
}


class Reference:
    """Runs a graph on the CPU with torch; buffers start at zero and persist between runs."""

    def __init__(self, graph):
        from kiln.runtime import torch_dtype

        graph.validate()
        self.graph = graph
        self.buffers = {
            n.attrs["name"]: torch.zeros(n.type.shape, dtype=torch_dtype(n.type.dtype)) for n in graph.buffers
        }
        for n in graph.of_op("constant"):
            v = graph.constants.get(n.attrs["name"])
            assert isinstance(v, torch.Tensor), f"constant {n.attrs['name']!r} (%{n.name}) has no value in constants"
            assert tuple(v.shape) == n.type.shape and v.dtype == torch_dtype(n.type.dtype), (
                f"constant {n.attrs['name']!r} (%{n.name}) holds {v.dtype}{list(v.shape)}, its node says {n.type}"
            )

    def run(self, inputs):
        vals = {}
        for n in self.graph.nodes:
            if n.op == "input":
                vals[n] = inputs[n.attrs["name"]]
            elif n.op == "constant":
                vals[n] = self.graph.constants[n.attrs["name"]]
            elif n.op == "buffer":
                vals[n] = self.buffers[n.attrs["name"]]
            else:
                vals[n] = REFERENCE[n.op](n, [vals[i] for i in n.inputs])
        return [vals[o].clone() for o in self.graph.outputs]


def fold(graph, **kw):
    from kiln.passes import fold_constants

    out = fold_constants(graph, **kw)
    assert out is not graph, "fold_constants returns a new Graph"
    out.validate()
    return out


def same_runs(graph, folded, runs):
    """The folded graph gives what the graph gives, run after run (buffers carry over)."""
    want, got = Reference(graph), Reference(folded)
    for k, inputs in enumerate(runs):
        for j, (g, w) in enumerate(zip(got.run(inputs), want.run(inputs), strict=True)):
            where = f"run {k + 1}, output {j} (%{folded.outputs[j].name})"
            assert g.dtype == w.dtype and g.shape == w.shape, (
                f"{where}: {g.dtype}{list(g.shape)}, want {w.dtype}{list(w.shape)}"
            )
            torch.testing.assert_close(g, w, **TOL[w.dtype], msg=lambda m, where=where: f"{where}: {m}")


def ops_of(graph):
    return [n.op for n in graph.nodes]


def mlp(seed=0):
    """The chapter's section 1 MLP: 11 nodes, two weight permutes."""
    import kiln

    b = kiln.Builder("mlp")
    x = b.input("x", (4, 16), "float32")
    w1 = b.constant("fc1.weight", rand((32, 16), seed))
    b1 = b.constant("fc1.bias", rand((32,), seed + 1))
    w2 = b.constant("fc2.weight", rand((16, 32), seed + 2))
    h = (x @ w1.permute(1, 0) + b1).relu()
    b.output(x + h @ w2.permute(1, 0))
    return b.graph


# --- the tests ----------------------------------------------------------------------------------


@pytest.mark.points(3)
def test_mlp_permutes_fold():
    import kiln

    graph = mlp()
    out = fold(graph)
    assert "permute" not in ops_of(out), f"the weight permutes were not folded:\n{kiln.to_text(out)}"
    assert len(out.nodes) == 9, f"11 nodes, two permutes folded and two weights unread: 9 expected\n{kiln.to_text(out)}"
    names = {n.attrs["name"] for n in out.of_op("constant")}
    assert not names & {"fc1.weight", "fc2.weight"}, f"weights nobody reads any more are removed: {sorted(names)}"
    text = kiln.to_text(out)
    assert kiln.to_text(kiln.parse(text)) == text, "the folded graph prints and parses back"
    first = out.of_op("matmul")[0].inputs[1]
    assert first.op == "constant", "matmul(x, permute(W)) becomes matmul(x, Wt)"
    assert torch.equal(out.constants[first.attrs["name"]], graph.constants["fc1.weight"].T)
    same_runs(graph, out, [{"x": rand((4, 16), s)} for s in (10, 11)])


@pytest.mark.points(2)
def test_chains_fold_to_one_constant():
    import kiln

    b = kiln.Builder("chain")
    x = b.input("x", (3, 6), "float32")
    w = b.constant("w", rand((2, 3, 4), 1))
    shift = b.constant("shift", rand((6, 1), 2))
    t = w.reshape(6, 4).permute(1, 0)  # (4, 6)
    t = (t + shift.permute(1, 0)).relu() * 0.5
    d = t * t + t  # a diamond: t read three times, inside the chain
    b.output(x @ d.permute(1, 0))
    graph = b.graph
    out = fold(graph)
    assert sorted(ops_of(out)) == ["constant", "input", "matmul"], (
        f"the whole chain over weights folds into one constant\n{kiln.to_text(out)}"
    )
    same_runs(graph, out, [{"x": rand((3, 6), 3)}])


@pytest.mark.points(3)
def test_input_dependent_nodes_stay():
    import kiln

    b = kiln.Builder("mixed")
    x = b.input("x", (4, 5), "float32")
    w = b.constant("w", rand((4, 5), 1))
    v = b.constant("v", rand((5, 3), 2))
    t = (w + x).permute(1, 0)  # weight -> add(input) -> permute: depends on x
    y = x @ v.relu()  # the relu folds, the matmul reads x
    b.output(t, y, (w * 2.0 + x).relu())
    graph = b.graph
    out = fold(graph)
    kept = ops_of(out)
    for op in ("permute", "matmul"):
        assert op in kept, f"%({op}) reads the input x: it must stay a node\n{kiln.to_text(out)}"
    assert kept.count("add") == 2, f"both adds read x\n{kiln.to_text(out)}"
    assert kept.count("relu") == 1 and kept.count("mul") == 0, (
        f"v.relu() and w * 2 read weights only\n{kiln.to_text(out)}"
    )
    same_runs(graph, out, [{"x": rand((4, 5), s)} for s in (3, 4)])


@pytest.mark.points(3)
def test_buffers_are_state():
    import kiln

    b = kiln.Builder("state")
    kv = b.buffer("kv", (4, 3), "float32")
    v = b.input("v", (1, 3), "float32")
    pos = b.input("pos", (2,), "int64")
    old = (kv + b.constant("bias", rand((3, 1), 1)).permute(1, 0)).relu()  # the contents before this run's write
    new = kv.slice_update(v, pos)
    other = b.buffer("other", (2, 3), "float32")
    fixed = other.slice_update(b.constant("row", rand((1, 3), 2)), [1, 0])  # constant value and offsets
    b.output(old, new, fixed.reshape(6) * 3.0)
    graph = b.graph
    out = fold(graph)
    assert ops_of(out).count("slice_update") == 2, f"a write changes state: it is never folded\n{kiln.to_text(out)}"
    assert "permute" not in ops_of(out), f"the bias's permute reads only a weight: it folds\n{kiln.to_text(out)}"
    runs = [{"v": rand((1, 3), 10 + k), "pos": torch.tensor([k, 0])} for k in range(3)]
    same_runs(graph, out, runs)  # run 2 reads run 1's write through relu(kv + bias)


def half_chain(dtype, big):
    """(big + 1) + (-big) in `dtype`: 0 rounded at every node, 1 when the chain runs in float32."""
    import kiln

    a = torch.tensor([big, 2 * big, big, 3.0], dtype=dtype)
    one = torch.tensor([1.0, 3.0, 1.0, 0.5], dtype=dtype)
    b = kiln.Builder("half")
    x = b.input("x", (2, 4), dtype)
    ca, c1, cn = b.constant("a", a), b.constant("one", one), b.constant("neg", -a)
    s = (ca + c1) + cn
    m = b.constant("m", rand((4, 4), 1, dtype))
    b.output(x + s, s, x @ (m.permute(1, 0) * s))
    per_node = (a + one) + (-a)
    through_f32 = ((a.float() + one.float()) + (-a).float()).to(dtype)
    assert not torch.equal(per_node, through_f32), "the test's values must round differently"
    return b.graph


@pytest.mark.points(3)
@pytest.mark.parametrize(("dtype", "big"), [(torch.float16, 2048.0), (torch.bfloat16, 256.0)], ids=["f16", "bf16"])
def test_half_precision_rounds_per_node(dtype, big):
    from kiln.runtime import torch_dtype

    graph = half_chain(dtype, big)
    out = fold(graph)
    for n in out.of_op("constant"):
        value = out.constants[n.attrs["name"]]
        assert value.dtype == torch_dtype(n.type.dtype), f"%{n.name}: a {value.dtype} value for a {n.type} node"
    assert len(out.of_op("add")) == 1, "the chain over constants folds"
    same_runs(graph, out, [{"x": rand((2, 4), 5, dtype)}])


@pytest.mark.points(3)
def test_caller_graph_unchanged():
    import kiln

    b = kiln.Builder("caller")
    x = b.input("x", (2, 6), "float32")
    w = b.constant("w", rand((3, 2, 6), 1))
    flat = w.reshape(6, 6)
    b.output(x @ flat.permute(1, 0) + b.constant("c", rand((6,), 2)), flat)
    graph = b.graph
    text = kiln.to_text(graph)
    nodes = list(graph.nodes)
    edges = [(n.inputs, n.op, dict(n.attrs), n.type) for n in nodes]
    outputs = list(graph.outputs)
    constants = dict(graph.constants)
    weights = {k: v.clone() for k, v in constants.items()}
    out = fold(graph)
    assert kiln.to_text(graph) == text, "the caller's graph changed"
    assert len(graph.nodes) == len(nodes) and all(a is b for a, b in zip(graph.nodes, nodes, strict=True))
    assert all(a is b for a, b in zip(graph.outputs, outputs, strict=True)) and len(graph.outputs) == len(outputs)
    assert [(n.inputs, n.op, n.attrs, n.type) for n in graph.nodes] == edges, "the caller's nodes changed"
    assert graph.constants.keys() == constants.keys(), f"the caller's constants dict changed: {sorted(graph.constants)}"
    assert all(graph.constants[k] is v for k, v in constants.items()), "the caller's constants dict changed"
    for k, v in weights.items():
        assert torch.equal(graph.constants[k], v), f"the caller's weight {k!r} changed"
    assert out.constants is not graph.constants
    folded = {n.attrs["name"]: out.constants[n.attrs["name"]].clone() for n in out.of_op("constant")}
    folded = {k: v for k, v in folded.items() if k not in constants}
    assert len(folded) == 2, f"the permute and the reshape output fold: {sorted(folded)}"
    graph.constants["w"].add_(1.0)  # the caller reuses its weight afterwards
    for k, v in folded.items():
        assert torch.equal(out.constants[k], v), f"folded constant {k!r} is a view of a caller's weight"


@pytest.mark.points(2)
def test_names_do_not_collide():
    import kiln

    b = kiln.Builder("names")
    x = b.input("x", (3, 4), "float32")
    f0 = b.constant("fold0", rand((4,), 1))
    f1 = b.constant("fold1", rand((3, 1), 2))
    w = b.constant("w", rand((5, 4), 3))
    u = b.constant("u", rand((6, 4), 4))
    b.output((x * f0 + f1) @ w.permute(1, 0), (x @ u.permute(1, 0)) * (f1 + 1.0))
    graph = b.graph
    given = set(graph.constants)
    for reserved in ((), ("fold2", "fold3")):
        out = fold(graph, reserved=reserved)
        names = [n.attrs["name"] for n in out.of_op("constant")]
        assert len(names) == len(set(names)), f"two constants share a name: {names}"
        new = set(names) - given
        assert len(new) == 3, f"three folded constants expected, new names {sorted(new)}"
        assert not new & set(reserved), f"folded names {sorted(new)} use reserved ones {reserved}"
        text = kiln.to_text(out)
        assert kiln.to_text(kiln.parse(text)) == text
        same_runs(graph, out, [{"x": rand((3, 4), 5)}])


@pytest.mark.points(2)
def test_keeps_inputs_and_writes():
    import kiln

    b = kiln.Builder("keep")
    x = b.input("x", (2, 3), "float32")
    b.input("unused", (5,), "float32")  # read by nobody: still an input of every run
    cache = b.buffer("cache", (4, 3), "float32")
    pos = b.input("pos", (2,), "int64")
    cache.slice_update(x[0:1], pos)  # read by nobody: the write is the point
    b.output(x @ b.constant("w", rand((3, 3), 1)).permute(1, 0))
    graph = b.graph
    out = fold(graph)
    assert [n.attrs["name"] for n in out.inputs] == ["x", "unused", "pos"], "the inputs of a run stay"
    assert ops_of(out).count("slice_update") == 1 and len(out.buffers) == 1, (
        f"an unread slice_update writes state: it stays\n{kiln.to_text(out)}"
    )
    assert "permute" not in ops_of(out)


@pytest.mark.points(2)
def test_size_cap():
    import kiln

    def graph_of(a_shape, b_shape):
        b = kiln.Builder("cap")
        b.output(b.constant("a", torch.ones(a_shape)) + b.constant("b", torch.ones(b_shape)))
        return b.graph

    past = fold(graph_of((1024,), (2048, 1)))  # 2^21 elements from two small constants
    assert ops_of(past).count("add") == 1, f"a folded constant of 2^21 elements, past the cap of {CAP}"
    at = fold(graph_of((1024,), (1024, 1)))  # exactly the cap
    assert "add" not in ops_of(at), f"a constant of {CAP} elements (the cap) folds"
    assert torch.equal(at.constants[at.outputs[0].attrs["name"]], torch.full((1024, 1024), 2.0))
    b = kiln.Builder("big")
    w = rand((1025, 1024), 1)
    b.output(b.constant("w", w).permute(1, 0))
    big = fold(b.graph)  # past the cap, but no larger than the weight it is computed from
    assert "permute" not in ops_of(big), "a permute of a weight past the cap folds: it grows nothing"
    assert torch.equal(big.constants[big.outputs[0].attrs["name"]], w.T)


@pytest.mark.points(2)
def test_folded_outputs():
    import kiln

    b = kiln.Builder("outs")
    x = b.input("x", (2, 4), "float32")
    w = b.constant("w", rand((3, 4), 1))
    t = w.permute(1, 0)  # (4, 3): an output and read by the matmul below
    r = w.reshape(12).relu()
    b.output(t, x @ t, w, r, t)
    graph = b.graph
    out = fold(graph)
    assert [o.name for o in out.outputs] == [o.name for o in graph.outputs], "outputs keep their node names"
    assert [o.op for o in out.outputs] == ["constant", "matmul", "constant", "constant", "constant"]
    assert out.outputs[0] is out.outputs[4], "one folded node returned twice is one constant"
    same_runs(graph, out, [{"x": rand((2, 4), 2)}])


@pytest.mark.points(2)
def test_what_cannot_be_evaluated_stays():
    import kiln
    from kiln import ops

    if "test_fold_twice" not in ops.REGISTRY:  # an operator with no fold evaluator, as lab 5's
        ops.register(ops.OpDef("test_fold_twice", 1, lambda ts, attrs: ts[0]))
    b = kiln.Builder("unknown")
    x = b.input("x", (4, 3), "float32")
    w = b.constant("w", rand((3, 4), 1))
    b.output(x + b.op("test_fold_twice", w.permute(1, 0)))
    graph = b.graph
    out = fold(graph)
    assert ops_of(out).count("test_fold_twice") == 1 and "permute" not in ops_of(out)
    same_runs(graph, out, [{"x": rand((4, 3), 2)}])

    parsed = kiln.parse(kiln.to_text(mlp()))  # no constant values at all
    folded = fold(parsed)
    assert ops_of(folded) == ops_of(parsed), "without values nothing can be folded"

    b = kiln.Builder("meta")
    x = b.input("x", (2, 16), "float32")
    b.output(x @ b.constant("w", torch.empty(8, 16, device="meta")).permute(1, 0))
    meta = fold(b.graph)
    assert "permute" in ops_of(meta), "a weight on the meta device has a shape, not a value: nothing to fold"


@pytest.mark.points(1)
def test_compile_folds():
    import kiln

    graph = mlp()
    ex = kiln.compile(graph, "cpu")
    assert "permute" not in ops_of(ex.graph), "kiln.compile folds by default"
    assert kiln.compile(graph, "cpu", fold=False).graph is graph
    # a second graph of the same types, another weight, sharing the first executor's memory
    other = kiln.compile(mlp(seed=5), "cpu", share_with=ex)
    mine = {n.attrs["name"] for n in ex.graph.of_op("constant")}
    theirs = {n.attrs["name"] for n in other.graph.of_op("constant")}
    new = theirs - {"fc1.bias"}
    assert new and not new & mine, f"folded names {sorted(new)} taken from the executor shared with: {sorted(mine)}"


@pytest.mark.gpu
@pytest.mark.points(1)
def test_folded_graph_on_the_gpu():
    """compile(..., "cuda") on a folded graph: 5 launches for the MLP instead of 7, the same outputs."""
    import kiln

    graph = mlp()
    inputs = {"x": rand((4, 16), 3)}
    (want,) = Reference(graph).run(inputs)
    for use_graph in (False, True):
        ex = kiln.compile(graph, "cuda", use_graph=use_graph)
        assert len(ex.launches) == 5, f"{len(ex.launches)} launches: the two permutes fold"
        (got,) = ex.run({"x": inputs["x"].cuda()})
        torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)
    b = kiln.Builder("const_out")
    x = b.input("x", (2, 4), "float32")
    w = b.constant("w", rand((3, 4), 1))
    b.output(w.permute(1, 0), x @ w.permute(1, 0))
    got = kiln.compile(b.graph, "cuda").run({"x": rand((2, 4), 2).cuda()})
    want = Reference(b.graph).run({"x": rand((2, 4), 2)})
    for g, w_ in zip(got, want, strict=True):
        torch.testing.assert_close(g.cpu(), w_, rtol=1e-4, atol=1e-4)


def test_constant_folding(grade):
    grade(TASK)
