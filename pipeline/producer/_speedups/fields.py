"""What the C speedups may touch of Python objects and modules: declared once, here.

``_send.c`` and ``_delivery.c`` read and write some fields of Python objects directly,
at the offsets of their ``__slots__`` member descriptors, so the C path and its
pure-Python twin share every piece of state and may interleave call by call. Each
tuple below is the whole of that coupling for one (extension, class) pair:

* the class builds its ``__slots__`` from it (``slots(...)``), so a field C uses is
  always a plain object slot of that name;
* the extension's setup receives it and looks the offsets up *by position*: C's field
  order is the tuple's order (``_shared.h``'s ``member_offsets``), and no field name is
  spelled in C;
* ``tests/producer/test_speedup_fields.py`` fails when a field is renamed on one side
  only, is not a plain slot any more (a property would bypass it), holds a value of
  another type than declared here after both paths ran, or when C spells a name itself.

Module globals the extensions read, or that the switch to the C path replaces, are
declared in ``GLOBALS`` (checked by the same test). The one private trio name used,
``trio._core._run.GLOBAL_RUN_CONTEXT`` (``_outcomes/delivery.py``), sits behind a
tested fallback to ``trio.lowlevel.checkpoint_if_cancelled``.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = [
    "DELIVERY_BURST",
    "DELIVERY_MESSAGE",
    "DELIVERY_OUTCOMES",
    "DELIVERY_RUN",
    "GLOBALS",
    "MESSAGE_INIT",
    "SEND_BURST",
    "SEND_INTAKE",
    "SEND_LEDGER",
    "SEND_MESSAGE",
    "SYNC_HANDLE",
    "Field",
    "Global",
    "names",
    "slots",
]


class Field(NamedTuple):
    """One slot C reads or writes: its name, the Python types it may hold (checked
    by the test on live objects), and the invariant both paths keep."""

    name: str
    types: tuple[str, ...]
    invariant: str


class Global(NamedTuple):
    """A module global C reads at call time, or that the C path replaces."""

    module: str
    name: str
    c_path: str  # what it is on the C path, "<extension>.<name>"; "" when C only reads it
    when: str  # "read": C reads it per call; "load": set when the extension loads;
    #            "switch": set by ``delivery._use`` for the process's await path
    invariant: str


# -- _send.c: send()'s row branch (Intake.send's first branch, in C) -------------------
SEND_INTAKE: tuple[Field, ...] = (
    Field("_until_yield", ("int",),
          "sends left before the next schedule point; both paths count down, only "
          "Python resets it (at 0 the call takes the Python path and checkpoints)"),
    Field("_closing", ("bool",),
          "True while the intake refuses records (a close began, or a transactional "
          "producer has no transaction open): C then leaves every call to Python"),
    Field("_rows", ("RowBurst", "NoneType"),
          "the open columnar burst (already in the intake channel), or None"),
    Field("_wall_clock", ("bool",), "True: CreateTime is the wall clock (no injected clock)"),
    Field("_max_message_bytes", ("int",), "the config's max_message_bytes"),
    Field("_ms", ("int",), "the current CreateTime millisecond, shared by rows within it"),
    Field("_ms_ends", ("float",), "when ``_ms`` ends, in time.time() seconds"),
    Field("_ledger", ("Ledger",), "the producer's ledger (its memory and ids)"),
    Field("_timestamp_ms", ("function", "method", "builtin_function_or_method"),
          "the CreateTime clock in ms (the injected one when ``_wall_clock`` is False)"),
)
SEND_LEDGER: tuple[Field, ...] = (
    Field("buffered_bytes", ("int",),
          "bytes reserved by accepted, unsettled messages; never above buffer_memory "
          "on admission (admit_row's rule, inlined in C)"),
    Field("buffer_memory", ("int",), "the config's buffer_memory"),
    Field("_next_id", ("int",), "the next acceptance id: ids are consecutive, in call order"),
)
SEND_BURST: tuple[Field, ...] = (
    Field("topic", ("str",), "every row of a burst goes to this topic"),
    Field("values", ("list",), "one bytes per row, in call order (an untracked list)"),
    Field("timestamps", ("list",), "one int CreateTime per row (an untracked list)"),
    Field("on_delivery", ("list", "NoneType"),
          "each row's callback or None, once a row had one; None: no row had"),
    Field("size", ("int",), "the burst's reserved bytes (rows' size bounds)"),
    Field("keys", ("list", "NoneType"), "each row's key or None, once a row had one"),
    Field("extras", ("bool",),
          "True once one of the five columns below exists: every later row adds to them"),
    Field("header_keys", ("list", "NoneType"),
          "every row's header keys, flat, exact str (an untracked list), once a row had "
          "headers"),
    Field("header_values", ("list", "NoneType"),
          "every row's header values, flat, bytes or None (an untracked list)"),
    Field("header_ends", ("list", "NoneType"),
          "0, then each row's end in the flat header lists (an untracked list)"),
    Field("partitions", ("list", "NoneType"),
          "each row's pinned partition, int32, -1: none (an untracked list), once a row "
          "pinned one"),
    Field("metadata", ("list", "NoneType"),
          "each row's metadata or None, once a row had some (a tracked list: any object)"),
)

# -- _send.c: send_many's messages as rows (take_messages, accept_messages, settle_messages;
#    twins in _columnar/messages.py) ---------------------------------------------------
SEND_MESSAGE: tuple[Field, ...] = (
    Field("topic", ("str",), "the message's topic (read: a call's rows share the first's)"),
    Field("value", ("bytes", "NoneType"),
          "read; a str is replaced by its UTF-8 bytes (normalize's rule)"),
    Field("key", ("bytes", "NoneType"), "as value"),
    Field("headers", ("tuple", "list", "dict"),
          "read; plain headers are replaced by a tuple of (str, bytes | None) pairs "
          "(normalize's form); empty ones are left as they are"),
    Field("partition", ("int", "NoneType"),
          "read (pinned, or None); written when its row's run settles with a partition"),
    Field("timestamp", ("int",),
          "read; None becomes the call's CreateTime; LogAppendTime written at success"),
    Field("_id", ("int",),
          "the acceptance id (0: not accepted): written when its chunk is accepted, "
          "back to 0 if the chunk never reached the intake"),
    Field("_state", ("int",), "as in DELIVERY_MESSAGE: written once, when its run settles"),
    Field("offset", ("int",), "the run's base offset plus the row's place (-1: not known)"),
    Field("_outcome", ("NoneType", "PartitionOutOfRangeError", "ProducerClosed",
                       "DeliveryTimeoutError", "BrokerResponseError", "Exception"),
          "the run's cause, written when it failed (any exception)"),
    Field("_deadline", ("float",),
          "the delivery deadline of its chunk, written with its id (as accept_all does)"),
)

# -- _delivery.c: awaiting a settled delivery, row metadata and callbacks ----------------
DELIVERY_MESSAGE: tuple[Field, ...] = (
    Field("_state", ("int",), "PENDING, OK or FAILED; written once (never back to PENDING)"),
    Field("topic", ("str",), "the message's topic"),
    Field("partition", ("int", "NoneType"), "its partition once delivered"),
    Field("offset", ("int",), "its offset once delivered (-1: not known)"),
    Field("timestamp", ("int", "NoneType"), "its timestamp once delivered"),
)
#: ProducerMessage.__init__ in C (``install_message_init``): every slot, written once per
#: new message; the first seven in the order of ``__init__``'s arguments (C takes the
#: argument names from here). The twin is ``ProducerMessage.__init__`` itself.
MESSAGE_INIT: tuple[Field, ...] = (
    Field("topic", ("str",), "the argument, as given (send_many checks it)"),
    Field("value", ("bytes", "str", "NoneType"), "the argument, as given"),
    Field("key", ("bytes", "str", "NoneType"), "the argument, as given"),
    Field("headers", ("tuple", "list", "dict"), "the argument, or () for None"),
    Field("partition", ("int", "NoneType"), "the argument, as given"),
    Field("timestamp", ("int", "NoneType"), "the argument, as given"),
    Field("metadata", ("object",), "the argument, never sent"),
    Field("offset", ("int",), "-1: not delivered"),
    Field("_level", ("int",), "0: no retry yet"),
    Field("_state", ("int",), "PENDING"),
    Field("_outcome", ("NoneType",), "None until it fails"),
    Field("_sink", ("NoneType",), "None until an entry point sets who hears of it"),
    Field("_size", ("int",), "0 until accepted"),
    Field("_deadline", ("float",), "0.0 until accepted (or stamped by producer.input)"),
    Field("_id", ("int",), "0: not accepted"),
)
DELIVERY_BURST: tuple[Field, ...] = (
    Field("outcomes", ("RowOutcomes", "NoneType"),
          "where each row ended up; set when the burst is sealed"),
    Field("timestamps", ("list",), "as in SEND_BURST"),
)
DELIVERY_OUTCOMES: tuple[Field, ...] = (
    Field("bounds", ("bytearray",), "sorted, disjoint spans of settled wire positions"),
    Field("runs", ("list",), "the settled runs, one per span, in span order"),
    Field("inverse", ("bytearray", "NoneType"),
          "row -> wire position as int64s (a keyed burst; -1: not mapped yet), or None"),
)
DELIVERY_RUN: tuple[Field, ...] = (
    Field("_state", ("int",), "as in DELIVERY_MESSAGE, for every row of the run at once"),
    Field("topic", ("str",), "the run's topic"),
    Field("partition", ("int", "NoneType"), "the run's partition (None until assigned)"),
    Field("offset", ("int",), "the run's base offset once delivered (-1: not known)"),
    Field("timestamp", ("int",), "LogAppendTime when the topic uses it, else -1"),
)

# -- _send.c: SyncProducer's queue and pump (SyncQueue, Sender.pump) ------------------
SYNC_HANDLE: tuple[Field, ...] = (
    Field("_topic", ("str",), "the queued call's topic"),
    Field("_value", ("bytes", "str", "NoneType"),
          "the queued call's value; None once the pump took the call (C takes only "
          "bytes, str or None: anything else is the Python pump's)"),
    Field("_kwargs", ("dict", "NoneType"),
          "the call's keywords; None for a plain send(topic, value), the only calls C takes"),
    Field("_delivery", ("RowDelivery", "MessageDelivery", "NoneType"),
          "set once by the pump when the send accepted the call; None while queued"),
    Field("_error", ("Exception", "NoneType"),
          "set once by the pump when the send refused the call; None while queued"),
    Field("_sync", ("SyncProducer",), "the producer (set by SyncQueue for the handles it makes)"),
)

GLOBALS: tuple[Global, ...] = (
    Global("pipeline.producer._intake.intake", "_time", "", "read",
           "the wall clock send() stamps rows with (time.time; tests replace it)"),
    Global("pipeline.producer._columnar.burst", "new_row", "_delivery.new_row", "switch",
           "builds a row's RowDelivery; read by _send.c per row"),
    Global("pipeline.producer._columnar.burst", "new_column", "_send.atomic_list", "load",
           "a burst's values / timestamps list: untracked by the GC on the C path"),
    Global("pipeline.producer._sync", "_untracked", "_send.untracked", "load",
           "a queued blocking send (SyncDelivery) leaves the cyclic GC; identity on the "
           "pure-Python path"),
    Global("pipeline.producer._columnar.row_outcomes", "call_back_ok", "_delivery.call_back_ok",
           "switch",
           "calls a settled run's rows' on_delivery callbacks"),
    Global("pipeline.producer._columnar.row_outcomes", "map_rows", "_delivery.map_rows", "switch",
           "fills a keyed burst's row -> wire position map"),
    Global("pipeline.producer._outcomes.delivery", "_schedule_due", "_delivery.schedule_due",
           "switch",
           "the process-wide budget of awaits between full schedule points"),
    Global("pipeline.producer._outcomes.delivery", "_restart_schedule",
           "_delivery.restart_schedule", "switch",
           "restarts that budget after send()'s periodic schedule point"),
    Global("pipeline.producer._outcomes.delivery", "_metadata_of", "_delivery.metadata", "switch",
           "builds a delivered message's RecordMetadata"),
)


def names(fields: tuple[Field, ...]) -> tuple[str, ...]:
    """The fields' names, in C's order: what an extension's setup receives."""
    return tuple(f.name for f in fields)


def slots(*parts: tuple[Field, ...] | tuple[str, ...]) -> tuple[str, ...]:
    """A class's ``__slots__``: the names of the field tuples C uses and of the plain
    Python fields, each once, sorted."""
    out: set[str] = set()
    for part in parts:
        out.update(p.name if isinstance(p, Field) else p for p in part)
    return tuple(sorted(out))
