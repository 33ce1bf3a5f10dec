"""Exponential, capped, jittered retry backoff (KIP-580 style; pure, rng injected).

The one backoff formula of the library: the producer's retries
(``pipeline.producer``) and the cluster client's reconnects and metadata
retries (``pipeline.cluster``) both use it, with the same ``retry_backoff``,
``retry_backoff_max`` and ``retry_backoff_jitter`` options.

``Backoff(initial, maximum, multiplier, jitter, rng=rng).delay(attempt)`` mirrors
the Java client's ``ExponentialBackoff.backoff(attempts - 1)``::

    base  = initial * multiplier ** (attempt - 1)       # attempt 1 -> initial
    delay = min(maximum, base * uniform(1 - jitter, 1 + jitter))

so ``maximum`` is a hard ceiling (as in Java) and, below the cap, delays are
spread +-``jitter`` around the exponential curve; once the curve reaches the cap
they spread over ``[maximum * (1 - jitter), maximum]`` (about half of them exactly
``maximum``).  Huge attempt numbers do not overflow.  With ``jitter == 0`` the
rng is never touched; otherwise each ``delay`` call draws exactly one
``rng.random()`` (the factor is ``1 - jitter + 2 * jitter * rng.random()``, so an
rng whose ``random()`` returns 0.5 gives the exact, un-jittered curve, and a
seeded rng a reproducible schedule).  Delays are seconds (any unit works;
nothing here reads a clock).
"""

from __future__ import annotations

import math
import random

__all__ = ["Backoff"]


class Backoff:
    """Retry delay schedule: ``delay(1)`` ~ ``initial``, multiplied by ``multiplier``
    per attempt, capped at ``maximum``, randomised by +-``jitter`` (a fraction).

    Raises ``ValueError`` on construction for: non-finite values, ``initial < 0``,
    ``maximum < initial``, ``multiplier < 1``, ``jitter`` outside ``[0, 1]``.
    """

    __slots__ = ("_max_exponent", "initial", "jitter", "maximum", "multiplier", "rng")

    def __init__(
        self,
        initial: float,
        maximum: float,
        multiplier: float = 2.0,
        jitter: float = 0.2,
        *,
        rng: random.Random,
    ) -> None:
        for name, value in (
            ("initial", initial),
            ("maximum", maximum),
            ("multiplier", multiplier),
            ("jitter", jitter),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"Backoff {name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"Backoff {name} must be finite, got {value!r}")
        if initial < 0:
            raise ValueError(f"Backoff initial must be >= 0, got {initial!r}")
        if maximum < initial:
            raise ValueError(
                f"Backoff maximum must be >= initial, got maximum={maximum!r} < initial={initial!r}"
            )
        if multiplier < 1:
            raise ValueError(f"Backoff multiplier must be >= 1, got {multiplier!r}")
        if not 0 <= jitter <= 1:
            raise ValueError(f"Backoff jitter must be in [0, 1], got {jitter!r}")
        self.initial = float(initial)
        self.maximum = float(maximum)
        self.multiplier = float(multiplier)
        self.jitter = float(jitter)
        self.rng = rng
        # Exponent at which the curve reaches ``maximum`` (Java's ``expMax``); from
        # there on the un-jittered delay is ``maximum`` and pow() is never asked to
        # overflow.  Infinite when the curve never grows (multiplier 1; initial 0 is
        # special-cased in base()).
        if self.initial == 0 or self.multiplier == 1:
            self._max_exponent = math.inf
        elif self.maximum == self.initial:
            self._max_exponent = 0.0
        else:
            self._max_exponent = math.log(self.maximum / self.initial) / math.log(self.multiplier)

    def base(self, attempt: int) -> float:
        """The un-jittered delay: ``min(maximum, initial * multiplier ** (attempt - 1))``."""
        if isinstance(attempt, bool) or not isinstance(attempt, int):
            raise TypeError(f"Backoff attempt must be an int, got {attempt!r}")
        if attempt < 1:
            raise ValueError(f"Backoff attempt numbers start at 1, got {attempt!r}")
        if self.initial == 0:
            return 0.0
        exponent = attempt - 1
        if exponent >= self._max_exponent:
            return self.maximum
        return min(self.maximum, self.initial * self.multiplier**exponent)

    def delay(self, attempt: int) -> float:
        """The delay before retry number ``attempt`` (1 = the first retry):
        ``min(maximum, base(attempt) * uniform(1 - jitter, 1 + jitter))``."""
        base = self.base(attempt)
        jitter = self.jitter
        if jitter == 0:
            return base
        return min(self.maximum, base * (1.0 - jitter + 2.0 * jitter * self.rng.random()))

    def __repr__(self) -> str:
        return (
            f"Backoff(initial={self.initial!r}, maximum={self.maximum!r}, "
            f"multiplier={self.multiplier!r}, jitter={self.jitter!r})"
        )
