"""Backing off (core.retry): only errors that say a retry can help are retried soon, the
wait grows with failures in a row up to its bound, and a success forgets them."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from loomfs.core.retry import Backoff, retryable
from loomfs.errors import ALL_ERRORS, BackendUnavailable, LoomError, NotFound


@settings(max_examples=50, deadline=None)
@given(first=st.floats(0.01, 10), longest=st.floats(10, 600), failures=st.integers(1, 40))
def test_waits_grow_within_their_bounds(first: float, longest: float, failures: int) -> None:
    now = [0.0]
    backoff: Backoff[str] = Backoff(first, longest, clock=lambda: now[0])
    waits = [backoff.failed("k", BackendUnavailable("down")) for _ in range(failures)]
    for n, wait in enumerate(waits, start=1):
        floor = min(first * 2 ** (n - 1), longest)
        assert floor <= wait <= min(floor + first, longest)  # jitter of at most `first`
    assert not backoff.ready("k") and backoff.ready("other")
    now[0] = waits[-1]
    assert backoff.ready("k")
    backoff.succeeded("k")
    assert backoff.failures("k") == 0


@settings(max_examples=20, deadline=None)
@given(cls=st.sampled_from(ALL_ERRORS))
def test_only_retryable_errors_come_back_soon(cls: type[LoomError]) -> None:
    backoff: Backoff[str] = Backoff(1.0, 300.0, clock=lambda: 0.0)
    wait = backoff.failed("k", cls("x"))
    assert retryable(cls("x")) == cls.retryable
    assert (wait <= 2.0) if cls.retryable else (wait == 300.0)


def test_what_is_not_a_loom_error_is_not_retried() -> None:
    assert not retryable(ValueError("a bug"))
    assert not retryable(NotFound("gone"))
