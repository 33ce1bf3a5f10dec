"""pipeline.util.backoff: exponential, capped, jittered retry delays."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.util.backoff import Backoff


def test_exact_sequence_without_jitter() -> None:
    b = Backoff(0.1, 1.0, 2.0, 0.0, rng=random.Random(0))
    assert [b.delay(a) for a in range(1, 8)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    assert [b.base(a) for a in range(1, 8)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]


def test_exact_sequence_other_multiplier() -> None:
    b = Backoff(1, 100, multiplier=3, jitter=0, rng=random.Random(0))
    assert [b.delay(a) for a in range(1, 8)] == [1.0, 3.0, 9.0, 27.0, 81.0, 100.0, 100.0]


def test_defaults_are_doubling_with_20_percent_jitter() -> None:
    b = Backoff(0.1, 10.0, rng=random.Random(0))
    assert (b.multiplier, b.jitter) == (2.0, 0.2)
    assert [b.base(a) for a in (1, 2, 3)] == [0.1, 0.2, 0.4]


def test_jitter_zero_never_touches_the_rng() -> None:
    rng = random.Random(0)
    state = rng.getstate()
    b = Backoff(0.1, 1.0, jitter=0, rng=rng)
    for a in range(1, 50):
        b.delay(a)
    assert rng.getstate() == state


def test_first_attempt_is_about_initial() -> None:
    b = Backoff(0.1, 1.0, jitter=0.2, rng=random.Random(1))
    delays = [b.delay(1) for _ in range(500)]
    assert all(0.08 <= d <= 0.12 for d in delays)
    assert min(delays) < 0.09
    assert max(delays) > 0.11


def test_bounds_with_jitter() -> None:
    initial, maximum, mult, jitter = 0.05, 3.0, 2.0, 0.25
    b = Backoff(initial, maximum, mult, jitter, rng=random.Random(2))
    for attempt in range(1, 15):
        base = min(maximum, initial * mult ** (attempt - 1))
        delays = [b.delay(attempt) for _ in range(300)]
        assert all(
            base * (1 - jitter) - 1e-12 <= d <= min(maximum, base * (1 + jitter)) for d in delays
        )
        assert len(set(delays)) > 100  # really jittered, not a constant


def test_cap_is_a_hard_ceiling_and_keeps_jitter_below_it() -> None:
    b = Backoff(0.1, 1.0, jitter=0.2, rng=random.Random(3))
    delays = [b.delay(30) for _ in range(1000)]
    assert max(delays) == 1.0
    assert min(delays) >= 0.8
    assert 350 < sum(d == 1.0 for d in delays) < 650  # ~half hit the cap (Java's behaviour)
    assert min(delays) < 0.85


def test_huge_attempts_do_not_overflow() -> None:
    for jitter in (0.0, 0.2):
        b = Backoff(0.001, 5.0, multiplier=10.0, jitter=jitter, rng=random.Random(0))
        assert 4.0 <= b.delay(10**6) <= 5.0
        assert b.base(10**9) == 5.0


def test_one_uniform_draw_per_delay() -> None:
    b = Backoff(0.1, 100.0, 2.0, 0.3, rng=random.Random(99))
    mirror = random.Random(99)
    for attempt in (1, 2, 3, 4, 5):
        expected = 0.1 * 2.0 ** (attempt - 1) * mirror.uniform(0.7, 1.3)
        assert b.delay(attempt) == pytest.approx(expected, rel=1e-12)


def test_deterministic_under_a_seeded_rng() -> None:
    def schedule(seed: int) -> list[float]:
        b = Backoff(0.1, 2.0, rng=random.Random(seed))
        return [b.delay(a) for a in range(1, 20)]

    assert schedule(7) == schedule(7)
    assert schedule(7) != schedule(8)


def test_degenerate_but_valid_configurations() -> None:
    rng = random.Random(0)
    assert {
        Backoff(0.5, 5.0, multiplier=1.0, jitter=0, rng=rng).delay(a) for a in range(1, 60)
    } == {0.5}
    assert {Backoff(0.0, 5.0, rng=rng).delay(a) for a in range(1, 60)} == {0.0}
    assert {Backoff(0.3, 0.3, jitter=0, rng=rng).delay(a) for a in range(1, 60)} == {0.3}
    full = Backoff(1.0, 100.0, jitter=1.0, rng=rng)
    assert all(0.0 <= full.delay(1) <= 2.0 for _ in range(200))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"initial": -0.1}, "initial must be >= 0"),
        ({"initial": 2.0, "maximum": 1.0}, r"maximum must be >= initial.*maximum=1.0.*initial=2.0"),
        ({"multiplier": 0.5}, "multiplier must be >= 1"),
        ({"multiplier": 0}, "multiplier must be >= 1"),
        ({"jitter": -0.1}, r"jitter must be in \[0, 1\]"),
        ({"jitter": 1.5}, r"jitter must be in \[0, 1\]"),
        ({"initial": math.nan}, "initial must be finite"),
        ({"maximum": math.inf}, "maximum must be finite"),
        ({"multiplier": math.inf}, "multiplier must be finite"),
        ({"jitter": math.nan}, "jitter must be finite"),
    ],
)
def test_invalid_arguments_are_value_errors(kwargs: dict[str, float], match: str) -> None:
    args: dict[str, Any] = {"initial": 0.1, "maximum": 1.0, **kwargs}
    with pytest.raises(ValueError, match=match):
        Backoff(**args, rng=random.Random(0))


@pytest.mark.parametrize("bad", ["0.1", None, True])
def test_non_numbers_are_type_errors(bad: Any) -> None:
    with pytest.raises(TypeError, match="initial must be a number"):
        Backoff(bad, 1.0, rng=random.Random(0))


def test_rng_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        Backoff(0.1, 1.0, 2.0, 0.2, random.Random(0))  # type: ignore[call-arg]


@pytest.mark.parametrize("attempt", [0, -1])
def test_attempts_start_at_one(attempt: int) -> None:
    b = Backoff(0.1, 1.0, rng=random.Random(0))
    with pytest.raises(ValueError, match="start at 1"):
        b.delay(attempt)


@pytest.mark.parametrize("attempt", [1.0, "2", True])
def test_attempt_must_be_an_int(attempt: Any) -> None:
    b = Backoff(0.1, 1.0, rng=random.Random(0))
    with pytest.raises(TypeError, match="attempt must be an int"):
        b.delay(attempt)


def test_repr() -> None:
    assert repr(Backoff(0.1, 1, rng=random.Random(0))) == (
        "Backoff(initial=0.1, maximum=1.0, multiplier=2.0, jitter=0.2)"
    )


@settings(max_examples=300, deadline=None, database=None)
@given(
    initial=st.one_of(st.just(0.0), st.floats(1e-6, 10.0)),
    span=st.floats(1.0, 1000.0),
    multiplier=st.floats(1.0, 10.0),
    jitter=st.floats(0.0, 1.0),
    attempt=st.integers(1, 10_000),
    seed=st.integers(0, 2**32),
)
def test_delay_property(
    initial: float, span: float, multiplier: float, jitter: float, attempt: int, seed: int
) -> None:
    maximum = initial * span
    b = Backoff(initial, maximum, multiplier, jitter, rng=random.Random(seed))
    if initial == 0:
        expected = 0.0
    elif multiplier == 1 or (attempt - 1) * math.log(multiplier) < math.log(maximum / initial):
        expected = min(maximum, initial * multiplier ** (attempt - 1))
    else:
        expected = maximum
    base = b.base(attempt)
    assert base == pytest.approx(expected, rel=1e-9)
    d = b.delay(attempt)
    assert 0.0 <= d <= maximum
    assert base * (1 - jitter) * (1 - 1e-12) <= d <= base * (1 + jitter) * (1 + 1e-12)
