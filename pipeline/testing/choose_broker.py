"""Which broker a test session uses (the ``kafka_bootstrap`` fixture):
``$PIPELINE_BOOTSTRAP``, else an Apache Kafka container when a Docker engine
answers, else the embedded tansu broker (:class:`~pipeline.testing.broker.EmbeddedBroker`).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pipeline.testing.broker import EmbeddedBroker
from pipeline.testing.topics import parse_bootstrap

__all__ = [
    "BOOTSTRAP_ENV",
    "BROKER_ENV",
    "BrokerEndpoint",
    "BrokerKind",
    "broker_for_tests",
    "docker_engine_available",
    "open_test_broker",
]

log = logging.getLogger(__name__)

BrokerKind = Literal["external", "kafka", "tansu"]

#: Environment variables read by :func:`open_test_broker`.
BOOTSTRAP_ENV = "PIPELINE_BOOTSTRAP"  # use this running cluster
BROKER_ENV = "PIPELINE_TEST_BROKER"  # "auto" (default) | "kafka" | "tansu"
KAFKA_IMAGE_ENV = "PIPELINE_KAFKA_IMAGE"
DEFAULT_KAFKA_IMAGE = "confluentinc/cp-kafka:7.6.0"


@dataclass
class BrokerEndpoint:
    """What the ``kafka_bootstrap`` fixture resolved to."""

    bootstrap: str
    kind: BrokerKind
    embedded: EmbeddedBroker | None = None
    notes: list[str] = field(default_factory=list)


def docker_engine_available(timeout: float = 2.0) -> bool:
    """True if a Docker engine answers a ping within ``timeout`` (a docker CLI alone is not
    enough). Never raises."""
    try:
        docker = importlib.import_module("docker")
    except ImportError:
        return False
    client: Any = None
    try:
        client = docker.from_env(timeout=timeout)
        return bool(client.ping())
    except Exception:
        return False
    finally:
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()


def _start_kafka_container(stack: contextlib.ExitStack, image: str) -> str:
    try:
        kafka_mod = importlib.import_module("testcontainers.community.kafka")
    except ImportError:
        kafka_mod = importlib.import_module("testcontainers.kafka")
    container: Any = kafka_mod.KafkaContainer(image=image)
    with contextlib.suppress(Exception):
        container = container.with_kraft()
    container.start()
    stack.callback(container.stop)
    return str(container.get_bootstrap_server())


def open_test_broker(
    stack: contextlib.ExitStack,
    env: Mapping[str, str] | None = None,
    *,
    docker_check: Callable[[], bool] = docker_engine_available,
    start_kafka: Callable[[contextlib.ExitStack, str], str] = _start_kafka_container,
    broker_factory: Callable[[], EmbeddedBroker] = EmbeddedBroker,
) -> BrokerEndpoint:
    """Resolve the broker for a test session; cleanup is registered on ``stack``.

    1. ``$PIPELINE_BOOTSTRAP`` set -> that cluster (``kind="external"``);
    2. a Docker engine answers (and ``$PIPELINE_TEST_BROKER`` is not ``tansu``) -> an Apache
       Kafka container via testcontainers (``kind="kafka"``, image ``$PIPELINE_KAFKA_IMAGE``);
       if the container cannot start, fall through;
    3. otherwise the embedded tansu broker (``kind="tansu"``).
    """
    env = os.environ if env is None else env
    notes: list[str] = []
    external = env.get(BOOTSTRAP_ENV, "").strip()
    if external:
        parse_bootstrap(external)  # validate early, with a clear message
        return BrokerEndpoint(external, "external", None, [f"{BOOTSTRAP_ENV}={external}"])
    choice = env.get(BROKER_ENV, "auto").strip().lower() or "auto"
    if choice not in ("auto", "kafka", "tansu"):
        raise ValueError(f"{BROKER_ENV} must be auto, kafka or tansu, not {choice!r}")
    if choice in ("auto", "kafka"):
        if docker_check():
            image = env.get(KAFKA_IMAGE_ENV, DEFAULT_KAFKA_IMAGE)
            try:
                bootstrap = start_kafka(stack, image)
            except Exception as exc:
                if choice == "kafka":
                    raise
                notes.append(f"Kafka container ({image}) failed to start: {exc!r}")
                log.warning("Kafka container failed to start, using tansu: %r", exc)
            else:
                return BrokerEndpoint(bootstrap, "kafka", None, [f"testcontainers {image}"])
        else:
            if choice == "kafka":
                raise RuntimeError(f"{BROKER_ENV}=kafka but no Docker engine answers")
            notes.append("no Docker engine answers; using the embedded tansu broker")
    broker = broker_factory()
    broker.start()
    stack.callback(broker.stop)
    return BrokerEndpoint(broker.bootstrap, "tansu", broker, notes)


@contextlib.contextmanager
def broker_for_tests(env: Mapping[str, str] | None = None) -> Iterator[BrokerEndpoint]:
    """Context-manager form of :func:`open_test_broker`."""
    with contextlib.ExitStack() as stack:
        yield open_test_broker(stack, env)
