"""The admin client on the fake cluster (virtual time): topics, retries, deadlines, errors.

The fake serves Metadata, CreateTopics and DeleteTopics; the rest of the admin APIs (configs,
reassignments, elections) are proven against Apache Kafka in tests/apache_kafka/test_admin_kafka.py.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from pipeline.cluster.admin import Admin
from pipeline.cluster.admin_types import (
    AdminError,
    NewTopic,
    TopicPartition,
    raise_errors,
)
from pipeline.cluster.config import ClusterConfig
from pipeline.cluster.errors import BootstrapError, ConfigError, UnsupportedApiError
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages import list_partition_reassignments as lpr
from pipeline.testing.fake.cluster import SUPPORTED_VERSIONS
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import MidpointRandom


@pytest.fixture
async def fake(nursery: trio.Nursery) -> FakeCluster:
    cluster = FakeCluster(brokers=3, seed=7, auto_create_topics=False)
    cluster.create_topic("existing", 3, leaders=[0, 1, 2])
    await nursery.start(cluster.run)
    return cluster


def open_admin(fake: FakeCluster, **kwargs: object) -> Admin:
    return Admin.open(fake.bootstrap, connector=fake.connector, rng=MidpointRandom(),
                      **kwargs)  # type: ignore[arg-type, return-value]


async def test_create_describe_delete(fake: FakeCluster,
                                      autojump_clock: trio.testing.MockClock) -> None:
    async with open_admin(fake) as admin:
        results = await admin.create_topics([
            NewTopic("a", 6, 3, {"max.message.bytes": "100000"}),
            NewTopic("existing", 1, 1),
            NewTopic("b", assignments={0: [2, 0], 1: [1, 2]}),
        ])
        assert results["a"] is None
        assert results["b"] is None
        error = results["existing"]
        assert isinstance(error, AdminError)
        assert error.code == ErrorCode.TOPIC_ALREADY_EXISTS
        assert error.resource == "existing"
        assert fake.state.topics["a"].configs["max.message.bytes"] == "100000"

        described = await admin.describe_topics(["a", "b", "missing"])
        a = described["a"]
        assert a.error == ErrorCode.NONE
        assert [p.partition for p in a.partitions] == list(range(6))
        assert all(len(p.replicas) == 3 and set(p.isr) == set(p.replicas) for p in a.partitions)
        assert a.fully_replicated
        assert [p.replicas for p in described["b"].partitions] == [(2, 0), (1, 2)]
        assert [p.leader for p in described["b"].partitions] == [2, 1]
        assert described["missing"].error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert not described["missing"].fully_replicated

        everything = await admin.describe_topics()
        assert {"a", "b", "existing"} <= set(everything)

        cluster = await admin.describe_cluster()
        assert sorted(cluster.brokers) == [0, 1, 2]

        deleted = await admin.delete_topics(["a", "missing"])
        assert deleted["a"] is None
        gone = deleted["missing"]
        assert gone is not None and gone.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert "a" not in fake.state.topics


async def test_create_topic_exist_ok(fake: FakeCluster,
                                     autojump_clock: trio.testing.MockClock) -> None:
    async with open_admin(fake) as admin:
        assert await admin.create_topic("new", 2, 1) is True
        assert await admin.create_topic("new", 2, 1, exist_ok=True) is False
        with pytest.raises(AdminError) as info:
            await admin.create_topic("new", 2, 1)
        assert info.value.code == ErrorCode.TOPIC_ALREADY_EXISTS
        assert "new: TOPIC_ALREADY_EXISTS" in str(info.value)


async def test_validate_only_creates_nothing(fake: FakeCluster,
                                            autojump_clock: trio.testing.MockClock) -> None:
    async with open_admin(fake) as admin:
        assert await admin.create_topics([NewTopic("dry", 2, 1)], validate_only=True) == {
            "dry": None
        }
    assert "dry" not in fake.state.topics


async def test_lost_connection_is_retried(fake: FakeCluster,
                                          autojump_clock: trio.testing.MockClock) -> None:
    fake.drop_next_request(int(ApiKey.CREATE_TOPICS))
    async with open_admin(fake) as admin:
        assert await admin.create_topics([NewTopic("retried", 1, 1)]) == {"retried": None}
    assert "retried" in fake.state.topics


async def test_lost_response_retry_reports_what_the_first_attempt_did(
    fake: FakeCluster, autojump_clock: trio.testing.MockClock
) -> None:
    # Applied, ack lost: the retry meets the topic the first attempt created (as in Kafka's
    # own clients); the module doc says so.
    fake.drop_response_after_apply(int(ApiKey.CREATE_TOPICS))
    async with open_admin(fake) as admin:
        error = (await admin.create_topics([NewTopic("twice", 1, 1)]))["twice"]
    assert error is not None and error.code == ErrorCode.TOPIC_ALREADY_EXISTS
    assert "twice" in fake.state.topics


async def test_a_call_gives_up_at_its_deadline(fake: FakeCluster,
                                               autojump_clock: trio.testing.MockClock) -> None:
    async with open_admin(fake, timeout=5.0) as admin:
        fake.delay_responses(60.0, api_key=int(ApiKey.CREATE_TOPICS))
        started = trio.current_time()
        with pytest.raises(AdminError) as info:
            await admin.create_topics([NewTopic("slow", 1, 1)])
        assert trio.current_time() - started == pytest.approx(5.0)
    assert info.value.code == ErrorCode.REQUEST_TIMED_OUT
    assert "CREATE_TOPICS did not complete within 5.0s" in str(info.value)


async def test_unreachable_cluster_times_out_with_the_cause(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def refuse(host: str, port: int) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        raise ConnectionRefusedError(f"{host}:{port} refused")

    async with Admin.open("nowhere:1", connector=refuse, timeout=3.0,
                          rng=MidpointRandom()) as admin:
        started = trio.current_time()
        with pytest.raises(BootstrapError) as info:
            await admin.describe_cluster()
    # No broker ever answered: the call is not retried until its timeout but fails
    # with the bootstrap's cause once the metadata wait (0.8 x timeout, shorter than
    # connect_timeout here) is over.
    assert trio.current_time() - started == pytest.approx(2.4)
    assert info.value.causes == {"nowhere:1": "connection refused (nowhere:1 refused)"}


async def test_per_topic_errors_are_returned_not_retried(
    fake: FakeCluster, autojump_clock: trio.testing.MockClock
) -> None:
    fake.fail_next(int(ApiKey.CREATE_TOPICS), ErrorCode.NOT_CONTROLLER, count=1)
    async with open_admin(fake) as admin:
        first = (await admin.create_topics([NewTopic("nc", 1, 1)]))["nc"]
        assert first is not None and first.code == ErrorCode.NOT_CONTROLLER
        assert first.code.retriable  # reported per topic, for the caller to decide
        assert (await admin.create_topics([NewTopic("nc", 1, 1)]))["nc"] is None


async def test_whole_request_errors_retried_if_retriable(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    # ListPartitionReassignments carries a whole-request error code; the fake does not serve
    # the API, so a control hook answers it: NOT_CONTROLLER twice, then an empty list.
    fake = FakeCluster(brokers=1, api_versions={**SUPPORTED_VERSIONS, 46: (0, 0)})
    await nursery.start(fake.run)
    answers = [ErrorCode.NOT_CONTROLLER, ErrorCode.NOT_CONTROLLER, ErrorCode.NONE,
               ErrorCode.CLUSTER_AUTHORIZATION_FAILED]
    times: list[float] = []

    def answer(ctx: object) -> lpr.ListPartitionReassignmentsResponse:
        times.append(trio.current_time())
        return lpr.ListPartitionReassignmentsResponse(error_code=int(answers.pop(0)))

    fake.control(46, answer, sticky=True)
    async with open_admin(fake) as admin:
        start = trio.current_time()
        assert await admin.list_partition_reassignments() == {}
        # backoff 0.05 s, then 0.1 s (MidpointRandom: no jitter)
        assert [t - start for t in times] == pytest.approx([0.0, 0.05, 0.15])
        with pytest.raises(AdminError) as info:
            await admin.list_partition_reassignments()
    assert info.value.code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    assert len(times) == 4  # not retried


async def test_api_the_broker_lacks_is_named(fake: FakeCluster,
                                             autojump_clock: trio.testing.MockClock) -> None:
    async with open_admin(fake) as admin:
        with pytest.raises(UnsupportedApiError, match="ELECT_LEADERS"):
            await admin.elect_leaders([("existing", 0)])
        with pytest.raises(UnsupportedApiError, match="ALTER_PARTITION_REASSIGNMENTS"):
            await admin.alter_partition_reassignments({("existing", 0): [1, 2]})


async def test_direct_mode_never_uses_advertised_addresses(
    fake: FakeCluster, autojump_clock: trio.testing.MockClock
) -> None:
    # The broker is reachable as "front:9092" (a port forward) but advertises its own
    # address, which this host cannot reach (as a broker advertising a proxy that is not
    # running yet): a normal admin follows the metadata and fails; a direct one stays on
    # the bootstrap address.
    real = fake.bootstrap.split(",")[0]

    async def front_only(host: str, port: int) -> trio.abc.Stream:
        if (host, port) != ("front", 9092):
            raise ConnectionRefusedError(f"{host}:{port} unreachable from here")
        real_host, real_port = real.split(":")
        return await fake.connector(real_host, int(real_port))

    async with Admin.open("front:9092", connector=front_only, direct=True, timeout=2.0,
                          rng=MidpointRandom()) as admin:
        assert await admin.create_topics([NewTopic("direct", 1, 1)]) == {"direct": None}
        with pytest.raises(ValueError, match="direct=True"):
            await admin.describe_cluster(node=0)
    assert "direct" in fake.state.topics
    async with Admin.open("front:9092", connector=front_only, timeout=2.0,
                          rng=MidpointRandom()) as admin:
        with pytest.raises(AdminError) as info:
            await admin.create_topics([NewTopic("followed", 1, 1)])
    assert info.value.code == ErrorCode.REQUEST_TIMED_OUT
    assert "unreachable from here" in str(info.value)


def test_new_topic_validation() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        NewTopic("")
    with pytest.raises(ValueError, match="partitions must be a positive int or -1"):
        NewTopic("t", 0)
    with pytest.raises(ValueError, match="replication_factor"):
        NewTopic("t", 1, -2)
    with pytest.raises(ValueError, match="strings"):
        NewTopic("t", 1, 1, {"max.message.bytes": 100000})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="either assignments or"):
        NewTopic("t", 3, assignments={0: [1]})
    with pytest.raises(ValueError, match=r"0\.\.n-1"):
        NewTopic("t", assignments={1: [1]})
    topic = NewTopic("t", 2, 1, {"a": "b"})
    with pytest.raises(TypeError):
        topic.config["a"] = "c"  # type: ignore[index]


def test_raise_errors_raises_the_first_and_counts_the_rest() -> None:
    ok = {TopicPartition("t", 0): None}
    raise_errors(ok)
    failures = {
        TopicPartition("t", 1): AdminError(ErrorCode.ELECTION_NOT_NEEDED, resource="t-1"),
        TopicPartition("t", 0): AdminError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, resource="t-0"),
    }
    raise_errors(failures, ignore=(ErrorCode.ELECTION_NOT_NEEDED,
                                   ErrorCode.INVALID_REPLICA_ASSIGNMENT))
    with pytest.raises(AdminError) as info:
        raise_errors(failures)
    assert info.value.code == ErrorCode.INVALID_REPLICA_ASSIGNMENT  # t-0 sorts first
    assert any("1 more failed" in note for note in info.value.__notes__)


async def test_cluster_settings_come_from_a_cluster_config(
    fake: FakeCluster, autojump_clock: trio.testing.MockClock
) -> None:
    with pytest.raises(ConfigError, match="unknown cluster option"):
        async with open_admin(fake, no_such_option=1):
            pass
    async with open_admin(fake) as admin:  # an admin client's defaults
        await admin.describe_cluster()
        assert admin.cluster.config.client_id == "pipeline-admin"
        assert admin.cluster.config.request_timeout == 65.0
    config = ClusterConfig(client_id="ops", connector=fake.connector, rng=MidpointRandom())
    async with Admin.open(fake.bootstrap, config, timeout=5.0) as admin:  # the caller's
        await admin.create_topics([NewTopic("configured", 1, 1)])
        assert admin.cluster.config.request_timeout == 30.0
    assert {r.client_id for r in fake.requests if r.api_key == ApiKey.CREATE_TOPICS} == {"ops"}
