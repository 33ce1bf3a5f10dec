"""What crosses a Spark task's boundary: its config in, its status row and error out.

:class:`ExportConfig` is pickled to the executors (plain data only, never a
producer or a channel); each task returns one :class:`PartitionStatus` row
(:data:`STATUS_COLUMNS`, as an Arrow batch by :func:`status_batch`) or raises
:class:`ExportTaskError`, whose message is all the driver gets to see.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline.cluster.security import SECRET_OPTIONS

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

__all__ = [
    "DEFAULT_MESSAGE_ID_HEADER",
    "STATUS_COLUMNS",
    "ExactlyOnce",
    "ExportConfig",
    "ExportTaskError",
    "Masked",
    "PartitionStatus",
    "status_batch",
    "status_schema_ddl",
]

#: Header name used by ``add_message_id_header=True``.
DEFAULT_MESSAGE_ID_HEADER = "pipeline-message-id"

#: (name, Spark SQL type) of the status row each task returns. ``long``/``double``
#: only: an int64 value in an ``int`` column fails inside Spark with a cryptic error.
STATUS_COLUMNS: tuple[tuple[str, str], ...] = (
    ("partition", "long"),  # Spark partition id
    ("attempt", "long"),  # TaskContext.attemptNumber(): > 0 means a retry (possible duplicates)
    ("rows", "long"),  # rows read from the partition
    ("delivered", "long"),  # rows acknowledged by the broker
    ("failed", "long"),  # rows that got an error (only with max_failed_rows > 0)
    ("bytes", "long"),  # key + value bytes handed to the producer
    ("first_error", "string"),  # None when failed == 0
    ("seconds", "double"),  # task wall time, including connecting
    ("started_at", "double"),  # epoch seconds
    ("pid", "long"),  # executor Python worker process
    # "delivered" (at-least-once); exactly-once: "committed" (this job committed the
    # partition) or "skipped" (an earlier run of the export id had committed it all)
    ("outcome", "string"),
    ("committed_rows", "long"),  # exactly-once: rows of the partition committed in all
    ("resumed_rows", "long"),  # exactly-once: rows earlier attempts had committed (not re-sent)
    ("transactions", "long"),  # exactly-once: transactions this attempt committed
    ("writer_attempt", "long"),  # exactly-once: the attempt that committed the last rows (-1: ?)
)


def status_schema_ddl() -> str:
    """The status schema as a Spark DDL string (``"partition long, attempt long, ..."``)."""
    return ", ".join(f"`{name}` {kind}" for name, kind in STATUS_COLUMNS)


class ExportTaskError(RuntimeError):
    """A partition could not be exported; the message says which, and why."""


class Masked:
    """A secret (a SASL or key password) on its way to the executors.

    Shown as ``'***'`` (so the ExportConfig's repr, a log line or a traceback of a
    task never holds it) and kept, also when pickled, only as the secret XORed with a
    random pad of its length: the pickled closure Spark ships, stores and may log
    does not contain it as text. This is masking, not encryption: whoever has the
    pickled bytes and this code can recover the secret (the executors must).
    """

    __slots__ = ("_data", "_pad")

    def __init__(self, secret: str) -> None:
        raw = secret.encode()
        self._pad = secrets.token_bytes(len(raw))
        self._data = bytes(a ^ b for a, b in zip(raw, self._pad, strict=True))

    def reveal(self) -> str:
        return bytes(a ^ b for a, b in zip(self._data, self._pad, strict=True)).decode()

    def __getstate__(self) -> tuple[bytes, bytes]:
        return self._data, self._pad

    def __setstate__(self, state: tuple[bytes, bytes]) -> None:
        self._data, self._pad = state

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Masked) and other.reveal() == self.reveal()

    def __hash__(self) -> int:
        return hash(self.reveal())

    def __repr__(self) -> str:
        return "'***'"


@dataclass(frozen=True, slots=True)
class ExportConfig:
    """Everything a task needs, as plain picklable data (never a producer or channel).

    ``producer_options`` are keyword options for ``open_producer`` (``ProducerConfig``
    fields). ``topic`` overrides any ``topic`` column. ``message_id_header`` (a header
    name, or None) adds ``f"{message_id_prefix}{spark partition}-{row index}"`` to
    every record: stable across retries of a task as long as the partition's content
    and order are deterministic (a file scan, a sorted shuffle), so consumers can
    drop the duplicates a retried task re-sends.

    Secret options (``sasl_password``, ``ssl_password``) are held :class:`Masked`:
    the task opens its producer with :meth:`open_options`.
    """

    bootstrap: str
    topic: str | None = None
    producer_options: dict[str, Any] = field(default_factory=dict)
    chunk_rows: int = 10_000
    max_failed_rows: int = 0
    message_id_header: str | None = None
    message_id_prefix: str = ""
    #: test hook: on attempt 0, deliver exactly this many rows, then fail the task
    fail_first_attempt_after_rows: int | None = None
    #: exactly-once mode (None: at-least-once)
    exactly_once: ExactlyOnce | None = None

    def __post_init__(self) -> None:
        if not self.bootstrap or not isinstance(self.bootstrap, str):
            raise ValueError(f"bootstrap must be 'host:port[,host:port]', not {self.bootstrap!r}")
        if self.chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, not {self.chunk_rows}")
        if self.max_failed_rows < 0:
            raise ValueError(f"max_failed_rows must be >= 0, not {self.max_failed_rows}")
        masked = {
            k: Masked(v) if k in SECRET_OPTIONS and isinstance(v, str) else v
            for k, v in self.producer_options.items()
        }
        object.__setattr__(self, "producer_options", masked)

    def open_options(self) -> dict[str, Any]:
        """``producer_options`` with the secrets revealed, for ``open_producer``."""
        return {
            k: v.reveal() if isinstance(v, Masked) else v
            for k, v in self.producer_options.items()
        }


@dataclass(frozen=True, slots=True)
class ExactlyOnce:
    """The exactly-once part of a task's config (:mod:`pipeline.spark.exactly_once`).

    Transactional ids are ``f"{transactional_id_prefix}{export_id}.{partition}"``: one
    per Spark partition, reused by every attempt and rerun, so each attempt fences the
    earlier ones. ``markers`` holds what the driver read of the ledger before the job
    (``{partition: Marker JSON}``); the tasks read the rest of ledger partition
    ``ledger_partition`` from ``ledger_start``.
    """

    export_id: str
    run_id: str  # this export_dataframe call (tells "committed by this job" from "skipped")
    ledger_topic: str
    ledger_partition: int
    ledger_start: int
    markers: dict[int, str] = field(default_factory=dict)
    commit_interval: float = 20.0  # seconds a transaction may stay open before it commits
    commit_rows: int | None = None  # rows per transaction (None: by time only)
    transactional_id_prefix: str = "pipeline-export-"
    #: a job of this export finished (the ledger's done record): every partition is
    #: skipped, unread, or with ``verify_done`` after checking that it still holds
    #: exactly the rows committed (``verify_skipped``)
    done: bool = False
    verify_done: bool = False

    def __post_init__(self) -> None:
        if self.commit_interval <= 0:
            raise ValueError(f"commit_interval must be > 0 seconds, not {self.commit_interval}")
        if self.commit_rows is not None and self.commit_rows < 1:
            raise ValueError(f"commit_rows must be >= 1 or None, not {self.commit_rows}")

    def transactional_id(self, partition: int) -> str:
        return f"{self.transactional_id_prefix}{self.export_id}.{partition}"


@dataclass(slots=True)
class PartitionStatus:
    """What one task did. ``asdict`` matches :data:`STATUS_COLUMNS`."""

    partition: int
    attempt: int = 0
    rows: int = 0
    delivered: int = 0
    failed: int = 0
    bytes: int = 0
    first_error: str | None = None
    seconds: float = 0.0
    started_at: float = 0.0
    pid: int = 0
    outcome: str = "delivered"
    committed_rows: int = 0
    resumed_rows: int = 0
    transactions: int = 0
    writer_attempt: int = -1

    def as_row(self) -> dict[str, Any]:
        return asdict(self)


def status_batch(statuses: Iterable[PartitionStatus]) -> pa.RecordBatch:
    """Status rows as one Arrow batch with exactly the types of :data:`STATUS_COLUMNS`."""
    import pyarrow as pa

    types = {"long": pa.int64(), "double": pa.float64(), "string": pa.string()}
    schema = pa.schema([pa.field(name, types[kind]) for name, kind in STATUS_COLUMNS])
    rows = [s.as_row() for s in statuses]
    return pa.RecordBatch.from_pylist(rows, schema=schema)
