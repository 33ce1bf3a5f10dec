"""Root fixtures: the broker the integration, chaos and spark tests run against.

``kafka_bootstrap`` resolves, once per session and only when a test asks for it:

1. ``$PIPELINE_BOOTSTRAP`` (a running cluster; ``broker_kind == "external"``);
2. an Apache Kafka container via testcontainers when a Docker engine answers
   (``"kafka"``; ``$PIPELINE_TEST_BROKER=tansu`` skips this, ``$PIPELINE_KAFKA_IMAGE`` picks
   the image);
3. the embedded tansu broker (``"tansu"``), one per session.

``broker_kind`` lets tests adjust for tansu's deviations (docs/testing.md), e.g.
a duplicate idempotent batch gets 46 instead of NONE, and bad CRCs are only logged.

Apache Kafka itself (``pipeline.testing.kafka``): ``kafka_cluster`` (3 nodes) and
``kafka_single`` (1 node), started once per session when a test asks for them (see below).

Broker-parametrized tests (tests/integration, tests/cli, a few Spark tests) ask for
``any_broker`` (or override ``kafka_bootstrap``/``new_topic``/``broker_kind``/
``embedded_broker`` with it, as tests/integration/conftest.py does): each runs twice,
``[tansu]`` on the session broker above and ``[kafka]`` on the 1-node Apache Kafka
(marked ``kafka``). On ``[kafka]`` they assert Kafka's real semantics; where tansu
differs, the test says so.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import sys
import uuid
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pipeline.testing.broker import EmbeddedBroker, create_topics, free_port
from pipeline.testing.choose_broker import BrokerEndpoint, BrokerKind, open_test_broker

if TYPE_CHECKING:
    from pipeline.testing.kafka import KafkaCluster

_TESTS_DIR = Path(__file__).parent
# Tests under these directories get the marker automatically (so "-m 'not integration'"
# never starts a broker even if a module forgets its pytestmark).
_DIR_MARKERS = {
    "integration": "integration", "chaos": "chaos", "spark": "spark", "apache_kafka": "kafka"
}


def _on_path(kind: str, c_module: object, name: str, current: str,
             use: Callable[[str], None]) -> Iterator[str]:
    """Switch a C / pure-Python pair to ``kind`` for one test, then back to ``current``;
    the C run is skipped only when the extension is not built or PIPELINE_PURE_PYTHON
    is set."""
    if kind == "c" and c_module is None:
        pytest.skip(f"pipeline.producer.{name} is not built (or PIPELINE_PURE_PYTHON is set)")
    use(kind)
    try:
        yield kind
    finally:
        use(current)


@pytest.fixture(params=["c", "python"])
def await_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the test once per ``await delivery`` path (pipeline/producer/_speedups/_delivery.c, its
    pure-Python twin in _outcomes/delivery.py)."""
    from pipeline.producer._outcomes import delivery as _delivery

    yield from _on_path(request.param, _delivery._c, "_delivery", _delivery.DELIVERY_AWAIT,
                        _delivery._use)


@pytest.fixture(params=["c", "python"])
def send_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the test once per ``producer.send`` path of the producers it opens
    (pipeline/producer/_speedups/_send.c's row branch, or ``Intake.send`` alone)."""
    from pipeline.producer._intake import send_path as _send_path

    yield from _on_path(request.param, _send_path._c, "_send", _send_path.SEND_PATH,
                        _send_path.use)


@pytest.fixture(autouse=True)
def _pipeline_logger_as_found() -> Iterator[None]:
    """Entry points run in-process by tests silence the ``pipeline`` logger for
    the rest of the process (the explorer's ``main`` sets it to CRITICAL, the
    CLI's ``setup_logging`` stops its propagation); restore it after each test,
    so a later test's ``caplog`` sees the library's warnings whatever ran first."""
    log = logging.getLogger("pipeline")
    propagate, handlers, level = log.propagate, list(log.handlers), log.level
    yield
    log.propagate, log.handlers[:] = propagate, handlers
    log.setLevel(level)  # setLevel, not .level: it clears the children's cached checks


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        try:
            rel = Path(str(item.path)).resolve().relative_to(_TESTS_DIR.resolve())
        except ValueError:
            continue
        marker = _DIR_MARKERS.get(rel.parts[0]) if len(rel.parts) > 1 else None
        if marker is not None and item.get_closest_marker(marker) is None:
            item.add_marker(getattr(pytest.mark, marker))
    kafka_items = [item for item in items if item.get_closest_marker("kafka") is not None]
    reason = _kafka_reason() if kafka_items else None
    if reason is not None:
        for item in kafka_items:
            item.add_marker(pytest.mark.skip(reason=reason))


@functools.cache
def _kafka_reason() -> str | None:
    """Why Apache Kafka cannot run here (java/mvn missing), or None. Asked once."""
    from pipeline.testing.kafka.dist import missing_tools_reason

    return missing_tools_reason()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Skips for a missing Kafka all report from here, so ``-ra`` prints the reason once
    ("SKIPPED [30] tests/conftest.py:N: ...") instead of once per test."""
    report = yield
    reason = _kafka_reason() if _kafka_reason.cache_info().currsize else None
    longrepr = report.longrepr
    if (report.skipped and reason is not None and isinstance(longrepr, tuple)
            and longrepr[2].endswith(reason)):
        # The same place for every such test, whether a mark or a fixture skipped it (pytest
        # drops the line of mark skips: without their "skip" keyword it keeps it), so pytest
        # folds them into one summary line.
        report.longrepr = (str(Path(__file__)), _FOLD_LINE, longrepr[2])
        report.keywords = {k: v for k, v in report.keywords.items() if k != "skip"}
    return report


_FOLD_LINE = sys._getframe().f_lineno


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


# --------------------------------------------------------------------------- Apache Kafka
#
# Session clusters, started only when a test asks for them (the `kafka` marker goes with
# them: tests/apache_kafka/ is marked by directory). Where java (or, before the jars are cached,
# mvn) is missing, every such test skips with the one reason `make test` printed first.
# The function-scoped fixtures restart any node an earlier test left down, so each test
# starts from a whole cluster.


@pytest.fixture(scope="session")
def kafka_unavailable() -> str | None:
    """Why Apache Kafka cannot run here, or None."""
    return _kafka_reason()


def _kafka_session(reason: str | None, **kwargs: Any) -> Iterator[KafkaCluster]:
    if reason is not None:
        pytest.skip(reason)
    from pipeline.testing.kafka import KafkaCluster

    with KafkaCluster(**kwargs) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def kafka_cluster_session(kafka_unavailable: str | None) -> Iterator[KafkaCluster]:
    """A 3-node cluster for the whole session. Each node also has a PROXIED listener
    advertising a free port, where a test may run a FaultProxy
    (``cluster.proxied_bootstrap``, ``cluster.proxy_upstream(n)``)."""
    yield from _kafka_session(
        kafka_unavailable, nodes=3, advertised_ports={n: free_port() for n in (1, 2, 3)}
    )


@pytest.fixture(scope="session")
def kafka_single_session(kafka_unavailable: str | None) -> Iterator[KafkaCluster]:
    """A 1-node cluster for the whole session."""
    yield from _kafka_session(kafka_unavailable, nodes=1)


@pytest.fixture(scope="session")
def kafka_txn_v1_session(kafka_unavailable: str | None) -> Iterator[KafkaCluster]:
    """A 1-node cluster whose storage was formatted with ``transaction.version`` 1: Kafka 4.x
    on the transactions v1 protocol (explicit AddPartitionsToTxn, no epoch bump per
    transaction), as an older cluster or one not yet upgraded serves it."""
    yield from _kafka_session(kafka_unavailable, nodes=1, features={"transaction.version": 1})


#: Users of the secured session clusters (PLAIN users and SCRAM credentials).
SECURE_USERS = {"alice": "alice-pw-4242", "bob": "bob-pw-4343", "carol": "carol-pw-4444"}
#: KIP-368 session lifetimes (ms) of the SASL_SSL cluster, per mechanism: short, so a
#: paced send of a few seconds re-authenticates several times.
REAUTH_MS = {"scram-sha-512": 3000, "oauthbearer": 4000}


@pytest.fixture(scope="session")
def kafka_sasl_ssl(kafka_unavailable: str | None) -> Iterator[KafkaCluster]:
    """1 node whose CLIENT listener is SASL_SSL with PLAIN, SCRAM-SHA-256/512 and
    OAUTHBEARER (unsecured JWS validator); SCRAM-SHA-512 and OAUTHBEARER sessions must
    re-authenticate (REAUTH_MS)."""
    yield from _kafka_session(
        kafka_unavailable, nodes=1, security_protocol="SASL_SSL", scram_users=SECURE_USERS,
        broker_config={f"listener.name.client.{m}.connections.max.reauth.ms": str(ms)
                       for m, ms in REAUTH_MS.items()},
    )


@pytest.fixture(scope="session")
def kafka_sasl_plaintext(kafka_unavailable: str | None) -> Iterator[KafkaCluster]:
    """1 node, SASL_PLAINTEXT, all four mechanisms (the default)."""
    yield from _kafka_session(
        kafka_unavailable, nodes=1, security_protocol="SASL_PLAINTEXT", scram_users=SECURE_USERS,
    )


@pytest.fixture(scope="session")
def kafka_mtls(kafka_unavailable: str | None) -> Iterator[KafkaCluster]:
    """1 node, SSL with ``ssl.client.auth=required`` (mTLS)."""
    yield from _kafka_session(kafka_unavailable, nodes=1, security_protocol="SSL",
                              ssl_client_auth="required")


@pytest.fixture
def kafka_cluster(kafka_cluster_session: KafkaCluster) -> KafkaCluster:
    """The session's 3-node cluster, every node running."""
    kafka_cluster_session.start_all()
    return kafka_cluster_session


@pytest.fixture
def kafka_single(kafka_single_session: KafkaCluster) -> KafkaCluster:
    """The session's 1-node cluster, running."""
    kafka_single_session.start_all()
    return kafka_single_session


@pytest.fixture
def kafka_txn_v1(kafka_txn_v1_session: KafkaCluster) -> KafkaCluster:
    """The session's 1-node ``transaction.version`` 1 cluster, running."""
    kafka_txn_v1_session.start_all()
    return kafka_txn_v1_session


@pytest.fixture
def kafka_topic(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """``kafka_topic(prefix) -> name``: a topic name unique to this test (not created)."""

    def _name(prefix: str = "") -> str:
        base = _UNSAFE.sub("-", prefix or request.node.name).strip("-._")[:80] or "topic"
        return f"{base}-{uuid.uuid4().hex[:8]}"

    return _name


# --------------------------------------------------------------------------- tansu and Kafka
#
# ``any_broker``: the same test on the session broker ("tansu": tansu unless
# PIPELINE_BOOTSTRAP or a Docker engine chose another) and on Apache Kafka ("kafka", the
# session's 1-node KafkaCluster, marked ``kafka`` so it skips with the one reason where
# java/mvn are missing and ``-m "not kafka"`` leaves it out).

BROKERS = [pytest.param("tansu", id="tansu"),
           pytest.param("kafka", id="kafka", marks=pytest.mark.kafka)]


@dataclass(frozen=True)
class AnyBroker:
    """The broker a parametrized test runs on."""

    bootstrap: str
    kind: BrokerKind
    embedded: EmbeddedBroker | None  # tansu's process (its log), else None
    kafka: KafkaCluster | None  # the KafkaCluster on [kafka], else None

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create ``name``; on Kafka, return only once every broker knows its leaders
        (Kafka propagates new topics' metadata asynchronously)."""
        if self.kafka is not None:
            self.kafka.create_topic(name, partitions, replication_factor=1)
        else:
            create_topics(self.bootstrap, {name: partitions})


@pytest.fixture(params=BROKERS)
def any_broker(request: pytest.FixtureRequest) -> AnyBroker:
    if request.param == "kafka":
        cluster: KafkaCluster = request.getfixturevalue("kafka_single")
        return AnyBroker(cluster.bootstrap, "kafka", None, cluster)
    endpoint: BrokerEndpoint = request.getfixturevalue("broker_endpoint")
    return AnyBroker(endpoint.bootstrap, endpoint.kind, endpoint.embedded, None)


@pytest.fixture
def any_new_topic(request: pytest.FixtureRequest, any_broker: AnyBroker) -> NewTopic:
    """``new_topic`` on ``any_broker``."""

    def _create(partitions: int = 1, prefix: str | None = None) -> str:
        base = _UNSAFE.sub("-", prefix or request.node.name).strip("-._")[:80] or "topic"
        name = f"{base}-{uuid.uuid4().hex[:8]}"
        any_broker.create_topic(name, partitions)
        return name

    return _create
