"""The text form of a graph: `to_text` prints one, `parse` reads one back, exactly.

    graph mlp {
      %x = input {name = "x"} : f32[4, 784]
      %fc1.weight = constant {name = "fc1.weight"} : f32[1000, 784]
      %t0 = permute(%fc1.weight) {dims = [1, 0]} : f32[784, 1000]
      %t1 = matmul(%x, %t0) : f32[4, 1000]
      return %t1
    }

One node a line: `%name = op(inputs) {attrs} : type`, sources without the parentheses, attrs
only when there are some. Attribute values are ints, floats (always with a `.`, an `e` or
`inf`/`nan`, so they read back as floats), strings in double quotes, `true`/`false` and lists of
ints. Names are [A-Za-z0-9_.]. `# ...` comments are skipped by the parser.

`parse` checks what the builder would: unknown operators, names used before (or without) their
definition, redefinitions and written types that disagree with shape inference are errors; a
syntax error says the line, the column and what was expected. The text does not carry the
constants' values: a parsed graph has `constants == {}`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from kiln import ops
from kiln.ir import SOURCES, DType, Graph, IRError, Node, TensorType
from kiln.shapes import ShapeError, check_graph, infer_node

_NAME = re.compile(r"[A-Za-z0-9_.]+")


class ParseError(IRError):
    """Text that is not a graph: the message starts with `line L, column C:`."""

    def __init__(self, line: int, col: int, what: str) -> None:
        self.line = line
        self.col = col
        super().__init__(f"line {line}, column {col}: {what}")


# --- printing -----------------------------------------------------------------------------------


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)  # 0.5, 1e-05, inf, nan: each reads back as this float
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return "[" + ", ".join(map(str, v)) + "]"
    raise IRError(f"attribute value {v!r}: the text form has ints, floats, strings, bools and lists of ints")


def _name(name: str, what: str) -> str:
    if not _NAME.fullmatch(name):
        raise IRError(f"{what} {name!r}: names in the text form are [A-Za-z0-9_.]")
    return name


def node_line(n: Node) -> str:
    """`%t1 = matmul(%x, %t0) : f32[4, 1000]`; a write the output does not name is said in a comment:
    `%a = attention_append(...) : f32[1, 4, 8]  # writes %k_cache, %v_cache`."""
    text = f"%{_name(n.name, 'node')} = {n.op}"
    if n.inputs or n.op not in SOURCES:
        text += "(" + ", ".join(f"%{i.name}" for i in n.inputs) + ")"
    if n.attrs:
        text += " {" + ", ".join(f"{_name(k, 'attribute')} = {_value(v)}" for k, v in n.attrs.items()) + "}"
    text += f" : {n.type}"
    # slice_update returns the buffer it writes, so its line shows the write; an operator that
    # writes an input and returns something else (lab 5's fused attention writes the KV caches)
    # would change memory that no printed value names
    d = None if n.op in SOURCES else ops.REGISTRY.get(n.op)
    hidden = [n.inputs[i] for i in d.writes if i != d.view_of] if d is not None else []
    if hidden:
        text += "  # writes " + ", ".join(f"%{i.name}" for i in hidden)
    return text


def to_text(graph: Graph) -> str:
    """The graph as text, one node a line, ending with a newline."""
    lines = [f"graph {_name(graph.name, 'graph')} {{"]
    lines += [f"  {node_line(n)}" for n in graph.nodes]
    lines.append("  return " + ", ".join(f"%{o.name}" for o in graph.outputs))
    lines.append("}")
    return "\n".join(lines) + "\n"


# --- reading ------------------------------------------------------------------------------------


@dataclass
class Token:
    kind: str  # name, ref (%name), string, number, punct, end
    text: str
    line: int
    col: int


_TOKEN = re.compile(
    r"""(?P<space>[ \t\r]+|\#[^\n]*)
      |(?P<newline>\n)
      |(?P<ref>%[A-Za-z0-9_.]+)
      |(?P<string>"(?:[^"\\\n]|\\.)*")
      |(?P<number>[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|inf|nan)(?![A-Za-z0-9_.]))
      |(?P<name>[A-Za-z0-9_.]+)
      |(?P<punct>[{}()\[\],=:])""",
    re.VERBOSE,
)


def tokenize(text: str) -> list[Token]:
    tokens: list[Token] = []
    line, line_start, pos = 1, 0, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        col = pos - line_start + 1
        if m is None:
            raise ParseError(line, col, f"unexpected character {text[pos]!r}")
        kind = m.lastgroup or ""
        if kind == "newline":
            line, line_start = line + 1, m.end()
        elif kind != "space":
            tokens.append(Token(kind, m.group(), line, col))
        pos = m.end()
    tokens.append(Token("end", "end of text", line, pos - line_start + 1))
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = tokenize(text)
        self.i = 0

    @property
    def tok(self) -> Token:
        return self.tokens[self.i]

    def fail(self, expected: str, tok: Token | None = None) -> ParseError:
        t = tok or self.tok
        found = t.text if t.kind == "end" else repr(t.text)
        return ParseError(t.line, t.col, f"expected {expected}, found {found}")

    def take(self, kind: str, text: str | None = None, expected: str | None = None) -> Token:
        t = self.tok
        if t.kind != kind or (text is not None and t.text != text):
            raise self.fail(expected or (repr(text) if text else kind))
        self.i += 1
        return t

    def at(self, text: str) -> bool:
        return self.tok.kind == "punct" and self.tok.text == text

    def value(self) -> Any:
        t = self.tok
        if t.kind == "string":
            self.i += 1
            return json.loads(t.text)
        if t.kind == "number":
            self.i += 1
            if re.fullmatch(r"[-+]?\d+", t.text):
                return int(t.text)
            return float(t.text)
        if t.kind == "name" and t.text in ("true", "false"):
            self.i += 1
            return t.text == "true"
        if self.at("["):
            self.i += 1
            items: list[int] = []
            while not self.at("]"):
                if items:
                    self.take("punct", ",", "',' or ']'")
                n = self.tok
                v = self.value() if n.kind == "number" else None
                if not isinstance(v, int):
                    raise self.fail("an int (lists hold ints only)", n)
                items.append(v)
            self.i += 1
            return items
        raise self.fail("an attribute value (int, float, string, true, false or a list of ints)")

    def type_(self) -> TensorType:
        t = self.take("name", expected="a type such as f32[4, 784]")
        try:
            dtype = DType.parse(t.text)
        except IRError as e:
            raise ParseError(t.line, t.col, str(e)) from None
        self.take("punct", "[", "'[' after the dtype")
        dims: list[int] = []
        while not self.at("]"):
            if dims:
                self.take("punct", ",", "',' or ']'")
            d = self.tok
            v = self.value() if d.kind == "number" else None
            if not isinstance(v, int):
                raise self.fail("a dimension (a positive int)", d)
            dims.append(v)
        self.i += 1
        try:
            return TensorType(tuple(dims), dtype)
        except IRError as e:
            raise ParseError(t.line, t.col, str(e)) from None

    def graph(self) -> Graph:
        self.take("name", "graph", "'graph'")
        g = Graph(self.take("name", expected="the graph's name").text)
        self.take("punct", "{", "'{'")
        defined: dict[str, Node] = {}
        pending: list[tuple[Token, Token, str, list[Token], dict[str, Any], TensorType]] = []
        while self.tok.kind == "ref":
            ref = self.take("ref")
            self.take("punct", "=", "'='")
            op_tok = self.take("name", expected="an operator name")
            args: list[Token] = []
            if self.at("("):
                self.i += 1
                while not self.at(")"):
                    if args:
                        self.take("punct", ",", "',' or ')'")
                    args.append(self.take("ref", expected="an operand (%name)"))
                self.i += 1
            attrs: dict[str, Any] = {}
            if self.at("{"):
                self.i += 1
                while not self.at("}"):
                    if attrs:
                        self.take("punct", ",", "',' or '}'")
                    key = self.take("name", expected="an attribute name")
                    if key.text in attrs:
                        raise ParseError(key.line, key.col, f"attribute {key.text} given twice")
                    self.take("punct", "=", "'='")
                    attrs[key.text] = self.value()
                self.i += 1
            self.take("punct", ":", "':' and the node's type")
            ty = self.type_()
            name = ref.text[1:]
            if name in defined:
                raise ParseError(ref.line, ref.col, f"%{name} is defined twice")
            defined[name] = Node(name, op_tok.text, (), attrs, ty)
            pending.append((ref, op_tok, name, args, attrs, ty))
        self.take("name", "return", "a node (%name = ...) or 'return'")
        returns = [self.take("ref", expected="an output (%name)")]
        while self.at(","):
            self.i += 1
            returns.append(self.take("ref", expected="an output (%name)"))
        self.take("punct", "}", "'}'")
        self.take("end", expected="end of text")
        return self._link(g, defined, pending, returns)

    def _link(
        self,
        g: Graph,
        defined: dict[str, Node],
        pending: list[tuple[Token, Token, str, list[Token], dict[str, Any], TensorType]],
        returns: list[Token],
    ) -> Graph:
        """Resolve names in order: a node may read only nodes defined above it."""
        seen: set[str] = set()
        for ref, op_tok, name, args, attrs, ty in pending:
            try:
                ops.get(op_tok.text)
            except IRError as e:
                raise ParseError(op_tok.line, op_tok.col, str(e)) from None
            inputs = []
            for a in args:
                src = a.text[1:]
                if src not in defined:
                    raise ParseError(a.line, a.col, f"%{name} reads %{src}, which is never defined")
                if src not in seen:
                    raise ParseError(
                        a.line, a.col, f"%{name} reads %{src}, defined further down (a cycle, or nodes out of order)"
                    )
                inputs.append(defined[src])
            node = defined[name]
            node.inputs = tuple(inputs)
            if op_tok.text not in SOURCES:
                try:
                    inferred = infer_node(name, op_tok.text, [i.type for i in inputs], attrs)
                except ShapeError as e:
                    raise ShapeError(e.rule, f"line {ref.line}: {e.node}") from None
                except IRError as e:
                    raise ParseError(ref.line, ref.col, str(e)) from None
                if inferred != ty:
                    raise ShapeError(
                        f"written type {ty} but the inputs give {inferred}", f"line {ref.line}: %{name} ({op_tok.text})"
                    )
            g.nodes.append(node)
            seen.add(name)
        for r in returns:
            if r.text[1:] not in defined:
                raise ParseError(r.line, r.col, f"return %{r.text[1:]}: no such node")
            g.outputs.append(defined[r.text[1:]])
        check_graph(g)
        return g


def parse(text: str) -> Graph:
    """The graph `text` describes, checked as the builder checks (constants without values)."""
    return _Parser(text).graph()


__all__ = ["ParseError", "node_line", "parse", "to_text", "tokenize"]
