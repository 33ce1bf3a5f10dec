"""OffsetCommit and OffsetFetch as the consumer builds and reads them, per version
(``_commits.py``): which fields each version carries, and both answer shapes (per
group from v8, top-level before)."""

from __future__ import annotations

import pytest

from pipeline.consumer import OffsetAndMetadata, TopicPartition
from pipeline.consumer._commits import commit_request, fetch_request, fetch_result
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages import offset_fetch as of

OFFSETS = {TopicPartition("t", 1): OffsetAndMetadata(7, "m", 4),
           TopicPartition("t", 0): OffsetAndMetadata(3)}


@pytest.mark.parametrize("version", [5, 6, 7, 8, 9])
def test_a_commit_carries_the_leader_epoch_from_v6_and_the_instance_id_from_v7(
    version: int,
) -> None:
    req = commit_request(version, "g", 3, "m-1", "i-1", OFFSETS)
    assert (req.group_id, req.generation_id_or_member_epoch, req.member_id) == ("g", 3, "m-1")
    assert req.group_instance_id == ("i-1" if version >= 7 else None)
    (topic,) = req.topics
    assert topic.name == "t"
    assert [(p.partition_index, p.committed_offset, p.committed_leader_epoch,
             p.committed_metadata) for p in topic.partitions] == [
        (0, 3, -1, ""), (1, 7, 4 if version >= 6 else -1, "m")]


@pytest.mark.parametrize("version", [6, 7, 8, 9])
def test_a_fetch_asks_per_group_from_v8_and_for_stable_offsets_from_v7(version: int) -> None:
    req = fetch_request(version, "g", [TopicPartition("t", 1), TopicPartition("u", 0),
                                       TopicPartition("t", 0)])
    assert req.require_stable is (version >= 7)
    if version >= 8:
        (group,) = req.groups
        assert group.group_id == "g"
        asked = [(t.name, t.partition_indexes) for t in group.topics]
        assert not req.topics
    else:
        assert req.group_id == "g" and not req.groups
        asked = [(t.name, t.partition_indexes) for t in req.topics]
    assert asked == [("t", (0, 1)), ("u", (0,))]


def test_an_answer_is_read_per_group_or_top_level_with_metadata_and_errors() -> None:
    per_group = of.OffsetFetchResponse(groups=(of.OffsetFetchResponseGroup(
        group_id="g", error_code=int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS), topics=(
            of.OffsetFetchResponseTopics(name="t", partitions=(
                of.OffsetFetchResponsePartitions(partition_index=0, committed_offset=5,
                                                 committed_leader_epoch=2, metadata="x"),
                of.OffsetFetchResponsePartitions(partition_index=1, committed_offset=-1,
                                                 error_code=int(ErrorCode.UNSTABLE_OFFSET_COMMIT)),
            )),)),))
    assert fetch_result(per_group) == (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, {
        TopicPartition("t", 0): (OffsetAndMetadata(5, "x", 2), ErrorCode.NONE),
        TopicPartition("t", 1): (None, ErrorCode.UNSTABLE_OFFSET_COMMIT)})
    top_level = of.OffsetFetchResponse(error_code=int(ErrorCode.NOT_COORDINATOR), topics=(
        of.OffsetFetchResponseTopic(name="t", partitions=(
            of.OffsetFetchResponsePartition(partition_index=3, committed_offset=9,
                                            metadata=None),)),))
    assert fetch_result(top_level) == (ErrorCode.NOT_COORDINATOR, {
        TopicPartition("t", 3): (OffsetAndMetadata(9, "", -1), ErrorCode.NONE)})
