"""CLI tests that use the session broker run on ``[tansu]`` and ``[kafka]`` (Apache Kafka,
marked ``kafka``): ``kafka_bootstrap`` and ``new_topic`` come from ``any_broker``
(tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


@pytest.fixture
def kafka_bootstrap(any_broker: Any) -> str:
    bootstrap: str = any_broker.bootstrap
    return bootstrap


@pytest.fixture
def new_topic(any_new_topic: Callable[..., str]) -> Callable[..., str]:
    return any_new_topic
