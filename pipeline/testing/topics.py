"""Topics for tests, the demo and benchmarks: CreateTopics through the project's
admin client (:class:`pipeline.cluster.admin.Admin`), blocking or on the caller's
trio loop, against any broker (tansu, Apache Kafka, a proxy in front of one).

Re-exported by :mod:`pipeline.testing.broker` (and :mod:`pipeline.testing`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = [
    "TOPIC_ALREADY_EXISTS",
    "TopicCreationError",
    "create_topic",
    "create_topic_sync",
    "create_topics",
    "parse_bootstrap",
]

#: Kafka error code returned by CreateTopics for a topic that exists already.
TOPIC_ALREADY_EXISTS = 36

class TopicCreationError(RuntimeError):
    """CreateTopics returned an error other than NONE / TOPIC_ALREADY_EXISTS."""

    def __init__(self, message: str, errors: Mapping[str, tuple[int, str | None]]) -> None:
        super().__init__(message)
        self.errors = dict(errors)


def parse_bootstrap(bootstrap: str | Sequence[str]) -> list[tuple[str, int]]:
    """``"h1:p1,h2:p2"`` (or a sequence of ``"h:p"``) -> ``[(h1, p1), (h2, p2)]``."""
    items = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
    out: list[tuple[str, int]] = []
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        for prefix in ("tcp://", "PLAINTEXT://"):
            if item.startswith(prefix):
                item = item[len(prefix) :]
        host, sep, port = item.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"bad bootstrap address {raw!r} (expected host:port)")
        out.append((host.strip("[]") or "127.0.0.1", int(port)))
    if not out:
        raise ValueError("empty bootstrap address list")
    return out


async def _create_topics_async(
    bootstrap: str | Sequence[str],
    topics: Mapping[str, int],
    timeout: float,  # noqa: ASYNC109 - bounds the admin calls
    replication_factor: int,
    configs: Mapping[str, str] | None,
    client_id: str,
) -> dict[str, int]:
    from pipeline.cluster.admin import Admin
    from pipeline.cluster.admin_types import AdminError, NewTopic
    from pipeline.cluster.errors import KafkaError
    from pipeline.protocol.errors import ErrorCode

    addresses = [f"{h}:{p}" for h, p in parse_bootstrap(bootstrap)]
    new = [NewTopic(name, partitions, replication_factor, dict(configs or {}))
           for name, partitions in topics.items()]
    try:
        # direct: the broker may advertise a proxy's port that is not listening (yet)
        async with Admin.open(
            addresses, timeout=timeout, client_id=client_id, direct=True
        ) as admin:
            results = await admin.create_topics(new)
    except AdminError as exc:
        if exc.code == ErrorCode.REQUEST_TIMED_OUT:
            raise ConnectionError(f"no broker in {addresses} answered: {exc}") from exc
        raise
    except KafkaError as exc:  # connection-level: unreachable, closed, timed out
        raise ConnectionError(f"no broker in {addresses} answered: {exc}") from exc
    codes = {name: 0 if e is None else int(e.code) for name, e in results.items()}
    failures = {
        name: (int(e.code), e.detail)
        for name, e in results.items()
        if e is not None and e.code != ErrorCode.TOPIC_ALREADY_EXISTS
    }
    if failures:
        detail = ", ".join(
            f"{name}: error {code}{f' ({msg})' if msg else ''}"
            for name, (code, msg) in sorted(failures.items())
        )
        raise TopicCreationError(f"CreateTopics failed: {detail}", failures)
    return codes


def create_topics(
    bootstrap: str | Sequence[str],
    topics: Mapping[str, int],
    timeout: float = 10.0,
    *,
    replication_factor: int = 1,
    configs: Mapping[str, str] | None = None,
    client_id: str = "pipeline-testing",
) -> dict[str, int]:
    """Create ``{name: partitions}`` with the project's admin client
    (:class:`pipeline.cluster.admin.Admin`).

    Blocking (it runs the admin client on a trio loop of its own, so it also works from
    inside a trio test). Returns ``{name: error_code}`` where the code is 0 (created) or 36
    (TOPIC_ALREADY_EXISTS, treated as success). Any other error raises
    :class:`TopicCreationError`; no answer within ``timeout`` raises :class:`ConnectionError`.
    """
    if not topics:
        return {}
    from pipeline.testing._threads import run_trio

    return run_trio(
        _create_topics_async, bootstrap, topics, timeout, replication_factor, configs, client_id
    )


def create_topic_sync(
    bootstrap: str | Sequence[str], name: str, partitions: int = 1, *, timeout: float = 10.0
) -> int:
    """Create one topic (blocking); returns 0 or TOPIC_ALREADY_EXISTS."""
    return create_topics(bootstrap, {name: partitions}, timeout=timeout)[name]


async def create_topic(
    bootstrap: str | Sequence[str],
    name: str,
    partitions: int = 1,
    *,
    timeout: float = 10.0,  # noqa: ASYNC109 - bounds the admin call, as in create_topics
) -> int:
    """Async :func:`create_topic_sync`, on the caller's trio loop."""
    codes = await _create_topics_async(
        bootstrap, {name: partitions}, timeout, 1, None, "pipeline-testing"
    )
    return codes[name]
