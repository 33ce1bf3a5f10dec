"""Generated message classes: shape, property round-trips, and byte fixtures."""

from __future__ import annotations

import dataclasses
import re
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.protocol import messages
from pipeline.protocol.api import CLIENT_VERSIONS, ApiKey, request_class, response_class
from pipeline.protocol.errors import DecodeError, UnsupportedVersionError
from pipeline.protocol.messages import api_versions as av
from pipeline.protocol.messages import create_topics as ct
from pipeline.protocol.messages import delete_topics as dt
from pipeline.protocol.messages import fetch as fe
from pipeline.protocol.messages import init_producer_id as ip
from pipeline.protocol.messages import list_offsets as lo
from pipeline.protocol.messages import metadata as md
from pipeline.protocol.messages import produce as pr
from pipeline.protocol.messages import sasl_authenticate as sa
from pipeline.protocol.messages import sasl_handshake as sh

from ._spec import all_cases, gen, message_strategy, specs
from .admin_fixtures import ADMIN_FIXTURES
from .group_fixtures import GROUP_FIXTURES
from .txn_fixtures import TXN_FIXTURES

CASES = all_cases()


def _case_id(c: tuple[ApiKey, str, int]) -> str:
    return f"{c[0].name}-{c[1]}-v{c[2]}"


# ----------------------------------------------------------------------------- shape


@pytest.mark.parametrize("key", list(CLIENT_VERSIONS), ids=lambda k: k.name)
def test_classvars_and_defaults(key: ApiKey) -> None:
    req_spec, resp_spec = specs(key)
    for cls, spec in ((request_class(key), req_spec), (response_class(key), resp_spec)):
        assert cls.API_KEY == key
        assert cls.MIN_VERSION == spec.lo
        assert cls.MAX_VERSION == spec.hi
        assert cls.FLEXIBLE_VERSION == spec.flexible_from
        assert CLIENT_VERSIONS[key][0] >= cls.MIN_VERSION
        assert CLIENT_VERSIONS[key][1] <= cls.MAX_VERSION
        obj = cls()  # every field has a default
        assert dataclasses.is_dataclass(obj)
        first = dataclasses.fields(cls)[0].name if dataclasses.fields(cls) else None
        if first is not None:
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(obj, first, getattr(obj, first))
        assert not hasattr(obj, "__dict__")  # slots
        with pytest.raises(TypeError):
            cls(1)  # kw_only
        for f in dataclasses.fields(cls):
            assert re.fullmatch(r"[a-z][a-z0-9_]*", f.name), f.name


def test_snake_case() -> None:
    sc = gen().snake_case
    assert sc("ProducerEpoch") == "producer_epoch"
    assert sc("TopicData") == "topic_data"
    assert sc("ThrottleTimeMs") == "throttle_time_ms"
    assert sc("TopicId") == "topic_id"
    assert sc("timeoutMs") == "timeout_ms"
    assert sc("validateOnly") == "validate_only"
    assert sc("ZkMigrationReady") == "zk_migration_ready"
    assert sc("IsrNodes") == "isr_nodes"


def test_strip_comments_keeps_urls_in_strings() -> None:
    text = '{"a": "http://x//y", // comment\n "b": 1}'
    assert gen().strip_comments(text).replace(" ", "") == '{"a":"http://x//y",\n"b":1}'


def test_generator_output_is_committed_and_deterministic() -> None:
    files = gen().generate_all()
    assert len(files) == len(gen().APIS) + 1
    for path, text in files.items():
        assert path.read_text(encoding="utf-8") == text, f"{path} is stale: run tools/gen_messages.py"
    assert gen().generate_all() == files


def test_registry_maps_every_api() -> None:
    for key in ApiKey:
        assert messages.REQUESTS[key].API_KEY == key
        assert messages.RESPONSES[key].API_KEY == key


def test_nested_struct_names() -> None:
    from pipeline.protocol.messages import (
        api_versions,
        create_topics,
        fetch,
        init_producer_id,
        list_offsets,
        metadata,
        produce,
    )

    for mod, names in (
        (produce, ["TopicProduceData", "PartitionProduceData", "TopicProduceResponse",
                   "PartitionProduceResponse", "BatchIndexAndErrorMessage", "LeaderIdAndEpoch",
                   "NodeEndpoint"]),
        (metadata, ["MetadataRequestTopic", "MetadataResponseBroker", "MetadataResponseTopic",
                    "MetadataResponsePartition"]),
        (fetch, ["FetchTopic", "FetchPartition", "ForgottenTopic", "ReplicaState",
                 "FetchableTopicResponse", "PartitionData", "EpochEndOffset", "LeaderIdAndEpoch",
                 "SnapshotId", "AbortedTransaction", "NodeEndpoint"]),
        (api_versions, ["ApiVersion", "SupportedFeatureKey", "FinalizedFeatureKey"]),
        (init_producer_id, ["InitProducerIdRequest", "InitProducerIdResponse"]),
        (create_topics, ["CreatableTopic", "CreatableReplicaAssignment", "CreatableTopicConfig",
                         "CreatableTopicResult", "CreatableTopicConfigs"]),
        (list_offsets, ["ListOffsetsTopic", "ListOffsetsPartition", "ListOffsetsTopicResponse",
                        "ListOffsetsPartitionResponse"]),
    ):
        for n in names:
            assert hasattr(mod, n), (mod.__name__, n)
            assert n in mod.__all__


def test_struct_name_clash_gets_response_prefix(tmp_path: Any) -> None:
    g = gen()
    req = tmp_path / "XRequest.json"
    resp = tmp_path / "XResponse.json"
    req.write_text('{"apiKey": 99, "type": "request", "name": "XRequest", "validVersions": "0",'
                   ' "flexibleVersions": "none", "fields": [{"name": "Items", "type": "[]Item",'
                   ' "versions": "0+", "fields": [{"name": "A", "type": "int8", "versions": "0+"}]}]}')
    resp.write_text('{"apiKey": 99, "type": "response", "name": "XResponse", "validVersions": "0",'
                    ' "flexibleVersions": "none", "fields": [{"name": "Items", "type": "[]Item",'
                    ' "versions": "0+", "fields": [{"name": "B", "type": "int8", "versions": "0+"}]}]}')
    r = g.load_spec(req)
    s = g.load_spec(resp, taken={r.root.name, *(x.name for x in r.structs)})
    assert [x.name for x in r.structs] == ["Item"]
    assert [x.name for x in s.structs] == ["ResponseItem"]


# ----------------------------------------------------------------------------- properties


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_roundtrip(case: tuple[ApiKey, str, int]) -> None:
    key, kind, version = case
    cls = request_class(key) if kind == "request" else response_class(key)

    @settings(max_examples=25, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(message_strategy(key, kind, version))
    def check(x: Any) -> None:
        data = x.encode(version)
        y = cls.decode(data, version)
        assert y == x
        assert y.encode(version) == data
        # any strict prefix is truncated, never mis-decoded silently into garbage types
        if data:
            cut = data[: len(data) // 2]
            try:
                cls.decode(cut, version)
            except DecodeError:
                pass

    check()


@pytest.mark.parametrize("version", [4, 5])
@pytest.mark.parametrize("kind", ["request", "response"])
def test_add_partitions_to_txn_broker_versions_roundtrip(kind: str, version: int) -> None:
    """v4+ (KIP-890's batched, broker-to-broker form) is generated though clients speak
    v0-3; its request shares one topic struct between the v3-and-below and the batched
    fields (a spec ``commonStructs`` entry used twice)."""
    from pipeline.protocol.messages import add_partitions_to_txn as apt

    assert CLIENT_VERSIONS[ApiKey.ADD_PARTITIONS_TO_TXN] == (0, 3)
    cls = apt.AddPartitionsToTxnRequest if kind == "request" else apt.AddPartitionsToTxnResponse

    @settings(max_examples=25, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(message_strategy(ApiKey.ADD_PARTITIONS_TO_TXN, kind, version))
    def check(x: Any) -> None:
        data = x.encode(version)
        assert cls.decode(data, version) == x

    check()
    batched = apt.AddPartitionsToTxnRequest(transactions=(apt.AddPartitionsToTxnTransaction(
        transactional_id="t", producer_id=1, producer_epoch=0, verify_only=True,
        topics=(apt.AddPartitionsToTxnTopic(name="o", partitions=(3,)),)),))
    if kind == "request":
        assert batched.encode(version) == (
            b"\x02"  # transactions: compact 1
            b"\x02t" b"\x00\x00\x00\x00\x00\x00\x00\x01" b"\x00\x00"  # id, producer id, epoch
            b"\x01"  # verify_only
            b"\x02" b"\x02o" b"\x02\x00\x00\x00\x03" b"\x00"  # topics: o [3]
            b"\x00"  # transaction tagged fields
            b"\x00")  # tagged fields


@pytest.mark.parametrize("key", list(CLIENT_VERSIONS), ids=lambda k: k.name)
@given(data=st.data())
@settings(max_examples=10, deadline=None, database=None)
def test_garbage_raises_only_decode_error(key: ApiKey, data: st.DataObject) -> None:
    lo, hi = CLIENT_VERSIONS[key]
    version = data.draw(st.integers(lo, hi))
    blob = data.draw(st.binary(max_size=64))
    for cls in (request_class(key), response_class(key)):
        try:
            cls.decode(blob, version)
        except DecodeError:
            pass


def test_version_out_of_range() -> None:
    from pipeline.protocol.messages.produce import ProduceRequest

    with pytest.raises(UnsupportedVersionError):
        ProduceRequest().encode(14)
    with pytest.raises(UnsupportedVersionError):
        ProduceRequest().encode(2)  # Kafka 4 removed v0-2; v3 is the baseline
    with pytest.raises(UnsupportedVersionError):
        ProduceRequest.decode(b"", -1)


def test_non_ignorable_field_absent_in_version_raises() -> None:
    from pipeline.protocol.messages.metadata import MetadataRequest
    from pipeline.protocol.messages.produce import ProduceRequest

    # AllowAutoTopicCreation (v4+, not ignorable): the default is fine, anything else is not
    assert MetadataRequest(topics=None, allow_auto_topic_creation=True).encode(3) == b"\xff\xff\xff\xff"
    with pytest.raises(UnsupportedVersionError, match="allow_auto_topic_creation"):
        MetadataRequest(topics=None, allow_auto_topic_creation=False).encode(3)
    # ProducerId (v3+) is not ignorable either
    from pipeline.protocol.messages.init_producer_id import InitProducerIdRequest

    with pytest.raises(UnsupportedVersionError, match="producer_id"):
        InitProducerIdRequest(producer_id=7).encode(2)
    # ProduceRequest's topic name (v3-12) is ignorable: v13 names topics by id
    assert ProduceRequest(topic_data=(pr.TopicProduceData(name="t"),)).encode(13) == (
        ProduceRequest(topic_data=(pr.TopicProduceData(),)).encode(13))


def test_ignorable_field_absent_in_version_is_dropped() -> None:
    from pipeline.protocol.messages.metadata import MetadataResponse

    # ThrottleTimeMs is v3+ and ignorable
    data = MetadataResponse(throttle_time_ms=100).encode(1)
    assert MetadataResponse.decode(data, 1).throttle_time_ms == 0


def test_null_in_non_nullable_version() -> None:
    from pipeline.protocol.messages.metadata import MetadataRequest

    assert MetadataRequest(topics=None).encode(1) == b"\xff\xff\xff\xff"
    with pytest.raises(ValueError, match="not nullable"):
        MetadataRequest(topics=None).encode(0)
    with pytest.raises(DecodeError):
        MetadataRequest.decode(b"\xff\xff\xff\xff", 0)


def test_unknown_tagged_fields_are_skipped() -> None:
    from pipeline.protocol.messages.api_versions import ApiVersionsResponse

    body = (
        b"\x00\x00"  # error_code
        b"\x01"  # api_keys: empty compact array
        b"\x00\x00\x00\x00"  # throttle_time_ms
        b"\x02"  # 2 tagged fields
        b"\x01\x08\x00\x00\x00\x00\x00\x00\x00\x05"  # tag 1 finalized_features_epoch = 5
        b"\x63\x02\xab\xcd"  # tag 99: unknown, 2 bytes, skipped
    )
    r = ApiVersionsResponse.decode(body, 3)
    assert r.finalized_features_epoch == 5
    assert r.api_keys == ()


def test_tagged_struct_written_only_when_not_default() -> None:
    from pipeline.protocol.messages.produce import LeaderIdAndEpoch, PartitionProduceResponse
    from pipeline.protocol.primitives import Reader, Writer

    def enc(p: PartitionProduceResponse, version: int) -> bytes:
        w = Writer()
        p._write(w, version)
        return w.getvalue()

    base = enc(PartitionProduceResponse(index=1), 10)
    assert base.endswith(b"\x00")  # no tagged fields
    p = PartitionProduceResponse(index=1, current_leader=LeaderIdAndEpoch(leader_id=2, leader_epoch=7))
    tagged = enc(p, 10)
    assert tagged[len(base) - 1 :] == (
        b"\x01"  # one tagged field
        b"\x00"  # tag 0
        b"\x09"  # 9 bytes
        b"\x00\x00\x00\x02"  # leader_id
        b"\x00\x00\x00\x07"  # leader_epoch
        b"\x00"  # struct's own (empty) tagged fields
    )
    assert PartitionProduceResponse._read(Reader(tagged), 10) == p
    # absent before v10 even when set (the field is not ignorable: Kafka drops tagged fields silently)
    old = enc(PartitionProduceResponse(index=1, current_leader=LeaderIdAndEpoch(leader_id=2)), 9)
    assert PartitionProduceResponse._read(Reader(old), 9).current_leader == LeaderIdAndEpoch()


# ----------------------------------------------------------------------------- byte fixtures
#
# One table drives both directions (sarama / h11 style): for each listed API at
# the lowest and highest version we speak, request and response, the object
# must encode to exactly these bytes and these bytes must decode to the object.
# Bytes were written by hand from the Kafka protocol guide, one field per line.

TOPIC_ID = uuid.UUID("5f2a8c1e-9b3d-4e6f-8a7b-1c2d3e4f5a6b")
TOPIC_ID_BYTES = b"\x5f\x2a\x8c\x1e\x9b\x3d\x4e\x6f\x8a\x7b\x1c\x2d\x3e\x4f\x5a\x6b"
# opaque record data (the codec never looks inside `records` fields)
BATCH = b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x3d\xff\xff\xff\xff\x02"  # 17 bytes

FIXTURES: list[tuple[str, int, Any, bytes]] = [
    # ---- ApiVersions -------------------------------------------------------
    ("ApiVersionsRequest", 0, av.ApiVersionsRequest(), b""),
    ("ApiVersionsRequest", 3,
     av.ApiVersionsRequest(client_software_name="pipeline", client_software_version="0.1.0"),
     b"\x09pipeline"  # client_software_name (compact string)
     b"\x060.1.0"  # client_software_version
     b"\x00"),  # tagged fields
    ("ApiVersionsResponse", 0,
     av.ApiVersionsResponse(error_code=0, api_keys=(
         av.ApiVersion(api_key=0, min_version=3, max_version=11),
         av.ApiVersion(api_key=18, min_version=0, max_version=3))),
     b"\x00\x00"  # error_code
     b"\x00\x00\x00\x02"  # api_keys: 2
     b"\x00\x00" b"\x00\x03" b"\x00\x0b"  # produce 3-11
     b"\x00\x12" b"\x00\x00" b"\x00\x03"),  # api_versions 0-3
    ("ApiVersionsResponse", 3,
     av.ApiVersionsResponse(
         error_code=0,
         api_keys=(av.ApiVersion(api_key=0, min_version=3, max_version=11),
                   av.ApiVersion(api_key=18, min_version=0, max_version=3)),
         throttle_time_ms=0,
         supported_features=(av.SupportedFeatureKey(name="metadata.version", min_version=1, max_version=20),),
         finalized_features_epoch=42),
     b"\x00\x00"  # error_code
     b"\x03"  # api_keys: compact 2
     b"\x00\x00" b"\x00\x03" b"\x00\x0b" b"\x00"  # produce 3-11, tagged fields
     b"\x00\x12" b"\x00\x00" b"\x00\x03" b"\x00"  # api_versions 0-3, tagged fields
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x02"  # 2 tagged fields
     b"\x00\x17"  # tag 0 supported_features, 23 bytes
     b"\x02" b"\x11metadata.version" b"\x00\x01" b"\x00\x14" b"\x00"
     b"\x01\x08" b"\x00\x00\x00\x00\x00\x00\x00\x2a"),  # tag 1 finalized_features_epoch = 42
    # ---- Metadata ----------------------------------------------------------
    ("MetadataRequest", 1,
     md.MetadataRequest(topics=(md.MetadataRequestTopic(name="orders"),)),
     b"\x00\x00\x00\x01"  # topics: 1
     b"\x00\x06orders"),  # name
    ("MetadataRequest", 12,
     md.MetadataRequest(topics=(md.MetadataRequestTopic(name="orders"),),
                        allow_auto_topic_creation=False,
                        include_topic_authorized_operations=False),
     b"\x02"  # topics: compact 1
     + b"\x00" * 16  # topic_id (zero: by name)
     + b"\x07orders"  # name (compact nullable)
     b"\x00"  # topic tagged fields
     b"\x00"  # allow_auto_topic_creation
     b"\x00"  # include_topic_authorized_operations
     b"\x00"),  # tagged fields
    ("MetadataResponse", 1,
     md.MetadataResponse(
         brokers=(md.MetadataResponseBroker(node_id=1, host="kafka-1", port=9092, rack=None),),
         controller_id=1,
         topics=(md.MetadataResponseTopic(error_code=0, name="orders", is_internal=False, partitions=(
             md.MetadataResponsePartition(error_code=0, partition_index=0, leader_id=1,
                                          replica_nodes=(1,), isr_nodes=(1,)),)),)),
     b"\x00\x00\x00\x01"  # brokers: 1
     b"\x00\x00\x00\x01"  # node_id
     b"\x00\x07kafka-1"  # host
     b"\x00\x00\x23\x84"  # port 9092
     b"\xff\xff"  # rack: null
     b"\x00\x00\x00\x01"  # controller_id
     b"\x00\x00\x00\x01"  # topics: 1
     b"\x00\x00"  # error_code
     b"\x00\x06orders"  # name
     b"\x00"  # is_internal
     b"\x00\x00\x00\x01"  # partitions: 1
     b"\x00\x00"  # error_code
     b"\x00\x00\x00\x00"  # partition_index
     b"\x00\x00\x00\x01"  # leader_id
     b"\x00\x00\x00\x01" b"\x00\x00\x00\x01"  # replica_nodes [1]
     b"\x00\x00\x00\x01" b"\x00\x00\x00\x01"),  # isr_nodes [1]
    ("MetadataResponse", 12,
     md.MetadataResponse(
         throttle_time_ms=0,
         brokers=(md.MetadataResponseBroker(node_id=1, host="kafka-1", port=9092, rack="rack-a"),),
         cluster_id="cluster-1",
         controller_id=1,
         topics=(md.MetadataResponseTopic(
             error_code=0, name="orders", topic_id=TOPIC_ID, is_internal=False,
             partitions=(md.MetadataResponsePartition(
                 error_code=0, partition_index=0, leader_id=1, leader_epoch=5,
                 replica_nodes=(1,), isr_nodes=(1,), offline_replicas=()),),
             topic_authorized_operations=-2147483648),)),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x02"  # brokers: compact 1
     b"\x00\x00\x00\x01"  # node_id
     b"\x08kafka-1"  # host
     b"\x00\x00\x23\x84"  # port
     b"\x07rack-a"  # rack
     b"\x00"  # broker tagged fields
     b"\x0acluster-1"  # cluster_id
     b"\x00\x00\x00\x01"  # controller_id
     b"\x02"  # topics: compact 1
     b"\x00\x00"  # error_code
     b"\x07orders"  # name
     + TOPIC_ID_BYTES  # topic_id
     + b"\x00"  # is_internal
     b"\x02"  # partitions: compact 1
     b"\x00\x00"  # error_code
     b"\x00\x00\x00\x00"  # partition_index
     b"\x00\x00\x00\x01"  # leader_id
     b"\x00\x00\x00\x05"  # leader_epoch
     b"\x02\x00\x00\x00\x01"  # replica_nodes [1]
     b"\x02\x00\x00\x00\x01"  # isr_nodes [1]
     b"\x01"  # offline_replicas []
     b"\x00"  # partition tagged fields
     b"\x80\x00\x00\x00"  # topic_authorized_operations (INT32_MIN: not requested)
     b"\x00"  # topic tagged fields
     b"\x00"),  # tagged fields
    # ---- Produce -----------------------------------------------------------
    ("ProduceRequest", 3,
     pr.ProduceRequest(transactional_id=None, acks=-1, timeout_ms=30000, topic_data=(
         pr.TopicProduceData(name="orders", partition_data=(
             pr.PartitionProduceData(index=0, records=BATCH),)),)),
     b"\xff\xff"  # transactional_id: null
     b"\xff\xff"  # acks: -1
     b"\x00\x00\x75\x30"  # timeout_ms: 30000
     b"\x00\x00\x00\x01"  # topic_data: 1
     b"\x00\x06orders"  # name
     b"\x00\x00\x00\x01"  # partition_data: 1
     b"\x00\x00\x00\x00"  # index
     b"\x00\x00\x00\x11" + BATCH),  # records: 17 bytes
    ("ProduceRequest", 11,
     pr.ProduceRequest(transactional_id="txn-1", acks=1, timeout_ms=30000, topic_data=(
         pr.TopicProduceData(name="orders", partition_data=(
             pr.PartitionProduceData(index=2, records=BATCH),)),)),
     b"\x06txn-1"  # transactional_id (compact nullable)
     b"\x00\x01"  # acks: 1
     b"\x00\x00\x75\x30"  # timeout_ms
     b"\x02"  # topic_data: compact 1
     b"\x07orders"  # name
     b"\x02"  # partition_data: compact 1
     b"\x00\x00\x00\x02"  # index
     b"\x12" + BATCH  # records: compact, 17 bytes
     + b"\x00"  # partition tagged fields
     b"\x00"  # topic tagged fields
     b"\x00"),  # tagged fields
    ("ProduceResponse", 3,
     pr.ProduceResponse(responses=(pr.TopicProduceResponse(name="orders", partition_responses=(
         pr.PartitionProduceResponse(index=0, error_code=0, base_offset=42, log_append_time_ms=-1),)),),
         throttle_time_ms=0),
     b"\x00\x00\x00\x01"  # responses: 1
     b"\x00\x06orders"  # name
     b"\x00\x00\x00\x01"  # partition_responses: 1
     b"\x00\x00\x00\x00"  # index
     b"\x00\x00"  # error_code
     b"\x00\x00\x00\x00\x00\x00\x00\x2a"  # base_offset: 42
     b"\xff\xff\xff\xff\xff\xff\xff\xff"  # log_append_time_ms: -1
     b"\x00\x00\x00\x00"),  # throttle_time_ms
    ("ProduceResponse", 11,
     pr.ProduceResponse(
         responses=(pr.TopicProduceResponse(name="orders", partition_responses=(
             pr.PartitionProduceResponse(
                 index=0, error_code=6, base_offset=-1, log_append_time_ms=-1, log_start_offset=-1,
                 record_errors=(), error_message=None,
                 current_leader=pr.LeaderIdAndEpoch(leader_id=2, leader_epoch=7)),)),),
         throttle_time_ms=0,
         node_endpoints=(pr.NodeEndpoint(node_id=2, host="kafka-2", port=9092, rack=None),)),
     b"\x02"  # responses: compact 1
     b"\x07orders"  # name
     b"\x02"  # partition_responses: compact 1
     b"\x00\x00\x00\x00"  # index
     b"\x00\x06"  # error_code: NOT_LEADER_OR_FOLLOWER
     b"\xff\xff\xff\xff\xff\xff\xff\xff"  # base_offset: -1
     b"\xff\xff\xff\xff\xff\xff\xff\xff"  # log_append_time_ms: -1
     b"\xff\xff\xff\xff\xff\xff\xff\xff"  # log_start_offset: -1
     b"\x01"  # record_errors: []
     b"\x00"  # error_message: null
     b"\x01"  # 1 tagged field
     b"\x00\x09"  # tag 0 current_leader, 9 bytes
     b"\x00\x00\x00\x02" b"\x00\x00\x00\x07" b"\x00"  # leader_id 2, leader_epoch 7, tagged fields
     b"\x00"  # topic tagged fields
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x01"  # 1 tagged field
     b"\x00\x13"  # tag 0 node_endpoints, 19 bytes
     b"\x02" b"\x00\x00\x00\x02" b"\x08kafka-2" b"\x00\x00\x23\x84" b"\x00" b"\x00"),
    # ---- InitProducerId ----------------------------------------------------
    ("InitProducerIdRequest", 0,
     ip.InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000),
     b"\xff\xff"  # transactional_id: null
     b"\x00\x00\xea\x60"),  # transaction_timeout_ms: 60000
    ("InitProducerIdRequest", 5,
     ip.InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000,
                              producer_id=-1, producer_epoch=-1),
     b"\x00"  # transactional_id: null (compact)
     b"\x00\x00\xea\x60"  # transaction_timeout_ms
     b"\xff\xff\xff\xff\xff\xff\xff\xff"  # producer_id: -1
     b"\xff\xff"  # producer_epoch: -1
     b"\x00"),  # tagged fields
    ("InitProducerIdResponse", 0,
     ip.InitProducerIdResponse(throttle_time_ms=0, error_code=0, producer_id=4000, producer_epoch=0),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x00\x00"  # error_code
     b"\x00\x00\x00\x00\x00\x00\x0f\xa0"  # producer_id: 4000
     b"\x00\x00"),  # producer_epoch
    ("InitProducerIdResponse", 5,
     ip.InitProducerIdResponse(throttle_time_ms=0, error_code=0, producer_id=4000, producer_epoch=3),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x00\x00"  # error_code
     b"\x00\x00\x00\x00\x00\x00\x0f\xa0"  # producer_id
     b"\x00\x03"  # producer_epoch
     b"\x00"),  # tagged fields
    # ---- Fetch -------------------------------------------------------------
    ("FetchRequest", 4,
     fe.FetchRequest(replica_id=-1, max_wait_ms=500, min_bytes=1, max_bytes=52428800, isolation_level=1,
                     topics=(fe.FetchTopic(topic="orders", partitions=(
                         fe.FetchPartition(partition=0, fetch_offset=100, partition_max_bytes=1048576),)),)),
     b"\xff\xff\xff\xff"  # replica_id: -1 (consumer)
     b"\x00\x00\x01\xf4"  # max_wait_ms: 500
     b"\x00\x00\x00\x01"  # min_bytes: 1
     b"\x03\x20\x00\x00"  # max_bytes: 50 MiB
     b"\x01"  # isolation_level: READ_COMMITTED
     b"\x00\x00\x00\x01"  # topics: 1
     b"\x00\x06orders"  # topic
     b"\x00\x00\x00\x01"  # partitions: 1
     b"\x00\x00\x00\x00"  # partition
     b"\x00\x00\x00\x00\x00\x00\x00\x64"  # fetch_offset: 100
     b"\x00\x10\x00\x00"),  # partition_max_bytes: 1 MiB
    ("FetchRequest", 17,
     fe.FetchRequest(cluster_id="cluster-1", max_wait_ms=500, min_bytes=1, max_bytes=52428800,
                     isolation_level=0, session_id=0, session_epoch=-1,
                     topics=(fe.FetchTopic(topic_id=TOPIC_ID, partitions=(
                         fe.FetchPartition(partition=0, current_leader_epoch=5, fetch_offset=100,
                                           last_fetched_epoch=-1, log_start_offset=-1,
                                           partition_max_bytes=1048576),)),),
                     forgotten_topics_data=(), rack_id=""),
     b"\x00\x00\x01\xf4"  # max_wait_ms
     b"\x00\x00\x00\x01"  # min_bytes
     b"\x03\x20\x00\x00"  # max_bytes
     b"\x00"  # isolation_level
     b"\x00\x00\x00\x00"  # session_id
     b"\xff\xff\xff\xff"  # session_epoch: -1
     b"\x02"  # topics: compact 1
     + TOPIC_ID_BYTES  # topic_id
     + b"\x02"  # partitions: compact 1
     b"\x00\x00\x00\x00"  # partition
     b"\x00\x00\x00\x05"  # current_leader_epoch
     b"\x00\x00\x00\x00\x00\x00\x00\x64"  # fetch_offset
     b"\xff\xff\xff\xff"  # last_fetched_epoch
     b"\xff\xff\xff\xff\xff\xff\xff\xff"  # log_start_offset
     b"\x00\x10\x00\x00"  # partition_max_bytes
     b"\x00"  # partition tagged fields
     b"\x00"  # topic tagged fields
     b"\x01"  # forgotten_topics_data: []
     b"\x01"  # rack_id: ""
     b"\x01"  # 1 tagged field
     b"\x00\x0a" b"\x0acluster-1"),  # tag 0 cluster_id, 10 bytes
    ("FetchResponse", 4,
     fe.FetchResponse(throttle_time_ms=0, responses=(fe.FetchableTopicResponse(topic="orders", partitions=(
         fe.PartitionData(partition_index=0, error_code=0, high_watermark=150, last_stable_offset=150,
                          aborted_transactions=None, records=BATCH),)),)),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x00\x00\x00\x01"  # responses: 1
     b"\x00\x06orders"  # topic
     b"\x00\x00\x00\x01"  # partitions: 1
     b"\x00\x00\x00\x00"  # partition_index
     b"\x00\x00"  # error_code
     b"\x00\x00\x00\x00\x00\x00\x00\x96"  # high_watermark: 150
     b"\x00\x00\x00\x00\x00\x00\x00\x96"  # last_stable_offset: 150
     b"\xff\xff\xff\xff"  # aborted_transactions: null
     b"\x00\x00\x00\x11" + BATCH),  # records
    ("FetchResponse", 17,
     fe.FetchResponse(throttle_time_ms=0, error_code=0, session_id=0, responses=(
         fe.FetchableTopicResponse(topic_id=TOPIC_ID, partitions=(
             fe.PartitionData(partition_index=0, error_code=0, high_watermark=150, last_stable_offset=150,
                              log_start_offset=0, current_leader=fe.LeaderIdAndEpoch(leader_id=1, leader_epoch=5),
                              aborted_transactions=(), preferred_read_replica=-1, records=BATCH),)),)),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x00\x00"  # error_code
     b"\x00\x00\x00\x00"  # session_id
     b"\x02"  # responses: compact 1
     + TOPIC_ID_BYTES  # topic_id
     + b"\x02"  # partitions: compact 1
     b"\x00\x00\x00\x00"  # partition_index
     b"\x00\x00"  # error_code
     b"\x00\x00\x00\x00\x00\x00\x00\x96"  # high_watermark
     b"\x00\x00\x00\x00\x00\x00\x00\x96"  # last_stable_offset
     b"\x00\x00\x00\x00\x00\x00\x00\x00"  # log_start_offset
     b"\x01"  # aborted_transactions: []
     b"\xff\xff\xff\xff"  # preferred_read_replica: -1
     b"\x12" + BATCH  # records (compact)
     + b"\x01"  # 1 tagged field
     b"\x01\x09"  # tag 1 current_leader, 9 bytes
     b"\x00\x00\x00\x01" b"\x00\x00\x00\x05" b"\x00"
     b"\x00"  # topic tagged fields
     b"\x00"),  # tagged fields
    # ---- ListOffsets -------------------------------------------------------
    ("ListOffsetsRequest", 0,
     lo.ListOffsetsRequest(replica_id=-1, topics=(lo.ListOffsetsTopic(name="orders", partitions=(
         lo.ListOffsetsPartition(partition_index=0, timestamp=-1, max_num_offsets=1),)),)),
     b"\xff\xff\xff\xff"  # replica_id
     b"\x00\x00\x00\x01"  # topics: 1
     b"\x00\x06orders"  # name
     b"\x00\x00\x00\x01"  # partitions: 1
     b"\x00\x00\x00\x00"  # partition_index
     b"\xff\xff\xff\xff\xff\xff\xff\xff"  # timestamp: -1 (latest)
     b"\x00\x00\x00\x01"),  # max_num_offsets
    ("ListOffsetsRequest", 10,
     lo.ListOffsetsRequest(replica_id=-1, isolation_level=0, timeout_ms=30000, topics=(
         lo.ListOffsetsTopic(name="orders", partitions=(
             lo.ListOffsetsPartition(partition_index=0, current_leader_epoch=5, timestamp=-2),)),)),
     b"\xff\xff\xff\xff"  # replica_id
     b"\x00"  # isolation_level
     b"\x02"  # topics: compact 1
     b"\x07orders"  # name
     b"\x02"  # partitions: compact 1
     b"\x00\x00\x00\x00"  # partition_index
     b"\x00\x00\x00\x05"  # current_leader_epoch
     b"\xff\xff\xff\xff\xff\xff\xff\xfe"  # timestamp: -2 (earliest)
     b"\x00"  # partition tagged fields
     b"\x00"  # topic tagged fields
     b"\x00\x00\x75\x30"  # timeout_ms
     b"\x00"),  # tagged fields
    ("ListOffsetsResponse", 0,
     lo.ListOffsetsResponse(topics=(lo.ListOffsetsTopicResponse(name="orders", partitions=(
         lo.ListOffsetsPartitionResponse(partition_index=0, error_code=0, old_style_offsets=(42,)),)),)),
     b"\x00\x00\x00\x01"  # topics: 1
     b"\x00\x06orders"  # name
     b"\x00\x00\x00\x01"  # partitions: 1
     b"\x00\x00\x00\x00"  # partition_index
     b"\x00\x00"  # error_code
     b"\x00\x00\x00\x01" b"\x00\x00\x00\x00\x00\x00\x00\x2a"),  # old_style_offsets [42]
    ("ListOffsetsResponse", 10,
     lo.ListOffsetsResponse(throttle_time_ms=0, topics=(lo.ListOffsetsTopicResponse(name="orders", partitions=(
         lo.ListOffsetsPartitionResponse(partition_index=0, error_code=0, timestamp=-1, offset=42,
                                         leader_epoch=5),)),)),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x02"  # topics: compact 1
     b"\x07orders"  # name
     b"\x02"  # partitions: compact 1
     b"\x00\x00\x00\x00"  # partition_index
     b"\x00\x00"  # error_code
     b"\xff\xff\xff\xff\xff\xff\xff\xff"  # timestamp: -1
     b"\x00\x00\x00\x00\x00\x00\x00\x2a"  # offset: 42
     b"\x00\x00\x00\x05"  # leader_epoch
     b"\x00"  # partition tagged fields
     b"\x00"  # topic tagged fields
     b"\x00"),  # tagged fields
    # ---- CreateTopics ------------------------------------------------------
    ("CreateTopicsRequest", 0,
     ct.CreateTopicsRequest(timeout_ms=60000, topics=(ct.CreatableTopic(
         name="orders", num_partitions=3, replication_factor=3, assignments=(),
         configs=(ct.CreatableTopicConfig(name="cleanup.policy", value="compact"),)),)),
     b"\x00\x00\x00\x01"  # topics: 1
     b"\x00\x06orders"  # name
     b"\x00\x00\x00\x03"  # num_partitions
     b"\x00\x03"  # replication_factor
     b"\x00\x00\x00\x00"  # assignments: []
     b"\x00\x00\x00\x01"  # configs: 1
     b"\x00\x0ecleanup.policy"  # name
     b"\x00\x07compact"  # value
     b"\x00\x00\xea\x60"),  # timeout_ms: 60000
    ("CreateTopicsRequest", 7,
     ct.CreateTopicsRequest(timeout_ms=60000, validate_only=True, topics=(ct.CreatableTopic(
         name="orders", num_partitions=-1, replication_factor=-1,
         assignments=(ct.CreatableReplicaAssignment(partition_index=0, broker_ids=(1, 2)),),
         configs=(ct.CreatableTopicConfig(name="cleanup.policy", value="compact"),)),)),
     b"\x02"  # topics: compact 1
     b"\x07orders"  # name
     b"\xff\xff\xff\xff"  # num_partitions: -1 (manual assignment)
     b"\xff\xff"  # replication_factor: -1
     b"\x02"  # assignments: compact 1
     b"\x00\x00\x00\x00"  # partition_index
     b"\x03\x00\x00\x00\x01\x00\x00\x00\x02"  # broker_ids [1, 2]
     b"\x00"  # assignment tagged fields
     b"\x02"  # configs: compact 1
     b"\x0fcleanup.policy"  # name
     b"\x08compact"  # value
     b"\x00"  # config tagged fields
     b"\x00"  # topic tagged fields
     b"\x00\x00\xea\x60"  # timeout_ms
     b"\x01"  # validate_only
     b"\x00"),  # tagged fields
    ("CreateTopicsResponse", 0,
     ct.CreateTopicsResponse(topics=(ct.CreatableTopicResult(name="orders", error_code=0),)),
     b"\x00\x00\x00\x01"  # topics: 1
     b"\x00\x06orders"  # name
     b"\x00\x00"),  # error_code
    ("CreateTopicsResponse", 7,
     ct.CreateTopicsResponse(throttle_time_ms=0, topics=(ct.CreatableTopicResult(
         name="orders", topic_id=TOPIC_ID, error_code=36, error_message="Topic 'orders' already exists.",
         num_partitions=3, replication_factor=3, configs=None),)),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x02"  # topics: compact 1
     b"\x07orders"  # name
     + TOPIC_ID_BYTES  # topic_id
     + b"\x00\x24"  # error_code: TOPIC_ALREADY_EXISTS
     b"\x1fTopic 'orders' already exists."  # error_message
     b"\x00\x00\x00\x03"  # num_partitions
     b"\x00\x03"  # replication_factor
     b"\x00"  # configs: null
     b"\x00"  # topic tagged fields (topic_config_error_code is default)
     b"\x00"),  # tagged fields
    # ---- DeleteTopics ------------------------------------------------------
    ("DeleteTopicsRequest", 0,
     dt.DeleteTopicsRequest(topic_names=("orders",), timeout_ms=30000),
     b"\x00\x00\x00\x01" b"\x00\x06orders"  # topic_names ["orders"]
     b"\x00\x00\x75\x30"),  # timeout_ms
    ("DeleteTopicsRequest", 6,
     dt.DeleteTopicsRequest(topics=(dt.DeleteTopicState(name="orders"),), timeout_ms=30000),
     b"\x02"  # topics: compact 1
     b"\x07orders"  # name
     + b"\x00" * 16  # topic_id: zero (by name)
     + b"\x00"  # topic tagged fields
     b"\x00\x00\x75\x30"  # timeout_ms
     b"\x00"),  # tagged fields
    ("DeleteTopicsResponse", 0,
     dt.DeleteTopicsResponse(responses=(dt.DeletableTopicResult(name="orders", error_code=0),)),
     b"\x00\x00\x00\x01"  # responses: 1
     b"\x00\x06orders"  # name
     b"\x00\x00"),  # error_code
    ("DeleteTopicsResponse", 6,
     dt.DeleteTopicsResponse(throttle_time_ms=0, responses=(dt.DeletableTopicResult(
         name="orders", topic_id=TOPIC_ID, error_code=0, error_message=None),)),
     b"\x00\x00\x00\x00"  # throttle_time_ms
     b"\x02"  # responses: compact 1
     b"\x07orders"  # name
     + TOPIC_ID_BYTES  # topic_id
     + b"\x00\x00"  # error_code
     b"\x00"  # error_message: null
     b"\x00"  # result tagged fields
     b"\x00"),  # tagged fields
    # ---- SaslHandshake -----------------------------------------------------
    ("SaslHandshakeRequest", 0, sh.SaslHandshakeRequest(mechanism="PLAIN"),
     b"\x00\x05PLAIN"),  # mechanism
    ("SaslHandshakeRequest", 1, sh.SaslHandshakeRequest(mechanism="SCRAM-SHA-256"),
     b"\x00\x0dSCRAM-SHA-256"),  # mechanism
    ("SaslHandshakeResponse", 0,
     sh.SaslHandshakeResponse(error_code=0, mechanisms=("PLAIN", "SCRAM-SHA-256")),
     b"\x00\x00"  # error_code
     b"\x00\x00\x00\x02" b"\x00\x05PLAIN" b"\x00\x0dSCRAM-SHA-256"),  # mechanisms
    ("SaslHandshakeResponse", 1,
     sh.SaslHandshakeResponse(error_code=33, mechanisms=("PLAIN",)),
     b"\x00\x21"  # error_code: UNSUPPORTED_SASL_MECHANISM
     b"\x00\x00\x00\x01" b"\x00\x05PLAIN"),  # mechanisms
    # ---- SaslAuthenticate --------------------------------------------------
    ("SaslAuthenticateRequest", 0, sa.SaslAuthenticateRequest(auth_bytes=b"\x00alice\x00secret"),
     b"\x00\x00\x00\x0d" b"\x00alice\x00secret"),  # auth_bytes (PLAIN)
    ("SaslAuthenticateRequest", 2, sa.SaslAuthenticateRequest(auth_bytes=b"\x00alice\x00secret"),
     b"\x0e" b"\x00alice\x00secret"  # auth_bytes (compact)
     b"\x00"),  # tagged fields
    ("SaslAuthenticateResponse", 0,
     sa.SaslAuthenticateResponse(error_code=0, error_message=None, auth_bytes=b""),
     b"\x00\x00"  # error_code
     b"\xff\xff"  # error_message: null
     b"\x00\x00\x00\x00"),  # auth_bytes: empty
    ("SaslAuthenticateResponse", 2,
     sa.SaslAuthenticateResponse(error_code=58, error_message="Authentication failed", auth_bytes=b"",
                                 session_lifetime_ms=0),
     b"\x00\x3a"  # error_code: SASL_AUTHENTICATION_FAILED
     b"\x16Authentication failed"  # error_message
     b"\x01"  # auth_bytes: empty (compact)
     b"\x00\x00\x00\x00\x00\x00\x00\x00"  # session_lifetime_ms
     b"\x00"),  # tagged fields
]


FIXTURES += ADMIN_FIXTURES + TXN_FIXTURES + GROUP_FIXTURES
# Produce v12 is v11 on the wire (KIP-890: only what a transactional request means
# changes): the same bytes, at both versions.
FIXTURES += [(name, 12, obj, data) for name, version, obj, data in FIXTURES
             if name in ("ProduceRequest", "ProduceResponse") and version == 11]


@pytest.mark.parametrize(("name", "version", "obj", "data"), FIXTURES,
                         ids=[f"{f[0]}-v{f[1]}" for f in FIXTURES])
def test_fixture(name: str, version: int, obj: Any, data: bytes) -> None:
    assert type(obj).__name__ == name
    assert obj.encode(version) == data
    assert type(obj).decode(data, version) == obj


def test_fixtures_cover_lowest_and_highest_client_versions() -> None:
    covered = {(f[0], f[1]) for f in FIXTURES}
    for key, (low, high) in CLIENT_VERSIONS.items():
        for cls in (request_class(key), response_class(key)):
            assert (cls.__name__, low) in covered
            assert (cls.__name__, high) in covered
