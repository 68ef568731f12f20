"""When loomfs tries a failed call again, and how soon (core layer).

An error says whether trying again can help (``LoomError.retryable``: the link or a
volume is down, a copy of a chunk was damaged). Such an error is retried with exponential
backoff and jitter (tenacity's ``wait_exponential_jitter``), so spokes that lost their hub
together do not come back in step, and a path that keeps failing costs fewer requests the
longer it fails. Any other error (a refusal, an absence, a conflict) stands until something
changes: the caller remembers it rather than asking again, or, where it must keep asking
(a change feed), waits the longest interval.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from tenacity import RetryCallState, wait_exponential_jitter

from ..errors import LoomError

K = TypeVar("K", bound=Hashable)


def retryable(exc: BaseException) -> bool:
    """Whether trying the same call again can succeed without anyone acting."""
    return isinstance(exc, LoomError) and exc.retryable


class Backoff(Generic[K]):
    """For each key that failed: how many times in a row, and from when it may be tried
    again. The n-th failure in a row waits about ``first * 2**(n-1)`` (plus up to
    ``first`` of jitter), at most ``longest``; an error that is not retryable waits
    ``longest`` at once."""

    def __init__(
        self, first: float, longest: float, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.longest = longest
        self.clock = clock
        self._wait = wait_exponential_jitter(multiplier=first, max=longest, jitter=first)
        self._failures: dict[K, tuple[int, float]] = {}  # key -> (in a row, not before)

    def failed(self, key: K, exc: BaseException) -> float:
        """Count a failure of ``key``; the seconds until it may be tried again."""
        count = self._failures.get(key, (0, 0.0))[0] + 1
        delay = self.delay(count) if retryable(exc) else self.longest
        self._failures[key] = (count, self.clock() + delay)
        return delay

    def delay(self, failures: int) -> float:
        """The wait after ``failures`` failures in a row (jittered: each call differs)."""
        state = RetryCallState(None, None, (), {})  # type: ignore[arg-type]  # the wait reads the count only
        state.attempt_number = failures
        return float(self._wait(state))

    def ready(self, key: K) -> bool:
        """Whether ``key`` may be tried now (it never failed, or its wait is over)."""
        failure = self._failures.get(key)
        return failure is None or self.clock() >= failure[1]

    def failures(self, key: K) -> int:
        return self._failures.get(key, (0, 0.0))[0]

    def succeeded(self, key: K) -> None:
        self._failures.pop(key, None)
