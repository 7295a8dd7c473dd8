"""Spark SQL expressions over row images, compiled to Python closures.

Transforms (``filter``'s predicate, ``project``'s computed columns) are
written in Spark SQL. They run in the Spark tasks that mount the rows, on
Python values, so cdcflow parses them itself — once per transform and table
schema, into a tree of closures — and evaluates the closures per row; no
Spark job runs per expression and nothing is parsed per row.

The subset (Spark SQL's syntax and its NULL semantics; anything else is
refused when the connector is validated, with the position):

* literals: integers, decimals (``1.5`` is a DECIMAL, ``1.5e3`` a DOUBLE),
  ``'strings'`` (``''`` or ``\\'`` for a quote), ``TRUE``, ``FALSE``, ``NULL``;
* columns by name (case-insensitive, ```back quoted``` for any name),
  ``_before.col`` (the old image of an update or a delete; NULL for an
  insert), ``_op`` (``'insert'``, ``'update'``, ``'delete'``), ``_commit_ts``;
* ``OR``, ``AND``, ``NOT``, ``=``, ``==``, ``<=>``, ``!=``, ``<>``, ``<``,
  ``<=``, ``>``, ``>=``, ``IS [NOT] NULL``, ``IS [NOT] TRUE|FALSE``,
  ``[NOT] IN (…)``, ``[NOT] BETWEEN … AND …``, ``[NOT] LIKE`` (``%``,
  ``_``, ``\\`` escapes), ``[NOT] RLIKE`` / ``REGEXP`` (Python ``re``
  search), ``+``, ``-``, ``*``, ``/`` (always a DOUBLE, NULL on division by
  zero), ``%``, ``DIV``, ``||``, unary ``-``, parentheses;
* ``CASE WHEN … THEN … [ELSE …] END`` and ``CASE x WHEN v THEN … END``;
* ``CAST(x AS type)`` to ``string``, ``int``/``bigint``/``smallint``/``tinyint``,
  ``double``/``float``, ``decimal[(p,s)]``, ``boolean``, ``date``; a cast that
  fails is NULL (Spark's non-ANSI mode);
* functions: ``upper``/``ucase``, ``lower``/``lcase``, ``trim``, ``ltrim``,
  ``rtrim``, ``length``/``char_length``, ``substring``/``substr``, ``left``,
  ``right``, ``concat``, ``concat_ws``, ``replace``, ``regexp_replace``,
  ``startswith``, ``endswith``, ``contains``, ``coalesce``, ``nvl``,
  ``ifnull``, ``nullif``, ``if``, ``abs``, ``round``, ``floor``, ``ceil``,
  ``greatest``, ``least``, ``sha2(x, 256)``, ``md5``, ``year``, ``month``,
  ``day``/``dayofmonth``, ``hour``.

Predicates follow three-valued logic: a comparison with NULL is NULL, and a
filter keeps a row only when its predicate is TRUE.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import hashlib
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Compiled", "Env", "ExpressionError", "compile_expression", "parse", "referenced_columns"]

#: What a compiled expression is evaluated on: (image, old image or None, op, commit ts).
Env = tuple[Mapping[str, Any], Mapping[str, Any] | None, str, int]
Compiled = Callable[[Env], Any]


class ExpressionError(ValueError):
    """An expression that does not parse or names what does not exist; ``position``
    is the 0-based offset in the text (None: the whole expression)."""

    def __init__(self, message: str, position: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.position = position

    def __str__(self) -> str:
        return self.message if self.position is None else f"{self.message} (at character {self.position + 1})"


# -- tokens ---------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<number>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
  | (?P<string>'(?:[^'\\]|\\.|'')*')
  | (?P<dstring>"(?:[^"\\]|\\.|"")*")
  | (?P<quoted>`(?:[^`]|``)*`)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op><=>|==|!=|<>|<=|>=|\|\||[=<>+\-*/%(),.])
    """,
    re.VERBOSE,
)


@dataclass(frozen=True, slots=True)
class _Tok:
    kind: str  # number, string, ident, keyword, op, end
    text: str
    pos: int


_KEYWORDS = frozenset(
    [
        "AND",
        "OR",
        "NOT",
        "IS",
        "NULL",
        "TRUE",
        "FALSE",
        "IN",
        "BETWEEN",
        "LIKE",
        "RLIKE",
        "REGEXP",
        "CASE",
        "WHEN",
        "THEN",
        "ELSE",
        "END",
        "CAST",
        "AS",
        "DIV",
    ]
)


def _tokens(text: str) -> list[_Tok]:
    out: list[_Tok] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ExpressionError(f"unexpected character {text[pos]!r}", pos)
        kind = m.lastgroup or ""
        value = m.group()
        if kind == "name":
            upper = value.upper()
            out.append(_Tok("keyword", upper, pos) if upper in _KEYWORDS else _Tok("ident", value, pos))
        elif kind == "quoted":
            out.append(_Tok("ident", value[1:-1].replace("``", "`"), pos))
        elif kind in ("string", "dstring"):
            quote = value[0]
            body = value[1:-1].replace(quote * 2, quote)
            body = re.sub(r"\\(.)", lambda g: {"n": "\n", "t": "\t", "0": "\0"}.get(g.group(1), g.group(1)), body)
            out.append(_Tok("string", body, pos))
        elif kind != "ws":
            out.append(_Tok(kind, value, pos))
        pos = m.end()
    out.append(_Tok("end", "", len(text)))
    return out


# -- syntax tree ----------------------------------------------------------------------
# Nodes are tuples: ("lit", value) ("col", name, pos) ("before", name, pos) ("op",) ("ts",)
# ("not", x) ("and", a, b) ("or", a, b) ("cmp", op, a, b) ("arith", op, a, b) ("neg", x)
# ("isnull", x, negated) ("istrue", x, want, negated) ("in", x, items, negated)
# ("between", x, lo, hi, negated) ("like", x, pattern, negated, regex) ("case", base, whens, else)
# ("cast", x, type, pos) ("call", name, args, pos)

Node = tuple[Any, ...]


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokens(text)
        self.i = 0

    def peek(self, offset: int = 0) -> _Tok:
        return self.toks[min(self.i + offset, len(self.toks) - 1)]

    def next(self) -> _Tok:
        tok = self.toks[self.i]
        self.i = min(self.i + 1, len(self.toks) - 1)
        return tok

    def at(self, kind: str, text: str | None = None) -> bool:
        tok = self.peek()
        return tok.kind == kind and (text is None or tok.text == text)

    def accept(self, kind: str, text: str | None = None) -> bool:
        if self.at(kind, text):
            self.next()
            return True
        return False

    def expect(self, kind: str, text: str | None = None) -> _Tok:
        if not self.at(kind, text):
            tok = self.peek()
            found = "the end of the expression" if tok.kind == "end" else repr(tok.text)
            raise ExpressionError(f"expected {text or kind}, found {found}", tok.pos)
        return self.next()

    def parse(self) -> Node:
        node = self.expr()
        if not self.at("end"):
            tok = self.peek()
            raise ExpressionError(f"unexpected {tok.text!r}", tok.pos)
        return node

    def expr(self) -> Node:
        node = self.conjunction()
        while self.accept("keyword", "OR"):
            node = ("or", node, self.conjunction())
        return node

    def conjunction(self) -> Node:
        node = self.negation()
        while self.accept("keyword", "AND"):
            node = ("and", node, self.negation())
        return node

    def negation(self) -> Node:
        if self.accept("keyword", "NOT"):
            return ("not", self.negation())
        return self.predicate()

    def predicate(self) -> Node:  # noqa: PLR0912
        node = self.additive()
        while True:
            tok = self.peek()
            if tok.kind == "op" and tok.text in ("=", "==", "<=>", "!=", "<>", "<", "<=", ">", ">="):
                self.next()
                node = ("cmp", tok.text, node, self.additive())
                continue
            if self.accept("keyword", "IS"):
                negated = self.accept("keyword", "NOT")
                if self.accept("keyword", "NULL"):
                    node = ("isnull", node, negated)
                elif self.accept("keyword", "TRUE"):
                    node = ("istrue", node, True, negated)
                elif self.accept("keyword", "FALSE"):
                    node = ("istrue", node, False, negated)
                else:
                    raise ExpressionError("expected NULL, TRUE or FALSE after IS", self.peek().pos)
                continue
            negated = False
            if (
                self.at("keyword", "NOT")
                and self.peek(1).kind == "keyword"
                and self.peek(1).text
                in (
                    "IN",
                    "BETWEEN",
                    "LIKE",
                    "RLIKE",
                    "REGEXP",
                )
            ):
                self.next()
                negated = True
            if self.accept("keyword", "IN"):
                self.expect("op", "(")
                items = [self.expr()]
                while self.accept("op", ","):
                    items.append(self.expr())
                self.expect("op", ")")
                node = ("in", node, tuple(items), negated)
            elif self.accept("keyword", "BETWEEN"):
                low = self.additive()
                self.expect("keyword", "AND")
                node = ("between", node, low, self.additive(), negated)
            elif self.accept("keyword", "LIKE"):
                node = ("like", node, self.additive(), negated, False)
            elif self.accept("keyword", "RLIKE") or self.accept("keyword", "REGEXP"):
                node = ("like", node, self.additive(), negated, True)
            elif negated:
                raise ExpressionError("expected IN, BETWEEN, LIKE or RLIKE after NOT", self.peek().pos)
            else:
                return node

    def additive(self) -> Node:
        node = self.multiplicative()
        while True:
            tok = self.peek()
            if tok.kind == "op" and tok.text in ("+", "-", "||"):
                self.next()
                node = ("arith", tok.text, node, self.multiplicative())
            else:
                return node

    def multiplicative(self) -> Node:
        node = self.unary()
        while True:
            tok = self.peek()
            if (tok.kind == "op" and tok.text in ("*", "/", "%")) or (tok.kind == "keyword" and tok.text == "DIV"):
                self.next()
                node = ("arith", tok.text, node, self.unary())
            else:
                return node

    def unary(self) -> Node:
        if self.accept("op", "-"):
            return ("neg", self.unary())
        if self.accept("op", "+"):
            return self.unary()
        return self.primary()

    def primary(self) -> Node:  # noqa: PLR0912
        tok = self.next()
        if tok.kind == "number":
            if re.search(r"[eE]", tok.text):
                return ("lit", float(tok.text))
            if "." in tok.text:
                return ("lit", decimal.Decimal(tok.text))
            return ("lit", int(tok.text))
        if tok.kind == "string":
            return ("lit", tok.text)
        if tok.kind == "op" and tok.text == "(":
            node = self.expr()
            self.expect("op", ")")
            return node
        if tok.kind == "keyword":
            if tok.text == "NULL":
                return ("lit", None)
            if tok.text in ("TRUE", "FALSE"):
                return ("lit", tok.text == "TRUE")
            if tok.text == "CASE":
                return self.case()
            if tok.text == "CAST":
                self.expect("op", "(")
                value = self.expr()
                self.expect("keyword", "AS")
                type_tok = self.expect("ident")
                type_text = type_tok.text.lower()
                if self.accept("op", "("):
                    sizes = [self.expect("number").text]
                    while self.accept("op", ","):
                        sizes.append(self.expect("number").text)
                    self.expect("op", ")")
                    type_text += "(" + ",".join(sizes) + ")"
                self.expect("op", ")")
                return ("cast", value, type_text, type_tok.pos)
            raise ExpressionError(f"unexpected {tok.text}", tok.pos)
        if tok.kind == "ident":
            if self.at("op", "("):
                self.next()
                args: list[Node] = []
                if not self.at("op", ")"):
                    args.append(self.expr())
                    while self.accept("op", ","):
                        args.append(self.expr())
                self.expect("op", ")")
                return ("call", tok.text.lower(), tuple(args), tok.pos)
            if tok.text.lower() == "_before" and self.accept("op", "."):
                column = self.expect("ident")
                return ("before", column.text, column.pos)
            if self.at("op", "."):
                raise ExpressionError(
                    f"qualified name {tok.text}.… : only columns of the row and _before.<column> can be named", tok.pos
                )
            if tok.text.lower() == "_op":
                return ("opname",)
            if tok.text.lower() == "_commit_ts":
                return ("ts",)
            return ("col", tok.text, tok.pos)
        found = "the end of the expression" if tok.kind == "end" else repr(tok.text)
        raise ExpressionError(f"expected a value, found {found}", tok.pos)

    def case(self) -> Node:
        base = None if self.at("keyword", "WHEN") else self.expr()
        whens: list[tuple[Node, Node]] = []
        while self.accept("keyword", "WHEN"):
            cond = self.expr()
            self.expect("keyword", "THEN")
            whens.append((cond, self.expr()))
        if not whens:
            raise ExpressionError("CASE needs at least one WHEN", self.peek().pos)
        otherwise = self.expr() if self.accept("keyword", "ELSE") else ("lit", None)
        self.expect("keyword", "END")
        return ("case", base, tuple(whens), otherwise)


def parse(text: str) -> Node:
    """The syntax tree of ``text``; ExpressionError when it is not in the supported subset."""
    if not text.strip():
        raise ExpressionError("the expression is empty")
    return _Parser(text).parse()


def referenced_columns(node: Node) -> set[str]:
    """The names of the columns ``node`` reads (of the row and of ``_before``)."""
    found: set[str] = set()

    def walk(n: Any) -> None:
        if isinstance(n, tuple):
            if n and n[0] in ("col", "before"):
                found.add(n[1])
                return
            for part in n[1:]:
                walk(part)

    walk(node)
    return found


# -- evaluation -----------------------------------------------------------------------


def _numeric(a: Any, b: Any) -> tuple[Any, Any]:
    """Operands of one arithmetic type: a float beside a Decimal makes both floats."""
    if isinstance(a, float) and isinstance(b, decimal.Decimal):
        return a, float(b)
    if isinstance(a, decimal.Decimal) and isinstance(b, float):
        return float(a), b
    if isinstance(a, bool):
        a = int(a)
    if isinstance(b, bool):
        b = int(b)
    return a, b


def _comparable(a: Any, b: Any) -> tuple[Any, Any]:
    """Spark compares a string with a number as numbers, a date with a string as dates."""
    if isinstance(a, str) and isinstance(b, int | float | decimal.Decimal) and not isinstance(b, bool):
        return _cast_number(a, type(b)), b
    if isinstance(b, str) and isinstance(a, int | float | decimal.Decimal) and not isinstance(a, bool):
        return a, _cast_number(b, type(a))
    if isinstance(a, _dt.date) and isinstance(b, str):
        return a, _cast_date(b, type(a))
    if isinstance(b, _dt.date) and isinstance(a, str):
        return _cast_date(a, type(b)), b
    if isinstance(a, bytes) and isinstance(b, str):
        return a, b.encode()
    if isinstance(b, bytes) and isinstance(a, str):
        return a.encode(), b
    return _numeric(a, b)


def _cast_number(text: str, kind: type) -> Any:
    try:
        if kind is int:
            return int(decimal.Decimal(text.strip()))
        if kind is float:
            return float(text)
        return decimal.Decimal(text.strip())
    except (ValueError, decimal.InvalidOperation):
        return None


def _cast_date(text: str, kind: type) -> Any:
    try:
        if kind is _dt.datetime:
            return _dt.datetime.fromisoformat(text.strip())
        return _dt.date.fromisoformat(text.strip()[:10])
    except ValueError:
        return None


_CMP: dict[str, Callable[[Any, Any], bool]] = {
    "=": lambda a, b: bool(a == b),
    "==": lambda a, b: bool(a == b),
    "!=": lambda a, b: bool(a != b),
    "<>": lambda a, b: bool(a != b),
    "<": lambda a, b: bool(a < b),
    "<=": lambda a, b: bool(a <= b),
    ">": lambda a, b: bool(a > b),
    ">=": lambda a, b: bool(a >= b),
}


def _text(value: Any) -> str:
    """A value as Spark casts it to a string."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, _dt.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, _dt.timedelta):
        total = int(value.total_seconds())
        sign = "-" if total < 0 else ""
        total = abs(total)
        return f"{sign}{total // 3600:02d}:{total // 60 % 60:02d}:{total % 60:02d}"
    return str(value)


def _arith(op: str, a: Any, b: Any) -> Any:
    if a is None or b is None:
        return None
    if op == "||":
        return _text(a) + _text(b)
    if isinstance(a, str):
        a = _cast_number(a, float)
    if isinstance(b, str):
        b = _cast_number(b, float)
    if a is None or b is None:
        return None
    a, b = _numeric(a, b)
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return None if b == 0 else float(a) / float(b)
    if op == "%":
        if b == 0:
            return None
        return math.fmod(a, b) if isinstance(a, float) or isinstance(b, float) else a - b * int(a / b)
    if op == "DIV":
        return None if b == 0 else int(a / b)
    raise ExpressionError(f"unknown operator {op}")


def _like_regex(pattern: str) -> re.Pattern[str]:
    out = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if ch == "%" else "." if ch == "_" else re.escape(ch))
        i += 1
    return re.compile("".join(out), re.DOTALL)


def _cast(value: Any, type_text: str) -> Any:
    if value is None:
        return None
    base = type_text.split("(", maxsplit=1)[0]
    try:
        if base in ("string", "varchar", "char"):
            return _text(value)
        if base in ("int", "integer", "bigint", "long", "smallint", "tinyint", "short", "byte"):
            if isinstance(value, str):
                return _cast_number(value, int)
            return int(value)
        if base in ("double", "float", "real"):
            return float(value)
        if base in ("decimal", "numeric", "dec"):
            number = decimal.Decimal(value.strip() if isinstance(value, str) else str(value))
            args = type_text[len(base) :].strip("()")
            scale = int(args.split(",")[1]) if "," in args else 0
            return number.quantize(decimal.Decimal(1).scaleb(-scale), rounding=decimal.ROUND_HALF_UP)
        if base in ("boolean", "bool"):
            if isinstance(value, str):
                lowered = value.strip().lower()
                return True if lowered in ("true", "t", "yes", "y", "1") else False if lowered in (
                    "false", "f", "no", "n", "0"
                ) else None  # fmt: skip
            return bool(value)
        if base == "date":
            if isinstance(value, _dt.datetime):
                return value.date()
            if isinstance(value, _dt.date):
                return value
            return _cast_date(_text(value), _dt.date)
    except (ValueError, TypeError, decimal.InvalidOperation, OverflowError):
        return None
    raise ExpressionError(f"CAST to {type_text} is not supported")


_CAST_TYPES = frozenset(
    [
        "string",
        "varchar",
        "char",
        "int",
        "integer",
        "bigint",
        "long",
        "smallint",
        "tinyint",
        "short",
        "byte",
        "double",
        "float",
        "real",
        "decimal",
        "numeric",
        "dec",
        "boolean",
        "bool",
        "date",
    ]
)


def _substring(s: Any, pos: Any, length: Any = None) -> Any:
    if s is None or pos is None:
        return None
    text = _text(s)
    pos = int(pos)
    start = pos - 1 if pos > 0 else len(text) + pos if pos < 0 else 0
    start = max(start, 0)
    if length is None:
        return text[start:]
    return text[start : start + max(int(length), 0)]


def _round(x: Any, digits: Any = 0) -> Any:
    if x is None:
        return None
    q = decimal.Decimal(1).scaleb(-int(digits))
    if isinstance(x, float):
        return float(decimal.Decimal(repr(x)).quantize(q, rounding=decimal.ROUND_HALF_UP))
    if isinstance(x, int):
        return int(decimal.Decimal(x).quantize(q, rounding=decimal.ROUND_HALF_UP)) if digits < 0 else x
    return decimal.Decimal(x).quantize(q, rounding=decimal.ROUND_HALF_UP)


def _sha2(x: Any, bits: Any = 256) -> Any:
    if x is None:
        return None
    algorithms = {224: "sha224", 256: "sha256", 0: "sha256", 384: "sha384", 512: "sha512"}
    name = algorithms.get(int(bits))
    if name is None:
        return None
    data = x if isinstance(x, bytes) else _text(x).encode()
    return hashlib.new(name, data).hexdigest()


def _strict(fn: Callable[..., Any]) -> Callable[..., Any]:
    """NULL in, NULL out."""

    def call(*args: Any) -> Any:
        if any(a is None for a in args):
            return None
        return fn(*args)

    return call


def _greatest(*args: Any) -> Any:
    values = [a for a in args if a is not None]
    return max(values) if values else None


def _least(*args: Any) -> Any:
    values = [a for a in args if a is not None]
    return min(values) if values else None


#: name → (function, min args, max args); NULL-handling is each function's.
_FUNCTIONS: dict[str, tuple[Callable[..., Any], int, int]] = {
    "upper": (_strict(lambda s: _text(s).upper()), 1, 1),
    "ucase": (_strict(lambda s: _text(s).upper()), 1, 1),
    "lower": (_strict(lambda s: _text(s).lower()), 1, 1),
    "lcase": (_strict(lambda s: _text(s).lower()), 1, 1),
    "trim": (_strict(lambda s: _text(s).strip(" ")), 1, 1),
    "ltrim": (_strict(lambda s: _text(s).lstrip(" ")), 1, 1),
    "rtrim": (_strict(lambda s: _text(s).rstrip(" ")), 1, 1),
    "length": (_strict(lambda s: len(s) if isinstance(s, bytes) else len(_text(s))), 1, 1),
    "char_length": (_strict(lambda s: len(_text(s))), 1, 1),
    "substring": (_substring, 2, 3),
    "substr": (_substring, 2, 3),
    "left": (_strict(lambda s, n: _text(s)[: max(int(n), 0)]), 2, 2),
    "right": (_strict(lambda s, n: _text(s)[len(_text(s)) - int(n) :] if int(n) > 0 else ""), 2, 2),
    "concat": (_strict(lambda *a: "".join(_text(x) for x in a)), 1, 255),
    "concat_ws": (
        lambda sep, *a: None if sep is None else _text(sep).join(_text(x) for x in a if x is not None),
        1,
        255,
    ),
    "replace": (_strict(lambda s, old, new="": _text(s).replace(_text(old), _text(new))), 2, 3),
    "regexp_replace": (_strict(lambda s, p, r: re.sub(_text(p), re.sub(r"\$(\d)", r"\\\1", _text(r)), _text(s))), 3, 3),
    "startswith": (_strict(lambda s, p: _text(s).startswith(_text(p))), 2, 2),
    "endswith": (_strict(lambda s, p: _text(s).endswith(_text(p))), 2, 2),
    "contains": (_strict(lambda s, p: _text(p) in _text(s)), 2, 2),
    "coalesce": (lambda *a: next((x for x in a if x is not None), None), 1, 255),
    "nvl": (lambda a, b: b if a is None else a, 2, 2),
    "ifnull": (lambda a, b: b if a is None else a, 2, 2),
    "nullif": (lambda a, b: None if a is not None and b is not None and a == b else a, 2, 2),
    "abs": (_strict(abs), 1, 1),
    "round": (_round, 1, 2),
    "floor": (_strict(math.floor), 1, 1),
    "ceil": (_strict(math.ceil), 1, 1),
    "ceiling": (_strict(math.ceil), 1, 1),
    "greatest": (_greatest, 1, 255),
    "least": (_least, 1, 255),
    "sha2": (_sha2, 2, 2),
    "md5": (_strict(lambda x: hashlib.md5(x if isinstance(x, bytes) else _text(x).encode()).hexdigest()), 1, 1),
    "year": (_strict(lambda d: d.year), 1, 1),
    "month": (_strict(lambda d: d.month), 1, 1),
    "day": (_strict(lambda d: d.day), 1, 1),
    "dayofmonth": (_strict(lambda d: d.day), 1, 1),
    "hour": (_strict(lambda d: d.hour if isinstance(d, _dt.datetime) else 0), 1, 1),
}

#: Functions that are conditionals (lazy arguments): if(cond, a, b).
_CONDITIONALS = frozenset({"if", "iff"})


def compile_expression(node: Node, columns: Iterable[str] | None = None) -> Compiled:  # noqa: PLR0915
    """A closure evaluating ``node`` on an :data:`Env`.

    ``columns``: the table's column names; a name is resolved against them
    case-insensitively (to the name the row images use), and a name that is not
    among them is an ExpressionError. None: names are taken as written.
    """
    by_lower = None if columns is None else {c.lower(): c for c in columns}

    def resolve(name: str, pos: int) -> str:
        if by_lower is None:
            return name
        found = by_lower.get(name.lower())
        if found is None:
            known = ", ".join(sorted(by_lower.values())) or "none"
            raise ExpressionError(f"unknown column '{name}'; the table has: {known}", pos)
        return found

    def build(n: Node) -> Compiled:  # noqa: PLR0912, PLR0915
        kind = n[0]
        if kind == "lit":
            value = n[1]
            return lambda e: value
        if kind == "col":
            name = resolve(n[1], n[2])
            return lambda e: e[0].get(name)
        if kind == "before":
            name = resolve(n[1], n[2])
            return lambda e: None if e[1] is None else e[1].get(name)
        if kind == "opname":
            return lambda e: e[2]
        if kind == "ts":
            return lambda e: e[3]
        if kind == "not":
            inner = build(n[1])

            def negate(e: Env) -> Any:
                v = inner(e)
                return None if v is None else not v

            return negate
        if kind == "and":
            left, right = build(n[1]), build(n[2])

            def both(e: Env) -> Any:
                a = left(e)
                if a is False:
                    return False
                b = right(e)
                if b is False:
                    return False
                return None if a is None or b is None else bool(a and b)

            return both
        if kind == "or":
            left, right = build(n[1]), build(n[2])

            def either(e: Env) -> Any:
                a = left(e)
                if a is True:
                    return True
                b = right(e)
                if b is True:
                    return True
                return None if a is None or b is None else bool(a or b)

            return either
        if kind == "cmp":
            op, left, right = n[1], build(n[2]), build(n[3])
            if op == "<=>":
                return lambda e: _null_safe_equal(left(e), right(e))
            test = _CMP[op]

            def compare(e: Env) -> Any:
                a, b = left(e), right(e)
                if a is None or b is None:
                    return None
                try:
                    return test(*_comparable(a, b))
                except TypeError:
                    return None

            return compare
        if kind == "arith":
            op, left, right = n[1], build(n[2]), build(n[3])

            def arithmetic(e: Env) -> Any:
                try:
                    return _arith(op, left(e), right(e))
                except (TypeError, decimal.InvalidOperation, OverflowError):
                    return None

            return arithmetic
        if kind == "neg":
            inner = build(n[1])
            return lambda e: None if (v := inner(e)) is None else -v
        if kind == "isnull":
            inner, negated = build(n[1]), n[2]
            return lambda e: (inner(e) is None) != negated
        if kind == "istrue":
            inner, want, negated = build(n[1]), n[2], n[3]
            return lambda e: ((v := inner(e)) is not None and bool(v) == want) != negated
        if kind == "in":
            inner, items, negated = build(n[1]), [build(i) for i in n[2]], n[3]

            def member(e: Env) -> Any:
                v = inner(e)
                if v is None:
                    return None
                saw_null = False
                for item in items:
                    w = item(e)
                    if w is None:
                        saw_null = True
                        continue
                    a, b = _comparable(v, w)
                    if a == b:
                        return not negated
                return None if saw_null else negated

            return member
        if kind == "between":
            inner, low, high, negated = build(n[1]), build(n[2]), build(n[3]), n[4]

            def within(e: Env) -> Any:
                v, lo, hi = inner(e), low(e), high(e)
                if v is None or lo is None or hi is None:
                    return None
                try:
                    a, b = _comparable(v, lo)
                    c, d = _comparable(v, hi)
                    return (a >= b and c <= d) != negated
                except TypeError:
                    return None

            return within
        if kind == "like":
            inner, pattern_node, negated, regex = build(n[1]), n[2], n[3], n[4]
            if pattern_node[0] == "lit" and isinstance(pattern_node[1], str):
                text = pattern_node[1]
                try:
                    fixed = re.compile(text) if regex else _like_regex(text)
                except re.error as exc:
                    raise ExpressionError(f"not a regular expression: {text!r}: {exc}") from None
                match = fixed.search if regex else fixed.fullmatch
                return lambda e: None if (v := inner(e)) is None else (match(_text(v)) is not None) != negated
            pattern = build(pattern_node)

            def like(e: Env) -> Any:
                v, p = inner(e), pattern(e)
                if v is None or p is None:
                    return None
                compiled = re.compile(_text(p)) if regex else _like_regex(_text(p))
                found = compiled.search(_text(v)) if regex else compiled.fullmatch(_text(v))
                return (found is not None) != negated

            return like
        if kind == "case":
            base = None if n[1] is None else build(n[1])
            whens = [(build(c), build(r)) for c, r in n[2]]
            otherwise = build(n[3])

            def case(e: Env) -> Any:
                if base is None:
                    for cond, result in whens:
                        if cond(e) is True:
                            return result(e)
                else:
                    v = base(e)
                    for cond, result in whens:
                        w = cond(e)
                        if v is not None and w is not None and _null_safe_equal(v, w):
                            return result(e)
                return otherwise(e)

            return case
        if kind == "cast":
            inner, type_text, pos = build(n[1]), n[2], n[3]
            if type_text.split("(")[0] not in _CAST_TYPES:
                raise ExpressionError(f"CAST to {type_text} is not supported", pos)
            return lambda e: _cast(inner(e), type_text)
        if kind == "call":
            name, arg_nodes, pos = n[1], n[2], n[3]
            args = [build(a) for a in arg_nodes]
            if name in _CONDITIONALS:
                if len(args) != 3:
                    raise ExpressionError(f"{name}() takes 3 arguments, got {len(args)}", pos)
                cond, then, otherwise_ = args
                return lambda e: then(e) if cond(e) is True else otherwise_(e)
            entry = _FUNCTIONS.get(name)
            if entry is None:
                raise ExpressionError(f"unknown or unsupported function {name}()", pos)
            fn, low_n, high_n = entry
            if not low_n <= len(args) <= high_n:
                want = str(low_n) if low_n == high_n else f"{low_n} to {high_n}"
                raise ExpressionError(f"{name}() takes {want} argument(s), got {len(args)}", pos)

            def call(e: Env) -> Any:
                try:
                    return fn(*(a(e) for a in args))
                except (TypeError, ValueError, AttributeError, decimal.InvalidOperation, OverflowError, re.error):
                    return None

            return call
        raise ExpressionError(f"unsupported expression {kind}")

    return build(node)


def _null_safe_equal(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    try:
        x, y = _comparable(a, b)
        return bool(x == y)
    except TypeError:
        return False
