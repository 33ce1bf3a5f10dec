#!/usr/bin/env python3
"""Generate ``pipeline/protocol/messages/*.py`` from Kafka's JSON message specs.

Usage::

    python tools/gen_messages.py            # (re)write pipeline/protocol/messages/
    python tools/gen_messages.py --check    # exit 1 if the committed files are stale

Reads ``tools/kafka-specs/<Name>Request.json`` / ``<Name>Response.json``
(Apache Kafka's own definitions, Apache License 2.0, or, for the admin APIs
Kafka's specs were not available for, JSON written for this project from the
protocol guide; the generated module's docstring says which). The output is plain,
straight-line Python: one frozen, slotted, kw-only dataclass per struct with
explicit ``_write``/``_read`` methods that branch on ``version`` only where the
wire format actually changes. No reflection happens at run time.

The spec model (``load_spec``, ``Message``, ``Field``) is importable so tests
can build hypothesis strategies from the same definitions.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SPEC_DIR = Path(__file__).resolve().parent / "kafka-specs"
OUT_DIR = ROOT / "pipeline" / "protocol" / "messages"

# (module name, spec base name)
APIS: tuple[tuple[str, str], ...] = (
    ("produce", "Produce"),
    ("fetch", "Fetch"),
    ("list_offsets", "ListOffsets"),
    ("metadata", "Metadata"),
    ("sasl_handshake", "SaslHandshake"),
    ("api_versions", "ApiVersions"),
    ("create_topics", "CreateTopics"),
    ("delete_topics", "DeleteTopics"),
    ("init_producer_id", "InitProducerId"),
    ("sasl_authenticate", "SaslAuthenticate"),
    ("describe_configs", "DescribeConfigs"),
    ("elect_leaders", "ElectLeaders"),
    ("incremental_alter_configs", "IncrementalAlterConfigs"),
    ("alter_partition_reassignments", "AlterPartitionReassignments"),
    ("list_partition_reassignments", "ListPartitionReassignments"),
    # transactions
    ("find_coordinator", "FindCoordinator"),
    ("add_partitions_to_txn", "AddPartitionsToTxn"),
    ("add_offsets_to_txn", "AddOffsetsToTxn"),
    ("end_txn", "EndTxn"),
    ("txn_offset_commit", "TxnOffsetCommit"),
    ("describe_transactions", "DescribeTransactions"),
    ("list_transactions", "ListTransactions"),
    # consumer groups (classic and KIP-848)
    ("offset_commit", "OffsetCommit"),
    ("offset_fetch", "OffsetFetch"),
    ("join_group", "JoinGroup"),
    ("heartbeat", "Heartbeat"),
    ("leave_group", "LeaveGroup"),
    ("sync_group", "SyncGroup"),
    ("describe_groups", "DescribeGroups"),
    ("list_groups", "ListGroups"),
    ("delete_groups", "DeleteGroups"),
    ("offset_delete", "OffsetDelete"),
    ("consumer_group_heartbeat", "ConsumerGroupHeartbeat"),
    ("consumer_group_describe", "ConsumerGroupDescribe"),
)

PRIMITIVES = {
    "int8": ("int", "int8"),
    "int16": ("int", "int16"),
    "int32": ("int", "int32"),
    "int64": ("int", "int64"),
    "uint16": ("int", "uint16"),
    "uint32": ("int", "uint32"),
    "float64": ("float", "float64"),
    "bool": ("bool", "boolean"),
    "uuid": ("uuid.UUID", "uuid"),
}
VARIABLE = {"string", "bytes", "records"}

#: (class, field) pairs that carry credentials: left out of the generated ``repr``, so a
#: logged or recorded request never shows a password or token (SASL PLAIN and OAUTHBEARER
#: send them in auth_bytes; SCRAM's proofs are no business of a log either).
SECRET_FIELDS = {
    ("SaslAuthenticateRequest", "auth_bytes"),
    ("SaslAuthenticateResponse", "auth_bytes"),
}


# --------------------------------------------------------------------------- spec model


def strip_comments(text: str) -> str:
    """Remove ``//`` line comments outside of JSON strings."""
    out: list[str] = []
    i = 0
    n = len(text)
    in_str = False
    while i < n:
        c = text[i]
        if in_str:
            out.append(c)
            if c == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 2
                continue
            if c == '"':
                in_str = False
            i += 1
            continue
        if c == '"':
            in_str = True
            out.append(c)
            i += 1
            continue
        if c == "/" and i + 1 < n and text[i + 1] == "/":
            while i < n and text[i] != "\n":
                i += 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def parse_versions(spec: str | None, lo: int, hi: int) -> frozenset[int]:
    """``"3+"``, ``"1-4"``, ``"7"``, ``"none"`` -> the set of versions within ``[lo, hi]``."""
    if spec is None or spec == "none" or spec == "":
        return frozenset()
    spec = str(spec)
    if spec.endswith("+"):
        a, b = int(spec[:-1]), hi
    elif "-" in spec:
        sa, sb = spec.split("-", 1)
        a, b = int(sa), int(sb)
    else:
        a = b = int(spec)
    return frozenset(range(max(a, lo), min(b, hi) + 1))


_CAMEL1 = re.compile(r"(.)([A-Z][a-z]+)")
_CAMEL2 = re.compile(r"([a-z0-9])([A-Z])")


def snake_case(name: str) -> str:
    """``ThrottleTimeMs`` -> ``throttle_time_ms``; ``TopicId`` -> ``topic_id``; ``timeoutMs`` -> ``timeout_ms``."""
    s = _CAMEL1.sub(r"\1_\2", name)
    s = _CAMEL2.sub(r"\1_\2", s)
    return s.lower()


@dataclass
class Field:
    name: str  # spec name
    py: str  # snake_case attribute name
    type: str  # spec type ("int32", "[]Foo", "Foo", "string", ...)
    versions: frozenset[int]
    nullable: frozenset[int]
    tagged: frozenset[int]
    tag: int | None
    ignorable: bool
    default: object  # raw spec default (None when absent)
    about: str
    struct: Struct | None = None  # for struct / []struct types

    @property
    def is_array(self) -> bool:
        return self.type.startswith("[]")

    @property
    def elem(self) -> str:
        return self.type[2:] if self.is_array else self.type

    @property
    def is_struct(self) -> bool:
        return self.struct is not None

    @property
    def nullable_somewhere(self) -> bool:
        return bool(self.nullable & self.versions)

    @property
    def nullable_everywhere(self) -> bool:
        return bool(self.versions) and self.versions <= self.nullable


@dataclass
class Struct:
    name: str  # python class name
    spec_name: str
    fields: list[Field]
    versions: frozenset[int]  # versions in which this struct can appear


@dataclass
class Message:
    name: str  # e.g. ProduceRequest
    kind: str  # request | response
    api_key: int
    lo: int
    hi: int
    flexible: frozenset[int]
    flexible_from: int | None
    root: Struct
    structs: list[Struct] = field(default_factory=list)  # nested, dependency order (leaves first)
    source: str = ""
    license_header: str = ""

    @property
    def valid(self) -> frozenset[int]:
        return frozenset(range(self.lo, self.hi + 1))


def load_spec(path: Path, *, taken: Iterable[str] = ()) -> Message:
    text = path.read_text(encoding="utf-8")
    header_lines = []
    for line in text.splitlines():
        if line.startswith("//"):
            header_lines.append(line)
        else:
            break
    raw = json.loads(strip_comments(text))
    lo_s, _, hi_s = str(raw["validVersions"]).partition("-")
    lo, hi = int(lo_s), int(hi_s or lo_s)
    flexible = parse_versions(raw.get("flexibleVersions"), lo, hi)
    taken_names = set(taken)
    prefix = "Response" if raw["type"] == "response" else ""
    structs: list[Struct] = []
    by_spec_name: dict[str, Struct] = {}
    common = {s["name"]: s for s in raw.get("commonStructs", [])}

    valid = frozenset(range(lo, hi + 1))

    def build_fields(specs: list[dict[str, Any]], context: frozenset[int]) -> list[Field]:
        fields: list[Field] = []
        for fs in specs:
            ftype = str(fs["type"])
            versions = parse_versions(str(fs.get("versions", "none")), lo, hi) & context
            f = Field(
                name=str(fs["name"]),
                py=snake_case(str(fs["name"])),
                type=ftype,
                versions=versions,
                nullable=parse_versions(_opt_str(fs.get("nullableVersions")), lo, hi),
                tagged=parse_versions(_opt_str(fs.get("taggedVersions")), lo, hi),
                tag=int(str(fs["tag"])) if "tag" in fs else None,
                ignorable=bool(fs.get("ignorable", False)),
                default=fs.get("default"),
                about=str(fs.get("about", "")),
            )
            elem = f.elem
            if elem not in PRIMITIVES and elem not in VARIABLE:
                sub_fields = fs.get("fields")
                shared = sub_fields is None and elem in common
                if shared and elem in by_spec_name:
                    # a common struct used by several fields is one class; its fields are
                    # built for every version (their own ``versions`` still apply)
                    sub_fields = None
                elif shared:
                    sub_fields = common[elem]["fields"]
                if sub_fields is None:
                    if elem not in by_spec_name:
                        raise ValueError(f"{path.name}: unknown type {ftype}")
                    st = by_spec_name[elem]
                    st.versions = st.versions | versions
                else:
                    if elem in by_spec_name:
                        raise ValueError(f"{path.name}: struct {elem} defined twice")
                    pyname = elem
                    if pyname in taken_names:
                        pyname = prefix + elem
                    if pyname in taken_names:
                        raise ValueError(f"{path.name}: struct name clash {pyname}")
                    taken_names.add(pyname)
                    st = Struct(pyname, elem, [], versions)
                    by_spec_name[elem] = st
                    st.fields = build_fields(list(sub_fields), valid if shared else versions)
                    structs.append(st)
                f.struct = st
            if f.tag is not None and not f.tagged:
                f.tagged = f.versions
            fields.append(f)
        return fields

    root_fields = build_fields(list(raw["fields"]), valid)
    name = str(raw["name"])
    if name in taken_names:
        raise ValueError(f"{path.name}: top-level name clash {name}")
    root = Struct(name, name, root_fields, valid)
    flex_from = min(flexible) if flexible else None
    return Message(
        name=name,
        kind=str(raw["type"]),
        api_key=int(raw.get("apiKey", -1)),
        lo=lo,
        hi=hi,
        flexible=flexible,
        flexible_from=flex_from,
        root=root,
        structs=structs,
        source=path.name,
        license_header="\n".join(header_lines),
    )


def _opt_str(v: object) -> str | None:
    return None if v is None else str(v)


def load_api(base: str) -> tuple[Message, Message]:
    req = load_spec(SPEC_DIR / f"{base}Request.json")
    taken = {req.root.name, *(s.name for s in req.structs)}
    resp = load_spec(SPEC_DIR / f"{base}Response.json", taken=taken)
    return req, resp


# --------------------------------------------------------------------------- defaults


def py_type(f: Field) -> str:
    elem = f.elem
    if f.struct is not None:
        t = f.struct.name
    elif elem in PRIMITIVES:
        t = PRIMITIVES[elem][0]
    elif elem == "string":
        t = "str"
    else:  # bytes / records
        t = "bytes"
    if f.is_array:
        t = f"tuple[{t}, ...]"
    if f.nullable_somewhere and (f.is_array or elem in VARIABLE or f.struct is not None):
        t = f"{t} | None"
    return t


def null_struct(f: Field) -> bool:
    """A single (non-array) struct field that may be null: Kafka writes an int8 marker
    before it (-1 null, 1 present) in the versions it is nullable in."""
    return f.struct is not None and not f.is_array and f.nullable_somewhere


def default_value(f: Field) -> object:
    """The Python default value (used by tests too)."""
    d = f.default
    elem = f.elem
    if f.is_array:
        if d == "null":
            return None
        return ()
    if f.struct is not None:
        return None  # sentinel: default-constructed struct (or null, see default_expr)
    if elem in ("int8", "int16", "int32", "int64", "uint16", "uint32"):
        if d is None or d == "":
            return 0
        s = str(d).strip()
        neg = s.startswith("-")
        s = s.lstrip("-")
        v = int(s, 16) if s.lower().startswith("0x") else int(s)
        return -v if neg else v
    if elem == "float64":
        return float(str(d)) if d not in (None, "") else 0.0
    if elem == "bool":
        return str(d).lower() == "true" if d is not None else False
    if elem == "uuid":
        return "ZERO_UUID"
    if elem == "string":
        if d == "null":
            return None
        if d is None and f.nullable_everywhere:
            return None
        return str(d) if d is not None else ""
    # bytes / records
    if d == "null" or f.nullable_everywhere:
        return None
    return b""


def default_expr(f: Field) -> str:
    if f.struct is not None and not f.is_array:
        if null_struct(f) and f.default == "null":
            return "None"
        return f"{f.struct.name}()"
    v = default_value(f)
    if v == "ZERO_UUID":
        return "ZERO_UUID"
    if isinstance(v, str):
        return json.dumps(v)
    return repr(v)


# --------------------------------------------------------------------------- code emission


def differs(f: Field, expr: str) -> str:
    """``expr`` differs from the field's default (ruff-clean spelling)."""
    d = default_expr(f)
    if d == "None":
        return f"{expr} is not None"
    if d == "False":
        return expr
    if d == "True":
        return f"not {expr}"
    return f"{expr} != {d}"


def cond(s: frozenset[int], ctx: frozenset[int]) -> str | None:
    """A Python expression true exactly for versions in ``s`` (within context ``ctx``).

    Returns ``"True"``/``"False"`` when constant over ``ctx``.
    """
    inside = s & ctx
    if inside == ctx:
        return "True"
    if not inside:
        return "False"
    a, b = min(inside), max(inside)
    if frozenset(v for v in ctx if v >= a) == inside:
        return f"version >= {a}"
    if frozenset(v for v in ctx if v <= b) == inside:
        return f"version <= {b}"
    if frozenset(v for v in ctx if a <= v <= b) == inside:
        return f"{a} <= version <= {b}"
    return f"version in {tuple(sorted(inside))!r}"


class Emitter:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.indent = 0
        self.counter = 0

    def line(self, s: str = "") -> None:
        self.lines.append(("    " * self.indent + s) if s else "")

    def tmp(self, base: str) -> str:
        self.counter += 1
        return f"_{base}{self.counter}"


Body = Callable[[frozenset[int]], None]


def _branch(
    em: Emitter,
    s: frozenset[int],
    ctx: frozenset[int],
    body_true: Body | None,
    body_false: Body | None,
) -> None:
    """Emit ``if <s>: body_true(ctx&s) else: body_false(ctx-s)`` with constant folding.

    ``body_*`` are callables taking the narrowed context, or None.
    """
    c = cond(s, ctx)
    if c == "True":
        if body_true is not None:
            body_true(ctx)
        return
    if c == "False":
        if body_false is not None:
            body_false(ctx)
        return
    if body_true is None:
        if body_false is None:
            return
        em.line(f"if not ({c}):")
        em.indent += 1
        body_false(ctx - s)
        em.indent -= 1
        return
    em.line(f"if {c}:")
    em.indent += 1
    body_true(ctx & s)
    em.indent -= 1
    if body_false is not None:
        em.line("else:")
        em.indent += 1
        body_false(ctx - s)
        em.indent -= 1


def _write_scalar(em: Emitter, elem: str, expr: str, w: str, flexible: bool, nullable: bool) -> None:
    if elem in PRIMITIVES:
        em.line(f"{w}.{PRIMITIVES[elem][1]}({expr})")
        return
    kind = "string" if elem == "string" else "bytes"
    if flexible:
        meth = f"compact_nullable_{kind}" if nullable else f"compact_{kind}"
    else:
        meth = f"nullable_{kind}" if nullable else ("string" if kind == "string" else "bytes_")
    em.line(f"{w}.{meth}({expr})")


def _read_scalar(elem: str, r: str, flexible: bool, nullable: bool) -> str:
    if elem in PRIMITIVES:
        return f"{r}.{PRIMITIVES[elem][1]}()"
    kind = "string" if elem == "string" else "bytes"
    if flexible:
        meth = f"compact_nullable_{kind}" if nullable else f"compact_{kind}"
    else:
        meth = f"nullable_{kind}" if nullable else ("string" if kind == "string" else "bytes_")
    return f"{r}.{meth}()"


def emit_write_value(
    em: Emitter, msg: Message, owner: Struct, f: Field, expr: str, w: str, ctx: frozenset[int]
) -> None:
    """Write ``expr`` (the field's value) for versions ``ctx`` (all of which contain the field)."""

    def with_flex(flexible: bool) -> Body:
        def body(c1: frozenset[int]) -> None:
            def with_null(nullable: bool) -> Body:
                def body2(c2: frozenset[int]) -> None:
                    needs_check = (
                        not nullable
                        and f.nullable_somewhere
                        and (f.is_array or f.elem in VARIABLE or null_struct(f))
                    )
                    if needs_check:
                        em.line(f"if {expr} is None:")
                        em.indent += 1
                        em.line(
                            f'raise ValueError(f"{owner.name}.{f.py} is not nullable in version {{version}}")'
                        )
                        em.indent -= 1
                    if f.is_array:
                        v = em.tmp("e")
                        if nullable:
                            em.line(f"if {expr} is None:")
                            em.indent += 1
                            em.line(f"{w}.uvarint(0)" if flexible else f"{w}.int32(-1)")
                            em.indent -= 1
                            em.line("else:")
                            em.indent += 1
                        em.line(
                            f"{w}.uvarint(len({expr}) + 1)" if flexible else f"{w}.int32(len({expr}))"
                        )
                        em.line(f"for {v} in {expr}:")
                        em.indent += 1
                        if f.struct is not None:
                            em.line(f"{v}._write({w}, version)")
                        else:
                            _write_scalar(em, f.elem, v, w, flexible, False)
                        em.indent -= 1
                        if nullable:
                            em.indent -= 1
                    elif f.struct is not None and nullable:
                        em.line(f"if {expr} is None:")
                        em.indent += 1
                        em.line(f"{w}.int8(-1)")
                        em.indent -= 1
                        em.line("else:")
                        em.indent += 1
                        em.line(f"{w}.int8(1)")
                        em.line(f"{expr}._write({w}, version)")
                        em.indent -= 1
                    elif f.struct is not None:
                        em.line(f"{expr}._write({w}, version)")
                    else:
                        _write_scalar(em, f.elem, expr, w, flexible, nullable)

                return body2

            if _flex_sensitive(f) or null_struct(f):
                _branch(em, f.nullable, c1, with_null(True), with_null(False))
            else:
                with_null(False)(c1)

        return body

    if _flex_sensitive(f):
        _branch(em, msg.flexible, ctx, with_flex(True), with_flex(False))
    else:
        with_flex(False)(ctx)


def _flex_sensitive(f: Field) -> bool:
    return f.is_array or f.elem in VARIABLE


def emit_read_value(
    em: Emitter, msg: Message, f: Field, target: str, r: str, ctx: frozenset[int]
) -> None:
    def with_flex(flexible: bool) -> Body:
        def body(c1: frozenset[int]) -> None:
            def with_null(nullable: bool) -> Body:
                def body2(c2: frozenset[int]) -> None:
                    if f.is_array:
                        n = em.tmp("n")
                        nl = ", nullable=True" if nullable else ""
                        meth = "compact_array_length" if flexible else "array_length"
                        em.line(f"{n} = {r}.{meth}({nl.lstrip(', ')})")
                        if f.struct is not None:
                            item = f"{f.struct.name}._read({r}, version)"
                        else:
                            item = _read_scalar(f.elem, r, flexible, False)
                        comp = f"tuple([{item} for _ in range({n})])"
                        if nullable:
                            em.line(f"{target} = None if {n} < 0 else {comp}")
                        else:
                            em.line(f"{target} = {comp}")
                    elif f.struct is not None and nullable:
                        em.line(
                            f"{target} = None if {r}.int8() < 0 else {f.struct.name}._read({r}, version)"
                        )
                    elif f.struct is not None:
                        em.line(f"{target} = {f.struct.name}._read({r}, version)")
                    else:
                        em.line(f"{target} = {_read_scalar(f.elem, r, flexible, nullable)}")

                return body2

            if _flex_sensitive(f) or null_struct(f):
                _branch(em, f.nullable, c1, with_null(True), with_null(False))
            else:
                with_null(False)(c1)

        return body

    if _flex_sensitive(f):
        _branch(em, msg.flexible, ctx, with_flex(True), with_flex(False))
    else:
        with_flex(False)(ctx)


def emit_struct(
    em: Emitter, msg: Message, st: Struct, *, top: bool, response: str | None = None
) -> None:
    """One dataclass; the top-level one of a request names its ``response`` class."""
    em.line("@dataclass(frozen=True, slots=True, kw_only=True)")
    if not top:
        em.line(f"class {st.name}:")
    elif response is not None:
        em.line(f'class {st.name}(Request["{response}"]):')
    else:
        em.line(f"class {st.name}(Response):")
    em.indent += 1
    if top:
        em.line(f'"""{st.name} (API key {msg.api_key}, versions {msg.lo}-{msg.hi}, from {msg.source})."""')
    else:
        em.line(f'"""{st.spec_name} (in {msg.name}, {_vdesc(st.versions)})."""')
    em.line()
    if top:
        em.line(f"API_KEY: ClassVar[int] = {msg.api_key}")
        em.line(f"MIN_VERSION: ClassVar[int] = {msg.lo}")
        em.line(f"MAX_VERSION: ClassVar[int] = {msg.hi}")
        em.line(f"FLEXIBLE_VERSION: ClassVar[int | None] = {msg.flexible_from}")
        em.line()
    ctx = st.versions
    for f in st.fields:
        about = _about(f.about)
        extra = [_vdesc(f.versions)]
        if f.nullable & f.versions:
            extra.append("nullable " + _vdesc(f.nullable & f.versions))
        if f.tag is not None:
            extra.append(f"tag {f.tag}")
        em.line(f"#: {about} ({'; '.join(extra)})" if about else f"#: ({'; '.join(extra)})")
        if (st.name, f.py) in SECRET_FIELDS:
            em.line(f"{f.py}: {py_type(f)} = field(default={default_expr(f)}, repr=False)")
        else:
            em.line(f"{f.py}: {py_type(f)} = {default_expr(f)}")
    if not st.fields:
        em.line("pass" if not top else "")
    em.line()

    # ---------------------------------------------------------------- public API
    if top:
        em.line("def encode(self, version: int) -> bytes:")
        em.indent += 1
        em.line('"""Encode the body (no header, no size prefix) at ``version``."""')
        em.line("if not MIN_VER <= version <= MAX_VER:".replace("MIN_VER", str(msg.lo)).replace("MAX_VER", str(msg.hi)))
        em.indent += 1
        em.line(
            f'raise UnsupportedVersionError(f"{st.name} version {{version}} is outside {msg.lo}-{msg.hi}")'
        )
        em.indent -= 1
        em.line("w = Writer()")
        em.line("self._write(w, version)")
        em.line("return bytes(w.buf)")
        em.indent -= 1
        em.line()
        em.line("@classmethod")
        em.line("def decode(cls, data: bytes | bytearray | memoryview, version: int) -> Self:")
        em.indent += 1
        em.line('"""Decode a body (no header, no size prefix) encoded at ``version``."""')
        em.line(f"if not {msg.lo} <= version <= {msg.hi}:")
        em.indent += 1
        em.line(
            f'raise UnsupportedVersionError(f"{st.name} version {{version}} is outside {msg.lo}-{msg.hi}")'
        )
        em.indent -= 1
        em.line("return cls._read(Reader(data), version)")
        em.indent -= 1
        em.line()
        if response is not None:
            em.line(f"def response_type(self) -> type[{response}]:")
            em.indent += 1
            em.line('"""The response class the broker answers this request with."""')
            em.line(f"return {response}")
            em.indent -= 1
            em.line()

    # ---------------------------------------------------------------- _write
    em.line("def _write(self, w: Writer, version: int) -> None:")
    em.indent += 1
    start = len(em.lines)
    for f in st.fields:
        if f.tag is not None and f.tagged:
            # present only as a tagged field; non-tagged in versions outside tagged
            untagged = f.versions - f.tagged
        else:
            untagged = f.versions
        expr = f"self.{f.py}"

        def present(c: frozenset[int], f: Field = f, expr: str = expr) -> None:
            emit_write_value(em, msg, st, f, expr, "w", c)

        def absent(c: frozenset[int], f: Field = f, expr: str = expr) -> None:
            if f.ignorable or (f.tag is not None and f.tagged & c):
                return
            em.line(f"if {differs(f, expr)}:")
            em.indent += 1
            em.line(
                f'raise UnsupportedVersionError(f"{st.name}.{f.py} is not supported in version {{version}}")'
            )
            em.indent -= 1

        if f.ignorable or not (ctx - f.versions):
            _branch(em, untagged, ctx, present, None)
        else:
            _branch(em, untagged, ctx, present, absent)

    tagged = sorted((f for f in st.fields if f.tag is not None and f.tagged), key=lambda f: f.tag or 0)

    def write_tags(c: frozenset[int]) -> None:
        if not tagged:
            em.line("w.uvarint(0)")
            return
        cnt = em.tmp("tags")
        em.line(f"{cnt} = 0")
        for f in tagged:
            def count(c2: frozenset[int], f: Field = f) -> None:
                em.line(f"if {differs(f, 'self.' + f.py)}:")
                em.indent += 1
                em.line(f"{cnt} += 1")
                em.indent -= 1

            _branch(em, f.tagged, c, count, None)
        em.line(f"w.uvarint({cnt})")
        for f in tagged:
            def body(c2: frozenset[int], f: Field = f) -> None:
                em.line(f"if {differs(f, 'self.' + f.py)}:")
                em.indent += 1
                tw = em.tmp("tw")
                em.line(f"{tw} = Writer()")
                emit_write_value(em, msg, st, f, f"self.{f.py}", tw, c2)
                em.line(f"w.uvarint({f.tag})")
                em.line(f"w.uvarint(len({tw}.buf))")
                em.line(f"w.buf += {tw}.buf")
                em.indent -= 1

            _branch(em, f.tagged, c, body, None)

    _branch(em, msg.flexible, ctx, write_tags, None)
    if len(em.lines) == start:
        em.line("pass")
    em.indent -= 1
    em.line()

    # ---------------------------------------------------------------- _read
    em.line("@classmethod")
    em.line("def _read(cls, r: Reader, version: int) -> Self:")
    em.indent += 1
    for f in st.fields:
        untagged = f.versions - f.tagged if f.tag is not None else f.versions
        em.line(f"{f.py}: {py_type(f)}")

        def present_r(c: frozenset[int], f: Field = f) -> None:
            emit_read_value(em, msg, f, f.py, "r", c)

        def absent_r(c: frozenset[int], f: Field = f) -> None:
            em.line(f"{f.py} = {default_expr(f)}")

        _branch(em, untagged, ctx, present_r, absent_r)

    def read_tags(c: frozenset[int]) -> None:
        if not tagged:
            em.line("r.skip_tagged_fields()")
            return
        em.line("for _ in range(r.uvarint()):")
        em.indent += 1
        em.line("_tag = r.uvarint()")
        em.line("_size = r.uvarint()")
        first = True
        for f in tagged:
            tc = cond(f.tagged, c)
            if tc == "False":
                continue
            test = f"_tag == {f.tag}" + ("" if tc == "True" else f" and {tc}")
            em.line(("if " if first else "elif ") + test + ":")
            first = False
            em.indent += 1
            em.line("_tr = r.sub(_size)")
            emit_read_value(em, msg, f, f.py, "_tr", c & f.tagged)
            em.indent -= 1
        if first:
            em.line("r.skip(_size)")
        else:
            em.line("else:")
            em.indent += 1
            em.line("r.skip(_size)")
            em.indent -= 1
        em.indent -= 1

    _branch(em, msg.flexible, ctx, read_tags, None)
    args = ", ".join(f"{f.py}={f.py}" for f in st.fields)
    em.line(f"return cls({args})")
    em.indent -= 1
    em.indent -= 1
    em.line()
    em.line()


def _about(text: str) -> str:
    """A spec field's description as one comment line. The spec's "is used to" reads
    "serves to" here: pipeline/ keeps no phrase a history grep (``used to``) matches,
    and generated code is no exception."""
    return " ".join(text.split()).replace(" is used to ", " serves to ")


def _vdesc(vs: frozenset[int]) -> str:
    if not vs:
        return "no versions"
    a, b = min(vs), max(vs)
    if len(vs) == b - a + 1:
        return f"v{a}" if a == b else f"v{a}-{b}"
    return "v" + ",".join(str(v) for v in sorted(vs))


def generate_module(module: str, base: str) -> str:
    req, resp = load_api(base)
    em = Emitter()
    em.line(f'"""{base} API (key {req.api_key}): generated by tools/gen_messages.py; do not edit.')
    em.line()
    if "Apache Software Foundation" in req.license_header:
        em.line(f"Source: tools/kafka-specs/{req.source} and {resp.source} (Apache Kafka,")
        em.line("Apache License 2.0). Regenerate with ``python tools/gen_messages.py``.")
    else:
        em.line(f"Source: tools/kafka-specs/{req.source} and {resp.source} (written for this")
        em.line("project from the Kafka protocol guide). Regenerate with ``python tools/gen_messages.py``.")
    em.line('"""')
    em.line()
    em.line("from __future__ import annotations")
    em.line()
    body = Emitter()
    for msg in (req, resp):
        for st in msg.structs:
            emit_struct(body, msg, st, top=False)
        emit_struct(
            body, msg, msg.root, top=True, response=resp.name if msg is req else None
        )
    text = "\n".join(body.lines)
    if "uuid.UUID" in text:
        em.line("import uuid")
    em.line("from dataclasses import dataclass, field" if "= field(" in text
            else "from dataclasses import dataclass")
    em.line("from typing import ClassVar, Self")
    em.line()
    prims = ["Reader", "Writer"]
    if "ZERO_UUID" in text:
        prims.insert(0, "ZERO_UUID")
    em.line("from pipeline.protocol.base import Request, Response")
    em.line("from pipeline.protocol.errors import UnsupportedVersionError")
    em.line(f"from pipeline.protocol.primitives import {', '.join(prims)}")
    em.line()
    names = [s.name for m in (req, resp) for s in m.structs] + [req.name, resp.name]
    em.line("__all__ = [")
    for n in sorted(names):
        em.line(f'    "{n}",')
    em.line("]")
    em.line()
    em.line()
    out = "\n".join(em.lines) + "\n" + text
    return out.rstrip("\n") + "\n"


def generate_init() -> str:
    lines = [
        '"""Kafka request/response classes, generated by tools/gen_messages.py; do not edit."""',
        "",
        "from __future__ import annotations",
        "",
        "from typing import Any",
        "",
        "from pipeline.protocol.base import Request, Response",
    ]
    imports: list[tuple[str, str, str, int]] = []
    for module, base in APIS:
        req, resp = load_api(base)
        imports.append((module, req.name, resp.name, req.api_key))
    for module, rq, rs, _ in sorted(imports):
        one = f"from pipeline.protocol.messages.{module} import {rq}, {rs}"
        if len(one) <= 100:
            lines.append(one)
        else:
            lines += [f"from pipeline.protocol.messages.{module} import (", f"    {rq},", f"    {rs},", ")"]
    lines.append("")
    lines.append("__all__ = [")
    lines.append('    "REQUESTS",')
    lines.append('    "RESPONSES",')
    for n in sorted(n for _, rq, rs, _ in imports for n in (rq, rs)):
        lines.append(f'    "{n}",')
    lines.append("]")
    lines.append("")
    lines.append("#: API key -> request class")
    lines.append("REQUESTS: dict[int, type[Request[Any]]] = {")
    for _, rq, _, key in sorted(imports, key=lambda t: t[3]):
        lines.append(f"    {key}: {rq},")
    lines.append("}")
    lines.append("")
    lines.append("#: API key -> response class")
    lines.append("RESPONSES: dict[int, type[Response]] = {")
    for _, _, rs, key in sorted(imports, key=lambda t: t[3]):
        lines.append(f"    {key}: {rs},")
    lines.append("}")
    return "\n".join(lines) + "\n"


def generate_all() -> dict[Path, str]:
    files = {OUT_DIR / f"{module}.py": generate_module(module, base) for module, base in APIS}
    files[OUT_DIR / "__init__.py"] = generate_init()
    return files


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="fail if the committed files differ")
    args = ap.parse_args(argv)
    files = generate_all()
    stale = []
    for path, text in files.items():
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current != text:
            stale.append(path)
            if not args.check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
    if args.check and stale:
        for p in stale:
            print(f"stale: {p.relative_to(ROOT)}", file=sys.stderr)
        return 1
    if not args.check:
        print(f"wrote {len(stale)} of {len(files)} files", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
