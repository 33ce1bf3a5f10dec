"""Error codes."""

from __future__ import annotations

from pipeline.protocol.errors import (
    DecodeError,
    ErrorCode,
    ProtocolError,
    UnsupportedVersionError,
    error_code,
)


def test_every_code_present() -> None:
    values = {int(e) for e in ErrorCode}
    assert set(range(-1, 120)) <= values
    assert ErrorCode(-1) is ErrorCode.UNKNOWN_SERVER_ERROR
    assert ErrorCode(0) is ErrorCode.NONE
    assert ErrorCode(6) is ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert ErrorCode(10) is ErrorCode.MESSAGE_TOO_LARGE
    assert ErrorCode(45) is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert ErrorCode(90) is ErrorCode.PRODUCER_FENCED
    assert ErrorCode(119) is ErrorCode.INVALID_REGISTRATION


def test_retriable_matches_java() -> None:
    retriable = {
        "CORRUPT_MESSAGE", "UNKNOWN_TOPIC_OR_PARTITION", "LEADER_NOT_AVAILABLE",
        "NOT_LEADER_OR_FOLLOWER", "REQUEST_TIMED_OUT", "REPLICA_NOT_AVAILABLE", "NETWORK_EXCEPTION",
        "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE", "NOT_COORDINATOR",
        "NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND", "NOT_CONTROLLER",
        "CONCURRENT_TRANSACTIONS", "KAFKA_STORAGE_ERROR", "FETCH_SESSION_ID_NOT_FOUND",
        "INVALID_FETCH_SESSION_EPOCH", "LISTENER_NOT_FOUND", "FENCED_LEADER_EPOCH",
        "UNKNOWN_LEADER_EPOCH", "OFFSET_NOT_AVAILABLE", "PREFERRED_LEADER_NOT_AVAILABLE",
        "ELIGIBLE_LEADERS_NOT_AVAILABLE", "ELECTION_NOT_NEEDED", "UNSTABLE_OFFSET_COMMIT",
        "THROTTLING_QUOTA_EXCEEDED", "UNKNOWN_TOPIC_ID", "INCONSISTENT_TOPIC_ID",
        "FETCH_SESSION_TOPIC_ID_ERROR", "SHARE_SESSION_NOT_FOUND", "INVALID_SHARE_SESSION_EPOCH",
    }
    assert {e.name for e in ErrorCode if e.retriable} == retriable
    for name in ("MESSAGE_TOO_LARGE", "OUT_OF_ORDER_SEQUENCE_NUMBER", "INVALID_PRODUCER_EPOCH",
                 "TOPIC_AUTHORIZATION_FAILED", "UNKNOWN_PRODUCER_ID", "TRANSACTION_ABORTABLE",
                 "DUPLICATE_SEQUENCE_NUMBER", "PRODUCER_FENCED", "NONE", "UNKNOWN_SERVER_ERROR"):
        assert not ErrorCode[name].retriable


def test_descriptions() -> None:
    for e in ErrorCode:
        assert e.description
        assert "\n" not in e.description


def test_error_code_lookup() -> None:
    assert error_code(3) is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert error_code(31337) is ErrorCode.UNKNOWN_SERVER_ERROR
    assert ErrorCode.NOT_LEADER_OR_FOLLOWER == 6


def test_exception_hierarchy() -> None:
    assert issubclass(DecodeError, ProtocolError)
    assert issubclass(UnsupportedVersionError, ProtocolError)
    assert issubclass(ProtocolError, Exception)
    assert UnsupportedVersionError("x").header is None
