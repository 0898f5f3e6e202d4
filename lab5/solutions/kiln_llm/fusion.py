"""Lab 5 task 04 · the fusion pass: pointwise chains into generated kernels, epilogues into the matmul.

Implement: `find_epilogues` (the two matmul epilogue patterns), `grow_chain` (a maximal group of
           pointwise nodes around a root) and `chain_program` (the group written as a `fused`
           node's program), in the TODO regions. The chapter's section "Task 04: fusion" explains
           them; "Generated kernels" describes the `fused` operator (kiln_llm/codegen.py).
Contract:  `fuse(graph, chains=True, epilogues=True, prologues=True)` (given) returns a NEW graph
           and leaves its argument as it was. The new graph has the same inputs, constants,
           buffers and outputs (by position); a replaced node's replacement keeps its name.
           Five rewrites, in order (the middle three, `find_prologues`, `find_appends` and
           `find_stacks`, are given):
           epilogues: `add(linear(x, w), r)` (either operand order, r of the linear's type) ->
             `linear_add(x, w, r)`; `mul(silu(linear(x, w1)), linear(x, w3))` (either order,
             one x) -> `linear_swiglu(x, w1, w3)`; a node swallowed by a pattern is read by that
             pattern only and is not a graph output.
           prologues (given): an rmsnorm read only by linears (or linear_swiglu) of at most
             PROLOGUE_MAX_ROWS rows -> each becomes `rmsnorm_linear(x, g, w)` (or
             `rmsnorm_linear_swiglu(x, g, w1, w3)`) and the rmsnorm disappears; a rope read only
             by a kv_update (as its value) or an attention (as its q) at the same pos ->
             `rope_kv_update(cache, x, pos, inv_freq)` or `attention_rope(x, k, v, pos, inv_freq)`.
           appends (given): an attention_rope of at most APPEND_MAX_ROWS queries whose k is a
             rope_kv_update and whose v is a kv_update, at its pos (a graph input), of two buffers
             that nothing else touches, read by it alone
             -> `attention_append(q, k_new, v_new, cache_k, cache_v, pos, inv_freq)`.
           stacks (given): an attention_append of one token whose q, k_new and v_new are reshaped
             rmsnorm_linear(x, g, w) of one x, g and eps, each read by it alone ->
             `rmsnorm_linear_qkv(x, g, wq, wk, wv)` and `attention_append_qkv(qkv, ...)`.
           chains: every float pointwise node (add, mul, relu, silu) ends up inside exactly one
             `fused` node. A group holds a root and, recursively, the pointwise inputs of its
             members that are read only by members and are not graph outputs: the largest such
             group (at most codegen.MAX_INPUTS inputs). With chains=False each pointwise node
             is a group of its own (lab 4's CUDA kernels are f32 only: even unfused, an f16
             model's adds need a generated kernel).
           The result passes kiln's check_graph.
Test:      make test-lab5 TASK=04
"""

from __future__ import annotations

from kiln.ir import Graph, IRError, Node, TensorType
from kiln.shapes import check_graph
from kiln_llm.codegen import MAX_INPUTS, Instr, format_program

POINTWISE = ("add", "mul", "relu", "silu")  # lab 4's pointwise operators: what a `fused` node absorbs

# what replaces a node: (operator, inputs, attributes), or with a fourth item its new type; the
# replacement keeps the node's name, and its type unless one is given
Replacement = tuple[str, tuple[Node, ...], dict] | tuple[str, tuple[Node, ...], dict, TensorType]


# The most rows of x a prologue takes: the RMSNorm prologue is the decode GEMV's (kernels/linear.cu,
# MAX_GEMV_M). A prefill's GEMM is bound by arithmetic, where one RMSNorm kernel more is noise.
PROLOGUE_MAX_ROWS = 8
PROLOGUES = {"linear": "rmsnorm_linear", "linear_swiglu": "rmsnorm_linear_swiglu"}
# The most queries attention_append takes: the decode path's (kernels/llama.cu, DECODE_MAX_TOKENS).
# The prefill kernel reads every key from the cache, so its cache writes must come first.
APPEND_MAX_ROWS = 4


def fuse(graph: Graph, *, chains: bool = True, epilogues: bool = True, prologues: bool = True) -> Graph:
    """The graph with its epilogues folded into the matmuls, its decode RMSNorms into the linears
    that read them, its RoPEs into the cache write and the attention that read them, a decode
    step's cache writes into its attention, its three projections into one GEMV, and its pointwise
    nodes fused (given)."""
    out = rewrite(graph, *find_epilogues(graph)) if epilogues else graph
    out = rewrite(out, *find_prologues(out)) if prologues else out
    out = rewrite(out, *find_appends(out)) if prologues else out
    out = rewrite(out, *find_stacks(out)) if prologues else out
    out = rewrite(out, *find_chains(out, chains=chains))  # a new graph in any case: the caller's to keep
    check_graph(out)
    return out


def rewrite(graph: Graph, replace: dict[Node, Replacement], absorbed: set[Node]) -> Graph:
    """A copy of `graph` (new Node objects, the same constant tensors) where each node of `replace`
    becomes its replacement and every node of `absorbed` is left out (given). A replacement sits
    where the node it replaces did, which is after every input of the group it stands for."""
    new: dict[Node, Node] = {}
    out = Graph(graph.name, constants=dict(graph.constants))
    for n in graph.nodes:
        if n in absorbed:
            continue
        op, inputs, attrs, *retyped = replace.get(n, (n.op, n.inputs, n.attrs))
        for i in inputs:
            if i not in new:
                raise IRError(f"fusion: %{n.name} ({op}) reads %{i.name}, which a fused group swallowed")
        node = Node(n.name, op, tuple(new[i] for i in inputs), dict(attrs), retyped[0] if retyped else n.type)
        out.nodes.append(node)
        new[n] = node
    for o in graph.outputs:
        if o not in new:
            raise IRError(f"fusion: output %{o.name} was swallowed by a fused group")
    out.outputs = [new[o] for o in graph.outputs]
    return out


# --- epilogues ----------------------------------------------------------------------------------------


def find_epilogues(graph: Graph) -> tuple[dict[Node, Replacement], set[Node]]:
    """The residual adds and SwiGLU products that read matmuls: the node each pattern replaces (its
    root, the add or the mul), with the replacement, and the nodes the patterns swallow."""
    users = graph.users()
    outputs = {id(o) for o in graph.outputs}

    def only_for(n: Node, user: Node) -> bool:
        """Whether `user` is the one reader of `n` (read once), so `n` may disappear into it."""
        return id(n) not in outputs and users[n] == [user]

    replace: dict[Node, Replacement] = {}
    absorbed: set[Node] = set()
    for n in graph.nodes:
        if n.op not in ("add", "mul"):
            continue
        # TODO(lab5/04) begin: match add(linear, r) and mul(silu(linear), linear); see the chapter's "Epilogues"
        if n.op == "add":
            a, b = n.inputs
            for lin, r in ((a, b), (b, a)):
                # r must already be the output's type: linear_add does not broadcast its residual
                if lin.op == "linear" and only_for(lin, n) and r.type == lin.type:
                    replace[n] = ("linear_add", (*lin.inputs, r), {})
                    absorbed.add(lin)
                    break
        elif n.op == "mul":
            a, b = n.inputs
            for gate, up in ((a, b), (b, a)):
                if gate.op != "silu" or up.op != "linear" or not (only_for(gate, n) and only_for(up, n)):
                    continue
                (lin,) = gate.inputs
                if lin.op == "linear" and only_for(lin, gate) and lin.inputs[0] is up.inputs[0] and lin.type == up.type:
                    replace[n] = ("linear_swiglu", (lin.inputs[0], lin.inputs[1], up.inputs[1]), {})
                    absorbed |= {gate, lin, up}
                    break
        # ~ raise NotImplementedError("lab5/04: find the epilogue patterns")
        # TODO(lab5/04) end
    return replace, absorbed


# --- prologues ----------------------------------------------------------------------------------------


def find_prologues(graph: Graph) -> tuple[dict[Node, Replacement], set[Node]]:
    """The RMSNorms and RoPEs that their readers can take in (given).

    An RMSNorm whose every reader is a linear or linear_swiglu of at most PROLOGUE_MAX_ROWS rows
    that reads it as its x: each reader becomes its rmsnorm_ form over the norm's own inputs, and
    the norm disappears. A norm that is an output, or that anything else reads, stays, and its
    readers with it: folding it into some of them would remove no kernel.

    A RoPE read once, by a kv_update as the value or by an attention as q, at the same pos: the
    reader becomes rope_kv_update (the keys rotated on their way into the cache) or attention_rope
    (the queries rotated as they are loaded), and the rope disappears. Any length of run: the
    kernels take the rotation wherever they read the rows.
    """
    users = graph.users()
    outputs = {id(o) for o in graph.outputs}

    def takes_norm(norm: Node, user: Node) -> bool:
        x, *weights = user.inputs
        return user.op in PROLOGUES and x is norm and norm not in weights and x.type.shape[0] <= PROLOGUE_MAX_ROWS

    replace: dict[Node, Replacement] = {}
    absorbed: set[Node] = set()
    for norm in graph.of_op("rmsnorm"):
        readers = users[norm]
        if id(norm) in outputs or not readers or not all(takes_norm(norm, u) for u in readers):
            continue
        for u in readers:
            replace[u] = (PROLOGUES[u.op], (*norm.inputs, *u.inputs[1:]), {"eps": norm.attrs["eps"]})
        absorbed.add(norm)
    for rope in graph.of_op("rope"):
        x, pos, inv_freq = rope.inputs
        if id(rope) in outputs or len(users[rope]) != 1:
            continue
        (user,) = users[rope]
        layout = rope.attrs["layout"]
        ins = user.inputs
        if user.op == "kv_update" and ins[1] is rope and ins[2] is pos and ins[0] is not rope:
            replace[user] = ("rope_kv_update", (ins[0], x, pos, inv_freq), {"layout": layout})
        elif user.op == "attention" and ins[0] is rope and ins[3] is pos and all(i is not rope for i in ins[1:]):
            attrs = {"scale": user.attrs["scale"], "layout": layout}
            replace[user] = ("attention_rope", (x, *ins[1:], inv_freq), attrs)
        else:
            continue
        absorbed.add(rope)
    return replace, absorbed


def find_appends(graph: Graph) -> tuple[dict[Node, Replacement], set[Node]]:
    """The decode attentions that can write the new cache rows themselves (given).

    attention_rope(q, kc, vc, pos, inv_freq) of at most APPEND_MAX_ROWS queries, where kc is
    rope_kv_update(cache_k, k, pos, inv_freq) and vc is kv_update(cache_v, v, pos) at the same pos
    and frequencies, each read by this attention alone, cache_k and cache_v are buffers (state that
    outlives the run, so writing it in place hides nothing from the planner) that nothing else in
    the graph touches, and pos is a graph input (the kernel reads it, and the cache rows below it,
    before waiting for the kernel before: kernels/llm_kernels.h): the attention becomes
    attention_append(q, k, v, cache_k, cache_v, pos, inv_freq) and the two writes disappear. Two
    launches fewer per layer; the kernel takes the new rows from k and v, and stores them, instead
    of reading them back from the caches.
    """
    users = graph.users()
    outputs = {id(o) for o in graph.outputs}
    replace: dict[Node, Replacement] = {}
    absorbed: set[Node] = set()
    for att in graph.of_op("attention_rope"):
        q, kc, vc, pos, inv_freq = att.inputs
        if q.type.shape[0] > APPEND_MAX_ROWS or kc.op != "rope_kv_update" or vc.op != "kv_update":
            continue
        cache_k, k, k_pos, k_freq = kc.inputs
        cache_v, v, v_pos = vc.inputs
        if (k_pos, k_freq, v_pos) != (pos, inv_freq, pos) or kc.attrs["layout"] != att.attrs["layout"]:
            continue
        if cache_k.op != "buffer" or cache_v.op != "buffer" or cache_k is cache_v or pos.op != "input":
            continue
        if any(id(n) in outputs or users[n] != [att] for n in (kc, vc)):
            continue
        if users[cache_k] != [kc] or users[cache_v] != [vc]:  # any other use of a cache keeps its order
            continue
        replace[att] = ("attention_append", (q, k, v, cache_k, cache_v, pos, inv_freq), dict(att.attrs))
        absorbed |= {kc, vc}
    return replace, absorbed


def find_stacks(graph: Graph) -> tuple[dict[Node, Replacement], set[Node]]:
    """A decode step's three projections of one row, stacked into one GEMV (given).

    attention_append(q, k, v, cache_k, cache_v, pos, inv_freq) of one token where q, k and v are
    reshapes of rmsnorm_linear(x, g, w) over one x, g and eps, every reshape and every linear read
    by the next alone: the linears become one rmsnorm_linear_qkv(x, g, wq, wk, wv), in the place of
    the last of them (every weight is defined by then), and the attention becomes
    attention_append_qkv(qkv, cache_k, cache_v, pos, inv_freq), which finds q, k and v side by side
    in qkv's row. No weight is copied: the kernel reads the three where they are. Two launches fewer
    per layer, and a GEMV of 3 x 4096 rows instead of three of 4096: a short grid spends a larger
    share of its time filling and draining the GPU. One token only: the q, k and v rows of a longer
    run would each be strided, and the attention reads them dense.
    """
    users = graph.users()
    outputs = {id(o) for o in graph.outputs}
    order = {n: i for i, n in enumerate(graph.nodes)}
    replace: dict[Node, Replacement] = {}
    absorbed: set[Node] = set()
    for att in graph.of_op("attention_append"):
        q, k, v, cache_k, cache_v, pos, inv_freq = att.inputs
        if q.type.shape[0] != 1:
            continue
        shaped: list[Node] = []
        linears: list[Node] = []
        for r in (q, k, v):
            if r.op != "reshape" or id(r) in outputs or users[r] != [att]:
                break
            lin = r.inputs[0]
            if lin.op != "rmsnorm_linear" or id(lin) in outputs or users[lin] != [r]:
                break
            shaped.append(r)
            linears.append(lin)
        if len(linears) != 3:
            continue
        x, g = linears[0].inputs[:2]
        if any(lin.inputs[:2] != (x, g) or lin.attrs["eps"] != linears[0].attrs["eps"] for lin in linears):
            continue
        last = max(linears, key=order.__getitem__)
        stacked = TensorType((1, sum(lin.type.shape[1] for lin in linears)), x.type.dtype)  # (1, Nq + Nk + Nv)
        weights = tuple(lin.inputs[2] for lin in linears)
        replace[last] = ("rmsnorm_linear_qkv", (x, g, *weights), dict(linears[0].attrs), stacked)
        replace[att] = ("attention_append_qkv", (last, cache_k, cache_v, pos, inv_freq), dict(att.attrs))
        absorbed |= {*shaped, *(lin for lin in linears if lin is not last)}
    return replace, absorbed


# --- pointwise chains -------------------------------------------------------------------------------


def fusible(n: Node) -> bool:
    """A node a `fused` kernel can compute: a pointwise operator on floats (an i64 add stays)."""
    return n.op in POINTWISE and n.type.dtype.is_float


def find_chains(graph: Graph, *, chains: bool = True) -> tuple[dict[Node, Replacement], set[Node]]:
    """Every fusible node in one group, each group one `fused` node standing where its root was
    (given). Roots are taken from the last node back: a node's readers are all decided before it,
    so a group grows only into nodes no later group could want."""
    users = graph.users()
    outputs = {id(o) for o in graph.outputs}
    order = {n: i for i, n in enumerate(graph.nodes)}
    taken: set[Node] = set()
    replace: dict[Node, Replacement] = {}
    for root in reversed(graph.nodes):
        if root in taken or not fusible(root):
            continue
        members = grow_chain(root, users, outputs, order, taken) if chains else [root]
        taken.update(members)
        inputs, program = chain_program(members)
        replace[root] = ("fused", tuple(inputs), {"program": format_program(program)})
    return replace, taken - set(replace)


def grow_chain(
    root: Node,
    users: dict[Node, list[Node]],
    outputs: set[int],
    order: dict[Node, int],
    taken: set[Node],
    limit: int = MAX_INPUTS,
) -> list[Node]:
    """The group of `root`, in graph order (root last): root, then each fusible input of a member
    that is not taken, not a graph output (`id(n) in outputs`), read only by members, and keeps
    the group's distinct outside inputs within `limit`. Visit candidates from the latest node
    back (`order[n]` is n's step): by the time a node is visited, all of its readers have been."""
    # TODO(lab5/04) begin: grow the group from the root backwards; see the chapter's section "Fusing chains"
    members = {root}
    outside = set(root.inputs)  # the group's inputs so far
    candidates = set(root.inputs)
    while candidates:
        p = max(candidates, key=order.__getitem__)  # the latest first: every reader of it is decided
        candidates.discard(p)
        if p in taken or not fusible(p) or id(p) in outputs:
            continue
        if not all(u in members for u in users[p]):
            continue  # read outside the group: it must stay a tensor of its own
        grown = (outside - {p}) | set(p.inputs)
        if len(grown) > limit:
            continue
        members.add(p)
        outside = grown
        candidates |= set(p.inputs)
    return sorted(members, key=order.__getitem__)
    # ~ raise NotImplementedError("lab5/04: grow a chain")
    # TODO(lab5/04) end


def chain_program(members: list[Node]) -> tuple[list[Node], list[Instr]]:
    """The `fused` node of a group (members in graph order, root last): its inputs (the nodes
    outside the group that members read, each once, in order of first read) and its program (one
    instruction per member, in order; values $0.. are the inputs, then the members' results)."""
    # TODO(lab5/04) begin: number the values, then one instruction per member; see "Generated kernels"
    inside = set(members)
    inputs: list[Node] = []
    for m in members:
        for i in m.inputs:
            if i not in inside and i not in inputs:
                inputs.append(i)
    value = {n: k for k, n in enumerate(inputs)}
    program: list[Instr] = []
    for m in members:
        program.append((m.op, tuple(value[i] for i in m.inputs)))
        value[m] = len(value)
    return inputs, program
    # ~ raise NotImplementedError("lab5/04: write the program")
    # TODO(lab5/04) end


__all__ = [
    "POINTWISE",
    "PROLOGUE_MAX_ROWS",
    "chain_program",
    "find_appends",
    "find_chains",
    "find_epilogues",
    "find_prologues",
    "find_stacks",
    "fuse",
    "grow_chain",
    "rewrite",
]
