"""Root fixtures: the broker the integration, chaos and spark tests run against.

``kafka_bootstrap`` resolves, once per session and only when a test asks for it:

1. ``$PIPELINE_BOOTSTRAP`` (a running cluster; ``broker_kind == "external"``);
2. an Apache Kafka container via testcontainers when a Docker engine answers
   (``"kafka"``; ``$PIPELINE_TEST_BROKER=tansu`` skips this, ``$PIPELINE_KAFKA_IMAGE`` picks
   the image);
3. the embedded tansu broker (``"tansu"``), one per session.

``broker_kind`` lets tests adjust for tansu's deviations (docs: broker-tansu.md), e.g.
a duplicate idempotent batch gets 46 instead of NONE, and bad CRCs are only logged.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pipeline.testing.broker import (
    BrokerEndpoint,
    BrokerKind,
    EmbeddedBroker,
    create_topics,
    open_test_broker,
)

_TESTS_DIR = Path(__file__).parent
# Tests under these directories get the marker automatically (so "-m 'not integration'"
# never starts a broker even if a module forgets its pytestmark).
_DIR_MARKERS = {"integration": "integration", "chaos": "chaos", "spark": "spark"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        try:
            rel = Path(str(item.path)).resolve().relative_to(_TESTS_DIR.resolve())
        except ValueError:
            continue
        marker = _DIR_MARKERS.get(rel.parts[0]) if len(rel.parts) > 1 else None
        if marker is not None and item.get_closest_marker(marker) is None:
            item.add_marker(getattr(pytest.mark, marker))


@pytest.fixture(scope="session")
def broker_endpoint() -> Iterator[BrokerEndpoint]:
    """The resolved broker (bootstrap, kind, and the EmbeddedBroker when it is tansu)."""
    with contextlib.ExitStack() as stack:
        yield open_test_broker(stack)


@pytest.fixture(scope="session")
def kafka_bootstrap(broker_endpoint: BrokerEndpoint) -> str:
    """``"host:port[,host:port]"`` of the session's broker."""
    return broker_endpoint.bootstrap


@pytest.fixture(scope="session")
def broker_kind(broker_endpoint: BrokerEndpoint) -> BrokerKind:
    """``"external"`` | ``"kafka"`` | ``"tansu"``."""
    return broker_endpoint.kind


@pytest.fixture(scope="session")
def embedded_broker(broker_endpoint: BrokerEndpoint) -> EmbeddedBroker | None:
    """The session's EmbeddedBroker when the broker is tansu (its log), else None."""
    return broker_endpoint.embedded


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")

NewTopic = Callable[..., str]


@pytest.fixture
def new_topic(request: pytest.FixtureRequest, kafka_bootstrap: str) -> NewTopic:
    """Factory: ``new_topic(partitions=1, prefix=None) -> name`` creates a uniquely named
    topic (via our CreateTopics codec) on the session broker."""

    def _create(partitions: int = 1, prefix: str | None = None) -> str:
        base = _UNSAFE.sub("-", prefix or request.node.name).strip("-._")[:80] or "topic"
        name = f"{base}-{uuid.uuid4().hex[:8]}"
        create_topics(kafka_bootstrap, {name: partitions})
        return name

    return _create
