"""What crosses a Spark task's boundary: its config in, its status row and error out.

:class:`ExportConfig` is pickled to the executors (plain data only, never a
producer or a channel); each task returns one :class:`PartitionStatus` row
(:data:`STATUS_COLUMNS`, as an Arrow batch by :func:`status_batch`) or raises
:class:`ExportTaskError`, whose message is all the driver gets to see.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

__all__ = [
    "DEFAULT_MESSAGE_ID_HEADER",
    "STATUS_COLUMNS",
    "ExportConfig",
    "ExportTaskError",
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
)


def status_schema_ddl() -> str:
    """The status schema as a Spark DDL string (``"partition long, attempt long, ..."``)."""
    return ", ".join(f"`{name}` {kind}" for name, kind in STATUS_COLUMNS)


class ExportTaskError(RuntimeError):
    """A partition could not be exported; the message says which, and why."""


@dataclass(frozen=True, slots=True)
class ExportConfig:
    """Everything a task needs, as plain picklable data (never a producer or channel).

    ``producer_options`` are keyword options for ``open_producer`` (``ProducerConfig``
    fields). ``topic`` overrides any ``topic`` column. ``message_id_header`` (a header
    name, or None) adds ``f"{message_id_prefix}{spark partition}-{row index}"`` to
    every record: stable across retries of a task as long as the partition's content
    and order are deterministic (a file scan, a sorted shuffle), so consumers can
    drop the duplicates a retried task re-sends.
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

    def __post_init__(self) -> None:
        if not self.bootstrap or not isinstance(self.bootstrap, str):
            raise ValueError(f"bootstrap must be 'host:port[,host:port]', not {self.bootstrap!r}")
        if self.chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, not {self.chunk_rows}")
        if self.max_failed_rows < 0:
            raise ValueError(f"max_failed_rows must be >= 0, not {self.max_failed_rows}")


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

    def as_row(self) -> dict[str, Any]:
        return asdict(self)


def status_batch(statuses: Iterable[PartitionStatus]) -> pa.RecordBatch:
    """Status rows as one Arrow batch with exactly the types of :data:`STATUS_COLUMNS`."""
    import pyarrow as pa

    types = {"long": pa.int64(), "double": pa.float64(), "string": pa.string()}
    schema = pa.schema([pa.field(name, types[kind]) for name, kind in STATUS_COLUMNS])
    rows = [s.as_row() for s in statuses]
    return pa.RecordBatch.from_pylist(rows, schema=schema)
