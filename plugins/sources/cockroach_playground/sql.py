"""The SQL the playground understands, parsed by hand and run against the :class:`Store`.

Statements: CREATE TABLE, ALTER TABLE ADD/DROP COLUMN, DROP TABLE, INSERT,
UPSERT, UPDATE, DELETE, BEGIN/COMMIT/ROLLBACK, SELECT (one table or the
catalog tables ``information_schema.{tables,columns,table_constraints,
key_column_usage}`` and ``crdb_internal.tables``, ``AS OF SYSTEM TIME``,
conjunctive WHERE, ORDER BY, LIMIT, ``count(*)``; or expressions without
FROM such as ``cluster_logical_timestamp()``), SHOW (ZONE CONFIGURATION,
TABLES, session variables), SET, and sinkless ``CREATE CHANGEFEED`` (run by
:mod:`.changefeed`). Errors are :class:`SQLError` with a SQLSTATE.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from cdcflow.plugins.sources.cockroach_playground.store import Column, Store, TableDef
from cdcflow.plugins.sources.cockroachdb.hlc import HLC

__all__ = ["Result", "SQLError", "Session", "split_statements"]


class SQLError(Exception):
    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
        self.message = message


@dataclass
class Result:
    """What a statement returns: columns (name, type text), rows, a command tag, or a feed to stream."""

    columns: list[tuple[str, str]] = field(default_factory=list)
    rows: list[list[Any]] = field(default_factory=list)
    tag: str = ""
    feed: Any = None  # a ChangefeedSpec for CREATE CHANGEFEED


_TOKEN = re.compile(
    r"\s+|--[^\n]*|(?P<str>[eE]?'(?:[^']|'')*')|(?P<qid>\"(?:[^\"]|\"\")*\")|(?P<num>\d+\.\d*|\.\d+|\d+)"
    r"|(?P<param>\$\d+)|(?P<id>[A-Za-z_][A-Za-z0-9_$]*)|(?P<op>::|<>|!=|<=|>=|[(),.*=<>+\-/;\[\]:])"
)


@dataclass(frozen=True)
class Tok:
    kind: str
    text: str

    @property
    def up(self) -> str:
        return self.text.upper() if self.kind == "id" else self.text


def tokenize(sql: str) -> list[Tok]:
    out: list[Tok] = []
    pos = 0
    while pos < len(sql):
        m = _TOKEN.match(sql, pos)
        if m is None:
            raise SQLError("42601", f'at or near "{sql[pos : pos + 10]}": syntax error')
        pos = m.end()
        kind = m.lastgroup
        if kind is None:
            continue
        text = m.group(kind)
        if kind == "str":
            text = text[text.index("'") + 1 : -1].replace("''", "'")
        elif kind == "qid":
            kind, text = "qid", text[1:-1].replace('""', '"')
        out.append(Tok(kind, text))
    return out


def split_statements(sql: str) -> list[str]:
    """The statements of a simple-query string (split on ``;`` outside quotes)."""
    parts: list[str] = []
    cur: list[str] = []
    quote = ""
    for ch in sql:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == ";":
            parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur))
    return [p for p in (s.strip() for s in parts) if p]


class _P:
    """A cursor over tokens with the helpers of a recursive-descent parser."""

    def __init__(self, toks: list[Tok], params: Sequence[Any]) -> None:
        self.t = toks
        self.i = 0
        self.params = params

    def peek(self, off: int = 0) -> Tok | None:
        return self.t[self.i + off] if self.i + off < len(self.t) else None

    def at(self, *words: str) -> bool:
        for off, w in enumerate(words):
            tok = self.peek(off)
            if tok is None or tok.up != w or tok.kind in ("str", "qid"):
                return False
        return True

    def accept(self, *words: str) -> bool:
        if self.at(*words):
            self.i += len(words)
            return True
        return False

    def expect(self, *words: str) -> None:
        if not self.accept(*words):
            tok = self.peek()
            raise SQLError("42601", f'at or near "{tok.text if tok else "EOF"}": syntax error')

    def next(self) -> Tok:
        tok = self.peek()
        if tok is None:
            raise SQLError("42601", "at or near EOF: syntax error")
        self.i += 1
        return tok

    def ident(self) -> str:
        tok = self.next()
        if tok.kind not in ("id", "qid"):
            raise SQLError("42601", f'at or near "{tok.text}": syntax error')
        return tok.text if tok.kind == "qid" else tok.text.lower()

    def name(self) -> str:
        """A possibly qualified name; returns the last part (database and schema are the playground's)."""
        parts = [self.ident()]
        while self.accept("."):
            parts.append(self.ident())
        return ".".join(parts[-2:]) if parts[0] in ("information_schema", "crdb_internal") else parts[-1]

    def done(self) -> bool:
        return self.i >= len(self.t)


# -- expressions ---------------------------------------------------------------------------------

Expr = Callable[[dict[str, Any]], Any]


def _expr(p: _P, session: Session) -> Expr:
    left = _term(p, session)
    while p.peek() is not None and p.peek().text in ("+", "-", "*", "/"):  # type: ignore[union-attr]
        op = p.next().text
        right = _term(p, session)
        left = _arith(op, left, right)
    return left


def _arith(op: str, left: Expr, right: Expr) -> Expr:
    def run(row: dict[str, Any]) -> Any:
        a, b = left(row), right(row)
        if a is None or b is None:
            return None
        if isinstance(a, Decimal) or isinstance(b, Decimal):
            a, b = Decimal(str(a)), Decimal(str(b))
        return {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "/": lambda: a / b}[op]()

    return run


def _term(p: _P, session: Session) -> Expr:  # noqa: PLR0912
    tok = p.next()
    value: Expr
    if tok.text == "(":
        value = _expr(p, session)
        p.expect(")")
    elif tok.text == "-":
        inner = _term(p, session)
        value = lambda row: -inner(row)  # noqa: E731
    elif tok.kind == "num":
        v: Any = Decimal(tok.text) if "." in tok.text else int(tok.text)
        value = lambda row: v  # noqa: E731
    elif tok.kind == "str":
        s = tok.text
        value = lambda row: s  # noqa: E731
    elif tok.kind == "param":
        n = int(tok.text[1:]) - 1
        if n >= len(p.params):
            raise SQLError("08P01", f"no value provided for placeholder: {tok.text}")
        pv = p.params[n]
        value = lambda row: pv  # noqa: E731
    elif tok.up in ("NULL", "TRUE", "FALSE"):
        c = {"NULL": None, "TRUE": True, "FALSE": False}[tok.up]
        value = lambda row: c  # noqa: E731
    elif tok.kind in ("id", "qid") and p.peek() is not None and p.peek().text == "(":  # type: ignore[union-attr]
        p.next()
        args: list[Expr] = []
        if p.accept("*"):
            args = []
        elif not p.at(")"):
            args.append(_expr(p, session))
            while p.accept(","):
                args.append(_expr(p, session))
        p.expect(")")
        value = session.function(tok.text.lower(), args)
    elif tok.kind in ("id", "qid"):
        col = tok.text if tok.kind == "qid" else tok.text.lower()
        if p.accept("."):
            col = p.ident()

        def read(row: dict[str, Any], col: str = col) -> Any:
            if col not in row:
                raise SQLError("42703", f'column "{col}" does not exist')
            return row[col]

        value = read
    else:
        raise SQLError("42601", f'at or near "{tok.text}": syntax error')
    if p.accept("::"):
        type_text = _type_text(p)
        inner_value = value
        value = lambda row: inner_value(row) if type_text.upper() != "JSONB" else _json_value(inner_value(row))  # noqa: E731
    return value


def _json_value(v: Any) -> Any:
    return json.loads(v) if isinstance(v, str) else v


def _type_text(p: _P) -> str:
    words = [p.next().text.upper()]
    while (
        (tok := p.peek()) is not None
        and tok.kind == "id"
        and tok.up
        in (
            "PRECISION",
            "VARYING",
            "WITH",
            "WITHOUT",
            "TIME",
            "ZONE",
        )
    ):
        words.append(p.next().text.upper())
    text = " ".join(words)
    if p.accept("("):
        args = [p.next().text]
        while p.accept(","):
            args.append(p.next().text)
        p.expect(")")
        text += f"({','.join(args)})"
    if p.accept("[", "]"):
        text += "[]"
    return text


_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "=": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<>": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


class _Where:
    """A WHERE clause; ``point`` = (column, value) when it is exactly ``column = <constant>``."""

    def __init__(self, conds: list[Callable[[dict[str, Any]], bool]], point: tuple[str, Any] | None) -> None:
        self.conds, self.point = conds, point

    def __call__(self, row: dict[str, Any]) -> bool:
        return all(c(row) for c in self.conds)


def _point(p: _P, session: Session) -> tuple[str, Any] | None:
    """``column = <literal or parameter>`` and nothing after it: (column, value), the rest untouched."""
    col, eq, value = p.peek(), p.peek(1), p.peek(2)
    if col is None or eq is None or value is None or p.peek(3) is not None:
        return None
    if col.kind not in ("id", "qid") or eq.text != "=" or value.kind not in ("num", "str", "param"):
        return None
    probe = _P([value], p.params)
    return (col.text if col.kind == "qid" else col.text.lower()), _expr(probe, session)({})


def _where(p: _P, session: Session) -> Callable[[dict[str, Any]], bool]:
    conds: list[Callable[[dict[str, Any]], bool]] = []
    if not p.accept("WHERE"):
        return lambda row: True
    point = _point(p, session)
    while True:
        left = _expr(p, session)
        if p.accept("IS", "NOT", "NULL"):
            conds.append(_is_null(left, negate=True))
        elif p.accept("IS", "NULL"):
            conds.append(_is_null(left, negate=False))
        elif p.accept("IN"):
            p.expect("(")
            items = [_expr(p, session)]
            while p.accept(","):
                items.append(_expr(p, session))
            p.expect(")")
            conds.append(_in(left, items))
        else:
            op = p.next().text
            if op not in _COMPARE:
                raise SQLError("42601", f'at or near "{op}": syntax error')
            conds.append(_compare(left, _expr(p, session), _COMPARE[op]))
        if not p.accept("AND"):
            break
    return _Where(conds, point)


def _is_null(left: Expr, *, negate: bool) -> Callable[[dict[str, Any]], bool]:
    return lambda row: (left(row) is None) != negate


def _in(left: Expr, items: list[Expr]) -> Callable[[dict[str, Any]], bool]:
    return lambda row: any(_eq(left(row), i(row)) for i in items)


def _compare(left: Expr, right: Expr, cmp: Callable[[Any, Any], bool]) -> Callable[[dict[str, Any]], bool]:
    def run(row: dict[str, Any]) -> bool:
        a, b = left(row), right(row)
        return a is not None and b is not None and bool(cmp(*_same(a, b)))

    return run


def _same(a: Any, b: Any) -> tuple[Any, Any]:
    """Compare a stored value with a literal or parameter (text parameters against numbers…)."""
    if isinstance(a, (int, Decimal, float)) and isinstance(b, str):
        return a, type(a)(b) if not isinstance(a, bool) else b
    if isinstance(b, (int, Decimal, float)) and isinstance(a, str):
        return type(b)(a), b
    return a, b


def _eq(a: Any, b: Any) -> bool:
    return a is not None and b is not None and _COMPARE["="](*_same(a, b))


# -- values -----------------------------------------------------------------------------------------


def coerce(value: Any, type_text: str) -> Any:
    """A literal or parameter as the Python value a column of ``type_text`` stores."""
    if value is None:
        return None
    t = type_text.upper()
    try:
        if t.startswith(("INT", "BIGINT", "SMALLINT", "SERIAL")):
            return int(value)
        if t.startswith(("FLOAT", "REAL", "DOUBLE")):
            return float(value)
        if t.startswith(("DECIMAL", "NUMERIC")):
            m = re.search(r"\(\s*\d+\s*,\s*(\d+)\s*\)", t)
            d = Decimal(str(value))
            return d.quantize(Decimal(1).scaleb(-int(m.group(1)))) if m else d
        if t.startswith("BOOL"):
            return value if isinstance(value, bool) else str(value).lower() in ("t", "true", "1", "yes", "on")
        if t.startswith(("BYTES", "BYTEA")):
            if isinstance(value, (bytes, bytearray, memoryview)):
                return bytes(value)
            return bytes.fromhex(value[2:]) if str(value).startswith("\\x") else str(value).encode()
        if t == "DATE":
            return value if isinstance(value, dt.date) else dt.date.fromisoformat(str(value))
        if t.startswith("TIMESTAMPTZ"):
            v = value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(str(value))
            return (v if v.tzinfo else v.replace(tzinfo=dt.UTC)).astimezone(dt.UTC)
        if t.startswith("TIMESTAMP"):
            v = value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(str(value))
            return v.astimezone(dt.UTC).replace(tzinfo=None) if v.tzinfo else v
        if t.startswith("JSON"):
            return json.loads(value) if isinstance(value, str) else value
    except (ValueError, ArithmeticError) as exc:
        raise SQLError("22P02", f"could not parse {value!r} as type {type_text}: {exc}") from exc
    return str(value)


# -- the session ------------------------------------------------------------------------------------

_SESSION_VARS = {
    "transaction_isolation": "serializable",
    "server_version": "13.0.0",
    "client_encoding": "UTF8",
    "datestyle": "ISO, MDY",
    "timezone": "UTC",
    "application_name": "",
    "standard_conforming_strings": "on",
}


class Session:
    """One SQL connection's state: the open transaction and its buffered writes."""

    def __init__(self, store: Store, user: str = "root", version: str = "CockroachDB CCL v26.2.0 (playground)") -> None:
        self.store = store
        self.user = user
        self.version = version
        self.txn: list[tuple[str, tuple[Any, ...], dict[str, Any] | None]] | None = None
        self.txn_failed = False
        #: Hook of the playground's fault injection: called before each commit.
        self.before_commit: Callable[[], None] = lambda: None

    # functions without FROM
    def function(self, name: str, args: list[Expr]) -> Expr:
        store = self.store
        if name == "cluster_logical_timestamp":
            return lambda row: Decimal(str(store.now()))
        if name in ("now", "current_timestamp", "statement_timestamp"):
            return lambda row: dt.datetime.now(dt.UTC)
        if name == "current_database":
            return lambda row: store.database
        if name in ("current_user", "session_user"):
            return lambda row: self.user
        if name == "version":
            return lambda row: self.version
        if name == "count":
            return lambda row: row.get("__count__", 0)
        if name in ("lower", "upper") and len(args) == 1:
            return lambda row: getattr(str(args[0](row)), name)()
        raise SQLError("42883", f"unknown function: {name}()")

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Result:
        p = _P(tokenize(sql), params)
        if p.done():
            return Result(tag="")
        if self.txn_failed and not (p.at("ROLLBACK") or p.at("COMMIT") or p.at("END")):
            raise SQLError("25P02", "current transaction is aborted, commands ignored until end of transaction block")
        try:
            return self._dispatch(p)
        except SQLError:
            if self.txn is not None:
                self.txn_failed = True
            raise

    def _dispatch(self, p: _P) -> Result:  # noqa: PLR0912
        if p.accept("BEGIN") or p.accept("START", "TRANSACTION"):
            p.accept("TRANSACTION")
            self.txn, self.txn_failed = [], False
            return Result(tag="BEGIN")
        if p.accept("COMMIT") or p.accept("END"):
            writes, failed = self.txn or [], self.txn_failed
            self.txn, self.txn_failed = None, False
            if failed:
                return Result(tag="ROLLBACK")
            self.before_commit()
            self.store.commit(writes)
            return Result(tag="COMMIT")
        if p.accept("ROLLBACK"):
            self.txn, self.txn_failed = None, False
            return Result(tag="ROLLBACK")
        if p.accept("SET"):
            return Result(tag="SET")
        if p.at("SHOW"):
            return self._show(p)
        if p.at("SELECT"):
            return self._select(p)
        if p.at("CREATE", "CHANGEFEED") or p.at("EXPERIMENTAL", "CHANGEFEED"):
            from cdcflow.plugins.sources.cockroach_playground.changefeed import parse_changefeed

            return Result(
                columns=[("table", "STRING"), ("key", "BYTES"), ("value", "BYTES")], feed=parse_changefeed(p, self)
            )
        if p.accept("CREATE", "TABLE"):
            return self._create_table(p)
        if p.accept("ALTER", "TABLE"):
            return self._alter(p)
        if p.accept("DROP", "TABLE"):
            p.accept("IF", "EXISTS")
            name = p.name()
            with contextlib.suppress(LookupError):
                self.store.alter(name, None)
            return Result(tag="DROP TABLE")
        if p.at("INSERT") or p.at("UPSERT"):
            return self._insert(p)
        if p.accept("UPDATE"):
            return self._update(p)
        if p.accept("DELETE", "FROM"):
            return self._delete(p)
        tok = p.peek()
        raise SQLError(
            "42601", f'at or near "{tok.text if tok else ""}": syntax error (not supported by the playground)'
        )

    # -- DDL
    def _column_def(self, p: _P) -> tuple[Column, bool]:
        name = p.ident()
        type_text = _type_text(p)
        nullable, default, pk = True, None, False
        while not p.done() and not p.at(",") and not p.at(")"):
            if p.accept("NOT", "NULL"):
                nullable = False
            elif p.accept("NULL"):
                nullable = True
            elif p.accept("PRIMARY", "KEY"):
                pk, nullable = True, False
            elif p.accept("DEFAULT"):
                default = coerce(_expr(p, self)({}), type_text)
            else:
                p.next()  # UNIQUE, CHECK… accepted and ignored
        return Column(name, type_text, nullable, default), pk

    def _create_table(self, p: _P) -> Result:
        if_not_exists = p.accept("IF", "NOT", "EXISTS")
        name = p.name()
        p.expect("(")
        columns: list[Column] = []
        pk: list[str] = []
        while True:
            if p.accept("PRIMARY", "KEY"):
                p.expect("(")
                pk.append(p.ident())
                while p.accept(","):
                    pk.append(p.ident())
                p.expect(")")
            else:
                col, is_pk = self._column_def(p)
                columns.append(col)
                if is_pk:
                    pk.append(col.name)
            if not p.accept(","):
                break
        p.expect(")")
        columns = [Column(c.name, c.type, False, c.default) if c.name in pk else c for c in columns]
        try:
            self.store.create_table(name, tuple(columns), tuple(pk))
        except KeyError:
            if not if_not_exists:
                raise SQLError("42P07", f'relation "{name}" already exists') from None
        return Result(tag="CREATE TABLE")

    def _alter(self, p: _P) -> Result:
        name = p.name()
        try:
            self.store.table(name)
        except LookupError:
            raise SQLError("42P01", f'relation "{name}" does not exist') from None
        if p.accept("ADD"):
            p.accept("COLUMN")
            p.accept("IF", "NOT", "EXISTS")
            col, _ = self._column_def(p)
            self.store.add_column(name, col)
        elif p.accept("DROP"):
            p.accept("COLUMN")
            p.accept("IF", "EXISTS")
            self.store.drop_column(name, p.ident())
        else:
            raise SQLError("0A000", "the playground supports ALTER TABLE … ADD/DROP COLUMN only")
        return Result(tag="ALTER TABLE")

    # -- DML
    def _definition(self, name: str) -> TableDef:
        try:
            d = self.store.table(name).descriptor()
        except LookupError:
            raise SQLError("42P01", f'relation "{name}" does not exist') from None
        assert d is not None
        return d

    def _current(self, name: str, key: tuple[Any, ...]) -> dict[str, Any] | None:
        pending: list[tuple[str, tuple[Any, ...], dict[str, Any] | None]] = self.txn or []
        for t, k, row in reversed(pending):
            if t == name and k == key:
                found: dict[str, Any] | None = row
                return found
        current: dict[str, Any] | None = self.store.table(name).value(key)
        return current

    def _write(self, writes: list[tuple[str, tuple[Any, ...], dict[str, Any] | None]]) -> None:
        if self.txn is not None:
            self.txn.extend(writes)
        else:
            self.before_commit()
            self.store.commit(writes)

    def _insert(self, p: _P) -> Result:  # noqa: PLR0912
        upsert = p.next().up == "UPSERT"
        p.expect("INTO")
        name = p.name()
        d = self._definition(name)
        cols = [c.name for c in d.columns]
        if p.accept("("):
            cols = [p.ident()]
            while p.accept(","):
                cols.append(p.ident())
            p.expect(")")
        p.expect("VALUES")
        writes: list[tuple[str, tuple[Any, ...], dict[str, Any] | None]] = []
        while True:
            p.expect("(")
            values = [_expr(p, self)({})]
            while p.accept(","):
                values.append(_expr(p, self)({}))
            p.expect(")")
            if len(values) != len(cols):
                raise SQLError("42601", f"INSERT has {len(values)} expressions but {len(cols)} target columns")
            given = dict(zip(cols, values, strict=True))
            row = {}
            for c in d.columns:
                row[c.name] = coerce(given[c.name], c.type) if c.name in given else c.default
                if row[c.name] is None and not c.nullable:
                    raise SQLError("23502", f'null value in column "{c.name}" violates not-null constraint')
            key = tuple(row[k] for k in d.pk)
            existing = self._current(name, key)
            if existing is not None and not upsert:
                if p.accept("ON", "CONFLICT"):
                    while not p.done():
                        p.next()
                    upsert = True
                else:
                    raise SQLError("23505", f'duplicate key value violates unique constraint "{name}_pkey"')
            if upsert and existing is not None:
                row = {**d.project(existing), **{c: row[c] for c in given}}  # type: ignore[dict-item]
            writes.append((name, key, row))
            if not p.accept(","):
                break
        if p.accept("ON", "CONFLICT"):
            while not p.done():
                p.next()
        self._write(writes)
        return Result(tag=f"INSERT 0 {len(writes)}")

    def _matching(
        self, name: str, where: Callable[[dict[str, Any]], bool]
    ) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        d = self._definition(name)
        table = self.store.table(name)
        point = where.point if isinstance(where, _Where) else None
        pk_column = d.column(d.pk[0]) if len(d.pk) == 1 else None
        if point is not None and pk_column is not None and point[0] == pk_column.name:
            keys = {(coerce(point[1], pk_column.type),)}  # a primary-key lookup: no scan
        else:
            keys = set(table.rows) | {k for t, k, _ in (self.txn or []) if t == name}
        out = []
        for key in keys:
            row = d.project(self._current(name, key))
            if row is not None and where(row):
                out.append((key, row))
        return out

    def _update(self, p: _P) -> Result:
        name = p.name()
        d = self._definition(name)
        p.expect("SET")
        sets: list[tuple[str, Expr]] = []
        while True:
            col = p.ident()
            p.expect("=")
            sets.append((col, _expr(p, self)))
            if not p.accept(","):
                break
        where = _where(p, self)
        writes: list[tuple[str, tuple[Any, ...], dict[str, Any] | None]] = []
        for _key, row in self._matching(name, where):
            new = dict(row)
            for col, e in sets:
                c = d.column(col)
                if c is None:
                    raise SQLError("42703", f'column "{col}" does not exist')
                new[col] = coerce(e(row), c.type)
            writes.append((name, tuple(new[k] for k in d.pk), new))
        self._write(writes)
        return Result(tag=f"UPDATE {len(writes)}")

    def _delete(self, p: _P) -> Result:
        name = p.name()
        where = _where(p, self)
        writes: list[tuple[str, tuple[Any, ...], dict[str, Any] | None]] = [
            (name, key, None) for key, _ in self._matching(name, where)
        ]
        self._write(writes)
        return Result(tag=f"DELETE {len(writes)}")

    # -- queries
    def _as_of(self, p: _P) -> HLC | None:
        if not p.accept("AS", "OF", "SYSTEM", "TIME"):
            return None
        value = _expr(p, self)({})
        text = str(value)
        if text.startswith("-"):
            seconds = float(re.sub(r"[a-z]+$", "", text[1:]) or 0)
            return HLC(self.store.now().wall_ns - int(seconds * 1e9))
        return HLC.parse(text)

    def _select(self, p: _P) -> Result:  # noqa: PLR0912
        p.expect("SELECT")
        items: list[tuple[str, Expr | None]] = []
        while True:
            if p.accept("*"):
                items.append(("*", None))
            else:
                start = p.i
                e = _expr(p, self)
                label = p.t[start].text.lower() if p.i - start == 1 or p.t[start + 1].text == "(" else "?column?"
                if p.accept("AS"):
                    label = p.ident()
                items.append((label, e))
            if not p.accept(","):
                break
        if not p.accept("FROM"):
            row = [e({}) for _, e in items if e is not None]
            return Result([(label, _type_of(v)) for (label, _), v in zip(items, row, strict=True)], [row], "SELECT 1")
        name = p.name()
        at = self._as_of(p)
        columns, rows = self._relation(name, at)
        where = _where(p, self)
        rows = [r for r in rows if where(r)]
        if p.accept("ORDER", "BY"):
            keys = [p.ident()]
            while p.accept(","):
                keys.append(p.ident())
            rows.sort(key=lambda r: tuple((r[k] is None, r[k]) for k in keys))
        if p.accept("LIMIT"):
            rows = rows[: int(p.next().text)]
        if any(label == "count" for label, _ in items):
            return Result([("count", "INT8")], [[len(rows)]], "SELECT 1")
        out_cols: list[tuple[str, str]] = []
        getters: list[Callable[[dict[str, Any]], Any]] = []
        for label, item in items:
            if item is None:
                out_cols.extend(columns)
                getters.extend(_getter(n) for n, _ in columns)
            else:
                types = dict(columns)
                out_cols.append((label, types.get(label, "STRING")))
                getters.append(item)
        return Result(out_cols, [[g(r) for g in getters] for r in rows], f"SELECT {len(rows)}")

    def _relation(self, name: str, at: HLC | None) -> tuple[list[tuple[str, str]], list[dict[str, Any]]]:
        from cdcflow.plugins.sources.cockroach_playground.catalog import catalog_relation

        found = catalog_relation(self.store, name, at)
        if found is not None:
            return found
        try:
            table = self.store.table(name, at)
        except LookupError:
            raise SQLError("42P01", f'relation "{name}" does not exist') from None
        if at is not None and at < table.gc_threshold:
            raise SQLError(
                "XXUUU",
                f"batch timestamp {at.go_string()} must be after replica GC threshold {table.gc_threshold.go_string()}",
            )
        d = table.descriptor(at)
        assert d is not None
        return [(c.name, c.type) for c in d.columns], self.store.rows_at(name, at)

    def _show(self, p: _P) -> Result:
        p.expect("SHOW")
        if p.accept("ZONE", "CONFIGURATION"):
            p.accept("FROM") or p.accept("FOR")
            p.expect("TABLE")
            name = p.name()
            try:
                ttl = self.store.table(name).gc_ttl_seconds
            except LookupError:
                raise SQLError("42P01", f'relation "{name}" does not exist') from None
            config = f"ALTER TABLE {name} CONFIGURE ZONE USING\n\tgc.ttlseconds = {ttl}"
            return Result([("target", "STRING"), ("raw_config_sql", "STRING")], [[f"TABLE {name}", config]], "SHOW")
        if p.accept("TABLES"):
            names = sorted(n for n, t in self.store.tables.items() if t.descriptor() is not None)
            return Result([("table_name", "STRING")], [[n] for n in names], "SHOW")
        var = p.ident()
        return Result([(var, "STRING")], [[_SESSION_VARS.get(var, "")]], "SHOW")


def _getter(name: str) -> Callable[[dict[str, Any]], Any]:
    return lambda row: row[name]


def _type_of(v: Any) -> str:
    if isinstance(v, bool):
        return "BOOL"
    if isinstance(v, int):
        return "INT8"
    if isinstance(v, Decimal):
        return "DECIMAL"
    if isinstance(v, float):
        return "FLOAT8"
    if isinstance(v, dt.datetime):
        return "TIMESTAMPTZ" if v.tzinfo else "TIMESTAMP"
    return "STRING"
