"""The producer tests open producers on the FakeCluster with the scenario helpers,
so the same end-of-test check applies to them."""

from tests.scenarios.conftest import every_producer_settles_each_message_once

__all__ = ["every_producer_settles_each_message_once"]
