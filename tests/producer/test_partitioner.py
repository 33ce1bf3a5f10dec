"""pipeline.producer._stages.partitioner: Java-compatible murmur2 and the partitioners."""

from __future__ import annotations

import enum
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pipeline.producer._stages.partitioner import (
    PARTITIONER_NAMES,
    CallablePartitioner,
    DefaultPartitioner,
    Murmur2Partitioner,
    Partitioner,
    RandomPartitioner,
    RoundRobinPartitioner,
    java_positive,
    make_partitioner,
    murmur2,
)

FIXTURE = Path(__file__).parent / "fixtures" / "murmur2-vectors.json"
VECTORS: list[tuple[bytes, int]] = [
    (v["key_utf8"].encode("utf-8"), v["murmur2"])
    for v in json.loads(FIXTURE.read_text(encoding="utf-8"))["vectors"]
]
VECTOR_IDS = [key.decode() for key, _ in VECTORS]


def reference_murmur2(data: bytes) -> int:
    """Byte-by-byte transcription of Java's Utils.murmur2 with int32 wraparound."""

    def i32(x: int) -> int:
        x &= 0xFFFFFFFF
        return x - (1 << 32) if x >= 1 << 31 else x

    def ushr(x: int, n: int) -> int:  # Java's >>>
        return (x & 0xFFFFFFFF) >> n

    length = len(data)
    m = 0x5BD1E995
    h = i32(0x9747B28C ^ length)
    for i in range(length // 4):
        i4 = i * 4
        k = data[i4] + (data[i4 + 1] << 8) + (data[i4 + 2] << 16) + (data[i4 + 3] << 24)
        k = i32(k)
        k = i32(k * m)
        k ^= ushr(k, 24)
        k = i32(k * m)
        h = i32(h * m)
        h = i32(h ^ k)
    rem = length % 4
    base = length & ~3
    if rem == 3:
        h = i32(h ^ (data[base + 2] << 16))
    if rem >= 2:
        h = i32(h ^ (data[base + 1] << 8))
    if rem >= 1:
        h = i32(h ^ data[base])
        h = i32(h * m)
    h = i32(h ^ ushr(h, 13))
    h = i32(h * m)
    h = i32(h ^ ushr(h, 15))
    return h


# --------------------------------------------------------------------------- murmur2


def test_fixture_is_the_kafka_vector_set() -> None:
    assert len(VECTORS) >= 6
    assert (b"21", -973932308) in VECTORS


@pytest.mark.parametrize(("key", "expected"), VECTORS, ids=VECTOR_IDS)
def test_murmur2_matches_java_vectors(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


@pytest.mark.parametrize(("key", "expected"), VECTORS, ids=VECTOR_IDS)
def test_reference_implementation_matches_java_vectors(key: bytes, expected: int) -> None:
    # Guards the oracle used by the property test below.
    assert reference_murmur2(key) == expected


@pytest.mark.parametrize(("key", "expected"), VECTORS, ids=VECTOR_IDS)
def test_murmur2_accepts_bytes_like(key: bytes, expected: int) -> None:
    assert murmur2(bytearray(key)) == expected
    assert murmur2(memoryview(key)) == expected


@settings(max_examples=500, deadline=None, database=None)
@given(st.binary(max_size=64))
@example(b"")
@example(b"\xff")
@example(b"\xff\xff")
@example(b"\xff\xff\xff")
@example(b"\xff" * 4)
@example(b"\x80" * 7)
def test_murmur2_matches_reference(data: bytes) -> None:
    h = murmur2(data)
    assert h == reference_murmur2(data)
    assert -(2**31) <= h < 2**31


@pytest.mark.parametrize("length", [255, 256, 257, 260, 1000, 4099])
def test_murmur2_long_keys_match_reference(length: int) -> None:
    # Past the precompiled unpackers (keys > 256 bytes) and the hash cache limit.
    data = random.Random(length).randbytes(length)
    assert murmur2(data) == reference_murmur2(data)


def test_java_positive() -> None:
    assert java_positive(-973932308) == -973932308 & 0x7FFFFFFF == 1173551340
    assert java_positive(479470107) == 479470107
    assert java_positive(-(2**31)) == 0
    assert java_positive(-1) == 0x7FFFFFFF


# --------------------------------------------------------------------------- Default


def java_default_partition(java_murmur2: int, n: int) -> int:
    """Utils.toPositive(Utils.murmur2(keyBytes)) % numPartitions, from the vector value."""
    return (java_murmur2 & 0x7FFFFFFF) % n


@pytest.mark.parametrize("n", [6, 10])
@pytest.mark.parametrize(("key", "java_hash"), VECTORS, ids=VECTOR_IDS)
def test_default_partitioner_keyed_matches_java(key: bytes, java_hash: int, n: int) -> None:
    rng = random.Random(0)
    state = rng.getstate()
    for cache_size in (4096, 0):
        p = DefaultPartitioner(rng, key_hash_cache_size=cache_size)
        expected = java_default_partition(java_hash, n)
        assert p.partition("t", key, b"value", n) == expected
        assert p.partition("t", key, None, n) == expected  # value is irrelevant
        assert p.partition("other", key, b"v", n) == expected  # so is the topic
        # bytearray keys work too (unhashable, so they bypass the cache)
        assert p.partition("t", bytearray(key), None, n) == expected  # type: ignore[arg-type]
    assert rng.getstate() == state  # keyed records never consume randomness


def test_default_partitioner_known_values() -> None:
    # The vector hashes reduced by hand: 21 -> 1173551340, foobar -> 1357151166, ...
    p = DefaultPartitioner(random.Random(0))
    got6 = [p.partition("t", k, None, 6) for k, _ in VECTORS]
    got10 = [p.partition("t", k, None, 10) for k, _ in VECTORS]
    assert got6 == [java_default_partition(h, 6) for _, h in VECTORS]
    assert got10 == [java_default_partition(h, 10) for _, h in VECTORS]
    assert got10[:2] == [0, 6]  # 1173551340 % 10, 1357151166 % 10


def test_default_partitioner_empty_key_is_a_key_not_null() -> None:
    rng = random.Random(0)
    p = DefaultPartitioner(rng)
    state = rng.getstate()
    expected = java_positive(murmur2(b"")) % 7
    assert [p.partition("t", b"", None, 7) for _ in range(5)] == [expected] * 5
    assert rng.getstate() == state
    assert p.sticky_partition("t") is None


def test_default_partitioner_cache_is_transparent() -> None:
    data = random.Random(1)
    keys = [data.randbytes(data.randrange(0, 40)) for _ in range(300)] * 3
    keys += [data.randbytes(2000)]  # longer than the cacheable limit
    cached = DefaultPartitioner(random.Random(0), key_hash_cache_size=16)
    uncached = DefaultPartitioner(random.Random(0), key_hash_cache_size=0)
    for key in keys:
        expected = java_positive(reference_murmur2(key)) % 12
        assert cached.partition("t", key, None, 12) == expected
        assert uncached.partition("t", key, None, 12) == expected


def test_default_partitioner_rejects_negative_cache_size() -> None:
    with pytest.raises(ValueError, match="key_hash_cache_size"):
        DefaultPartitioner(random.Random(0), key_hash_cache_size=-1)


def test_sticky_partition_holds_until_on_new_batch() -> None:
    p = DefaultPartitioner(random.Random(3))
    assert p.sticky_partition("t") is None
    first = p.partition("t", None, b"v", 8)
    assert p.sticky_partition("t") == first
    assert {p.partition("t", None, b"v", 8) for _ in range(100)} == {first}

    p.on_new_batch("t", 8, first)
    second = p.partition("t", None, b"v", 8)
    assert second != first
    assert {p.partition("t", None, None, 8) for _ in range(100)} == {second}


def test_on_new_batch_for_a_non_sticky_partition_is_a_noop() -> None:
    rng = random.Random(3)
    p = DefaultPartitioner(rng)
    sticky = p.partition("t", None, None, 8)
    state = rng.getstate()
    for other in range(8):
        if other != sticky:
            p.on_new_batch("t", 8, other)  # e.g. a keyed batch sealed on another partition
    assert p.partition("t", None, None, 8) == sticky
    assert rng.getstate() == state


def test_sticky_changes_always_to_a_different_partition_and_covers_all() -> None:
    p = DefaultPartitioner(random.Random(11))
    current = p.partition("t", None, None, 5)
    seen = Counter[int]()
    for _ in range(2000):
        p.on_new_batch("t", 5, current)
        nxt = p.partition("t", None, None, 5)
        assert nxt != current
        assert 0 <= nxt < 5
        seen[nxt] += 1
        current = nxt
    assert set(seen) == set(range(5))
    assert min(seen.values()) > 300  # roughly uniform (expected 400 each)


def test_sticky_is_deterministic_under_a_seeded_rng() -> None:
    def run(seed: int) -> list[int]:
        p = DefaultPartitioner(random.Random(seed))
        out = []
        for i in range(50):
            topic = f"t{i % 3}"
            part = p.partition(topic, None, None, 9)
            out.append(part)
            if i % 4 == 0:
                p.on_new_batch(topic, 9, part)
        return out

    assert run(42) == run(42)
    assert run(42) != run(43)


def test_sticky_is_per_topic() -> None:
    p = DefaultPartitioner(random.Random(5))
    a = p.partition("a", None, None, 1000)
    b = p.partition("b", None, None, 1000)
    p.on_new_batch("a", 1000, a)
    assert p.partition("a", None, None, 1000) != a
    assert p.partition("b", None, None, 1000) == b


def test_sticky_single_partition_stays_zero() -> None:
    p = DefaultPartitioner(random.Random(9))
    for _ in range(20):
        assert p.partition("t", None, None, 1) == 0
        p.on_new_batch("t", 1, 0)
    assert p.partition("t", None, None, 1) == 0


def test_on_new_batch_before_any_record_picks_a_partition() -> None:
    p = DefaultPartitioner(random.Random(2))
    p.on_new_batch("t", 4, 2)  # Java: no sticky yet -> choose one (avoiding prev)
    assert p.sticky_partition("t") in {0, 1, 3}


def test_sticky_is_rechosen_when_the_topic_shrinks() -> None:
    p = DefaultPartitioner(random.Random(0))
    while p.partition("t", None, None, 10) < 5:
        p.on_new_batch("t", 10, p.partition("t", None, None, 10))
    assert 0 <= p.partition("t", None, None, 5) < 5


# --------------------------------------------------------------------------- others


@pytest.mark.parametrize(("key", "java_hash"), VECTORS, ids=VECTOR_IDS)
def test_murmur2_partitioner_keyed_matches_java(key: bytes, java_hash: int) -> None:
    for random_null_keys in (True, False):
        p = Murmur2Partitioner(random.Random(0), random_null_keys=random_null_keys)
        for n in (6, 10):
            assert p.partition("t", key, None, n) == java_default_partition(java_hash, n)


def test_murmur2_random_null_keys_use_the_injected_rng() -> None:
    p = Murmur2Partitioner(random.Random(77))
    mirror = random.Random(77)
    got = [p.partition("t", None, None, 6) for _ in range(200)]
    assert got == [mirror.randrange(6) for _ in range(200)]
    assert set(got) == set(range(6))
    p.on_new_batch("t", 6, got[-1])  # no-op
    assert p.partition("t", None, None, 6) == mirror.randrange(6)


def test_murmur2_non_random_null_keys_map_to_one_partition() -> None:
    rng = random.Random(1)
    state = rng.getstate()
    p = Murmur2Partitioner(rng, random_null_keys=False)
    expected = java_positive(murmur2(b"")) % 6
    assert {p.partition("t", None, None, 6) for _ in range(50)} == {expected}
    assert rng.getstate() == state


def test_round_robin_cycles_per_topic() -> None:
    p = RoundRobinPartitioner()
    assert [p.partition("a", None, None, 3) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    # another topic has its own counter, starting at 0; keys are ignored
    assert [p.partition("b", b"k", None, 4) for _ in range(5)] == [0, 1, 2, 3, 0]
    assert p.partition("a", b"key", None, 3) == 1
    p.on_new_batch("a", 3, 1)  # no-op: does not skip
    assert p.partition("a", None, None, 3) == 2


def test_round_robin_follows_partition_count_changes() -> None:
    p = RoundRobinPartitioner()
    assert [p.partition("a", None, None, 2) for _ in range(3)] == [0, 1, 0]
    assert [p.partition("a", None, None, 5) for _ in range(3)] == [3, 4, 0]


def test_random_partitioner_uses_the_injected_rng() -> None:
    p = RandomPartitioner(random.Random(1234))
    mirror = random.Random(1234)
    got = [p.partition("t", b"key", b"v", 10) for _ in range(300)]
    assert got == [mirror.randrange(10) for _ in range(300)]
    assert set(got) == set(range(10))  # keys are ignored


# --------------------------------------------------------------------------- callable


def test_callable_partitioner_passes_arguments_and_result() -> None:
    calls: list[tuple[str, bytes | None, bytes | None, int]] = []

    def fn(topic: str, key: bytes | None, value: bytes | None, n: int) -> int:
        calls.append((topic, key, value, n))
        return n - 1

    p = CallablePartitioner(fn)
    assert p.partition("t", b"k", b"v", 4) == 3
    assert calls == [("t", b"k", b"v", 4)]
    assert "fn" in p.name


@pytest.mark.parametrize("bad", [4, 5, -1, 1000])
def test_callable_partitioner_out_of_range_is_a_clear_value_error(bad: int) -> None:
    p = CallablePartitioner(lambda t, k, v, n: bad, name="my-partitioner")
    with pytest.raises(ValueError, match="partition") as info:
        p.partition("orders", b"k", None, 4)
    msg = str(info.value)
    assert "'my-partitioner'" in msg
    assert "'orders'" in msg
    assert str(bad) in msg
    assert "0 <= partition < 4" in msg


@pytest.mark.parametrize("bad", [1.0, "1", None, True, False])
def test_callable_partitioner_non_int_is_a_type_error(bad: object) -> None:
    def fn(topic: str, key: bytes | None, value: bytes | None, n: int) -> Any:
        return bad

    p = CallablePartitioner(fn)
    with pytest.raises(TypeError, match="'orders'") as info:
        p.partition("orders", None, None, 4)
    assert repr(bad) in str(info.value)
    assert "fn" in str(info.value)


def test_callable_partitioner_accepts_int_subclasses() -> None:
    class P(enum.IntEnum):
        TWO = 2

    p = CallablePartitioner(lambda t, k, v, n: P.TWO)
    got = p.partition("t", None, None, 3)
    assert got == 2
    assert type(got) is int


def test_callable_partitioner_forwards_on_new_batch() -> None:
    hooks: list[tuple[str, int, int]] = []
    p = CallablePartitioner(
        lambda t, k, v, n: 0, on_new_batch=lambda t, n, prev: hooks.append((t, n, prev))
    )
    p.on_new_batch("t", 3, 0)
    assert hooks == [("t", 3, 0)]
    CallablePartitioner(lambda t, k, v, n: 0).on_new_batch("t", 3, 0)  # no hook: no-op


def test_callable_partitioner_requires_a_callable() -> None:
    with pytest.raises(TypeError, match="callable"):
        CallablePartitioner(42)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- common


def all_builtins() -> list[Partitioner]:
    rng = random.Random(0)
    return [
        DefaultPartitioner(rng),
        Murmur2Partitioner(rng),
        Murmur2Partitioner(rng, random_null_keys=False),
        RoundRobinPartitioner(),
        RandomPartitioner(rng),
        CallablePartitioner(lambda t, k, v, n: 0),
    ]


@pytest.mark.parametrize("p", all_builtins(), ids=lambda p: type(p).__name__)
@pytest.mark.parametrize("n", [0, -1])
def test_bad_partition_count_is_a_value_error(p: Partitioner, n: int) -> None:
    with pytest.raises(ValueError, match=f"num_partitions={n}"):
        p.partition("t", b"k", None, n)
    with pytest.raises(ValueError, match=f"num_partitions={n}"):
        p.partition("t", None, None, n)


@pytest.mark.parametrize("p", all_builtins(), ids=lambda p: type(p).__name__)
def test_builtins_satisfy_the_protocol_and_stay_in_range(p: Partitioner) -> None:
    assert isinstance(p, Partitioner)
    data = random.Random(8)
    for n in (1, 2, 3, 7, 100):
        for _ in range(50):
            key = None if data.random() < 0.5 else data.randbytes(data.randrange(20))
            part = p.partition("t", key, None, n)
            assert 0 <= part < n
            p.on_new_batch("t", n, part)


# --------------------------------------------------------------------------- factory


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("default", DefaultPartitioner),
        ("murmur2", Murmur2Partitioner),
        ("murmur2_random", Murmur2Partitioner),
        ("round_robin", RoundRobinPartitioner),
        ("random", RandomPartitioner),
        ("Round-Robin", RoundRobinPartitioner),
    ],
)
def test_make_partitioner_by_name(name: str, cls: type) -> None:
    assert type(make_partitioner(name, random.Random(0))) is cls


def test_partitioner_names_are_all_accepted() -> None:
    for name in PARTITIONER_NAMES:
        assert isinstance(make_partitioner(name, random.Random(0)), Partitioner)


def test_make_partitioner_murmur2_variants_differ_on_null_keys() -> None:
    plain = make_partitioner("murmur2", random.Random(0))
    rand = make_partitioner("murmur2_random", random.Random(0))
    assert len({plain.partition("t", None, None, 50) for _ in range(30)}) == 1
    assert len({rand.partition("t", None, None, 50) for _ in range(30)}) > 1


def test_make_partitioner_default_uses_the_given_rng() -> None:
    a = make_partitioner("default", random.Random(5))
    b = make_partitioner("default", random.Random(5))
    assert a.partition("t", None, None, 1000) == b.partition("t", None, None, 1000)


def test_make_partitioner_unknown_name_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="unknown partitioner 'sticky'") as info:
        make_partitioner("sticky", random.Random(0))
    for name in PARTITIONER_NAMES:
        assert name in str(info.value)


def test_make_partitioner_returns_builtin_instances_unchanged() -> None:
    for p in all_builtins():
        assert make_partitioner(p, random.Random(0)) is p


def test_make_partitioner_wraps_a_callable_with_validation() -> None:
    p = make_partitioner(lambda t, k, v, n: 7, random.Random(0))
    assert isinstance(p, CallablePartitioner)
    assert p.partition("t", None, None, 8) == 7
    with pytest.raises(ValueError, match="returned partition 7"):
        p.partition("t", None, None, 3)


def test_make_partitioner_wraps_foreign_partitioner_objects() -> None:
    class OnlyPartition:
        def partition(self, topic: str, key: bytes | None, value: bytes | None, n: int) -> int:
            return 5

    class WithHook(OnlyPartition):
        def __init__(self) -> None:
            self.hooks: list[tuple[str, int, int]] = []

        def on_new_batch(self, topic: str, num_partitions: int, prev_partition: int) -> None:
            self.hooks.append((topic, num_partitions, prev_partition))

    p = make_partitioner(OnlyPartition(), random.Random(0))  # type: ignore[arg-type]
    assert p.partition("t", None, None, 6) == 5
    p.on_new_batch("t", 6, 5)  # adapted: no-op
    with pytest.raises(ValueError, match="OnlyPartition"):
        p.partition("t", None, None, 2)

    user = WithHook()
    q = make_partitioner(user, random.Random(0))
    assert q.partition("t", None, None, 6) == 5
    q.on_new_batch("t", 6, 5)
    assert user.hooks == [("t", 6, 5)]


def test_make_partitioner_rejects_other_types() -> None:
    with pytest.raises(TypeError, match="partitioner must be"):
        make_partitioner(42, random.Random(0))  # type: ignore[arg-type]
