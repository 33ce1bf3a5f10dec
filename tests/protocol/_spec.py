"""Shared test helpers: the generator's spec model and hypothesis strategies built from it."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import uuid
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from hypothesis import strategies as st

from pipeline.protocol.api import CLIENT_VERSIONS, ApiKey
from pipeline.protocol.primitives import ZERO_UUID

ROOT = Path(__file__).resolve().parents[2]


@cache
def gen() -> ModuleType:
    """tools/gen_messages.py, imported as a module."""
    name = "_pipeline_gen_messages"
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / "gen_messages.py")
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


MODULE_FOR_KEY: dict[ApiKey, str] = {
    ApiKey.PRODUCE: "produce",
    ApiKey.FETCH: "fetch",
    ApiKey.LIST_OFFSETS: "list_offsets",
    ApiKey.METADATA: "metadata",
    ApiKey.SASL_HANDSHAKE: "sasl_handshake",
    ApiKey.API_VERSIONS: "api_versions",
    ApiKey.CREATE_TOPICS: "create_topics",
    ApiKey.DELETE_TOPICS: "delete_topics",
    ApiKey.INIT_PRODUCER_ID: "init_producer_id",
    ApiKey.SASL_AUTHENTICATE: "sasl_authenticate",
    ApiKey.DESCRIBE_CONFIGS: "describe_configs",
    ApiKey.ELECT_LEADERS: "elect_leaders",
    ApiKey.INCREMENTAL_ALTER_CONFIGS: "incremental_alter_configs",
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: "alter_partition_reassignments",
    ApiKey.LIST_PARTITION_REASSIGNMENTS: "list_partition_reassignments",
    ApiKey.FIND_COORDINATOR: "find_coordinator",
    ApiKey.ADD_PARTITIONS_TO_TXN: "add_partitions_to_txn",
    ApiKey.ADD_OFFSETS_TO_TXN: "add_offsets_to_txn",
    ApiKey.END_TXN: "end_txn",
    ApiKey.TXN_OFFSET_COMMIT: "txn_offset_commit",
    ApiKey.DESCRIBE_TRANSACTIONS: "describe_transactions",
    ApiKey.LIST_TRANSACTIONS: "list_transactions",
    ApiKey.OFFSET_COMMIT: "offset_commit",
    ApiKey.OFFSET_FETCH: "offset_fetch",
    ApiKey.JOIN_GROUP: "join_group",
    ApiKey.HEARTBEAT: "heartbeat",
    ApiKey.LEAVE_GROUP: "leave_group",
    ApiKey.SYNC_GROUP: "sync_group",
    ApiKey.DESCRIBE_GROUPS: "describe_groups",
    ApiKey.LIST_GROUPS: "list_groups",
    ApiKey.DELETE_GROUPS: "delete_groups",
    ApiKey.OFFSET_DELETE: "offset_delete",
    ApiKey.CONSUMER_GROUP_HEARTBEAT: "consumer_group_heartbeat",
    ApiKey.CONSUMER_GROUP_DESCRIBE: "consumer_group_describe",
}


@cache
def specs(key: ApiKey) -> tuple[Any, Any]:
    g = gen()
    base = dict(g.APIS)[MODULE_FOR_KEY[key]]
    req, resp = g.load_api(base)
    return req, resp


def module(key: ApiKey) -> ModuleType:
    return importlib.import_module(f"pipeline.protocol.messages.{MODULE_FOR_KEY[key]}")


def all_cases() -> list[tuple[ApiKey, str, int]]:
    """(api_key, "request"|"response", version) for every version we speak."""
    out = []
    for key, (lo, hi) in CLIENT_VERSIONS.items():
        for kind in ("request", "response"):
            for v in range(lo, hi + 1):
                out.append((key, kind, v))
    return out


_INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1),
}


def _scalar(elem: str, nullable: bool) -> st.SearchStrategy[Any]:
    s: st.SearchStrategy[Any]
    if elem in _INT_RANGES:
        lo, hi = _INT_RANGES[elem]
        s = st.integers(lo, hi)
    elif elem == "bool":
        s = st.booleans()
    elif elem == "float64":
        s = st.floats(allow_nan=False)
    elif elem == "uuid":
        s = st.one_of(st.just(ZERO_UUID), st.uuids().map(lambda u: uuid.UUID(int=u.int)))
    elif elem == "string":
        s = st.text(max_size=12)
    else:  # bytes / records
        s = st.binary(max_size=24)
    if nullable:
        s = st.none() | s
    return s


def default_of(f: Any, mod: ModuleType) -> Any:
    if f.struct is not None and not f.is_array:
        if gen().default_expr(f) == "None":  # a nullable struct whose default is null
            return None
        return getattr(mod, f.struct.name)()
    v = gen().default_value(f)
    return ZERO_UUID if v == "ZERO_UUID" else v


def struct_strategy(struct: Any, mod: ModuleType, version: int) -> st.SearchStrategy[Any]:
    cls = getattr(mod, struct.name)
    kwargs: dict[str, st.SearchStrategy[Any]] = {}
    for f in struct.fields:
        if version not in f.versions:
            kwargs[f.py] = st.just(default_of(f, mod))
            continue
        nullable = version in f.nullable
        if f.struct is not None:
            inner = struct_strategy(f.struct, mod, version)
            if nullable and not f.is_array:
                inner = st.none() | inner
        else:
            inner = _scalar(f.elem, nullable and not f.is_array)
        if f.is_array:
            arr: st.SearchStrategy[Any] = st.lists(inner, max_size=3).map(tuple)
            if nullable:
                arr = st.none() | arr
            kwargs[f.py] = arr
        else:
            kwargs[f.py] = inner
    return st.builds(cls, **kwargs)


def message_strategy(key: ApiKey, kind: str, version: int) -> st.SearchStrategy[Any]:
    req, resp = specs(key)
    msg = req if kind == "request" else resp
    return struct_strategy(msg.root, module(key), version)
