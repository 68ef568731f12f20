"""How many bytes a prefetcher keeps in flight over its link (spoke layer, pure Python).

A window sized from the throughput measured through that same window never grows: with
``w`` bytes in flight over a round trip ``rtt`` a link of rate ``r`` delivers at most
``min(r, w / rtt)``, and a window of that rate times a lead time is about the window again
(the spoke's stayed near 20 MB/s of a 100 MB/s, 40 ms link in ``bench/train_stall.py``).
So ``Window`` probes for the bandwidth-delay product the way TCP's slow start and BBR's
startup do:

- **rounds**: a round lasts until a fetch sent after it began completes (about one round
  trip, as BBR's); its rate is the bytes that completed in it over its length, so all
  the fetches in flight count, each once. The first round began with nothing in flight
  (its rate is one fetch's), so it only starts the count;
- **startup**: the window doubles every round while the round's rate still grows by a
  quarter over the best round before it; three rounds without such growth and the rate
  is the link's (or the plan has no more to send): startup ends;
- **steady**: the window is ``GAIN`` times the last window whose round still grew the
  rate: below the bandwidth-delay product the rate doubles with the window, above it
  not at all, so that window is 0.8-1.6 times the product, and the window 1.2-2.4 times
  it. The round trip (``rtt``, for reports) is that window over its round's rate, by
  Little's law. Every ``FILTER_S`` the probe runs again from that window, so a link that
  got faster (or a plan with more to send) is found.

Not from a round trip measured per fetch: a fetch's time includes the queue behind the
window's own bytes, so a window sized from it feeds itself.

The window never exceeds ``cap`` (the part of the cache a plan's look-ahead may fill: a
window beyond it would prefetch what eviction must then drop) and never falls below
``floor`` (or ``cap``, when that is smaller).
"""

from __future__ import annotations

from collections import deque

from ..errors import InvalidArgument

GAIN = 1.5
GROWTH = 1.25  # a round's rate this much above the best before it: startup goes on
FULL_ROUNDS = 3  # rounds without such growth: the link is full
FILTER_S = 10.0  # how long a rate counts for the filter, and how often the probe runs


class Window:
    """The bytes to keep in flight: probed up in startup, then held near the product."""

    def __init__(self, *, floor: int, cap: int) -> None:
        if floor <= 0 or cap <= 0:
            raise InvalidArgument("a prefetch window's floor and cap must be positive")
        self.floor, self.cap = floor, cap
        self.startup = True
        self._probe = floor  # the window rounds run with in startup
        self._round_began: float | None = None
        self._rounds = 0
        self._delivered = 0  # bytes completed in the current round
        self._best = 0.0  # the best round's rate in this startup
        self._full = floor  # the last window whose round grew the rate
        self._full_rate = 0.0  # ...and that round's rate
        self._flat = 0  # startup rounds in a row without GROWTH
        self._steady_since = 0.0
        self._rates: deque[tuple[float, float]] = deque()  # (when, rate)

    @property
    def rate(self) -> float:
        """The highest round's rate within ``FILTER_S`` (bytes/s; 0 before any)."""
        return max((rate for _, rate in self._rates), default=0.0)

    @property
    def rtt(self) -> float | None:
        """The round trip the probe found: its window over its rate (None before one)."""
        return self._full / self._full_rate if self._full_rate else None

    def record(self, start: float, end: float, size: int) -> None:
        """A fetch of ``size`` bytes, sent at ``start``, complete at ``end``."""
        if self._round_began is None:
            self._round_began = start
        self._delivered += size
        if start >= self._round_began and end > self._round_began:
            self._end_round(end, self._delivered / (end - self._round_began))
        if not self.startup and end - self._steady_since > FILTER_S:
            self.startup, self._probe, self._best, self._flat = True, self._full, 0.0, 0

    def _end_round(self, now: float, rate: float) -> None:
        self._rounds += 1
        self._round_began, self._delivered = now, 0
        if self._rounds == 1:  # it began with nothing in flight
            return
        self._rates.append((now, rate))
        while self._rates[0][0] < now - FILTER_S:
            self._rates.popleft()
        if not self.startup:
            return
        if rate >= self._best * GROWTH:
            self._best, self._flat = rate, 0
            self._full, self._full_rate = self._probe, rate
            self._probe = min(2 * self._probe, self.cap)
        else:
            self._flat += 1
            if self._flat >= FULL_ROUNDS:
                self.startup, self._steady_since = False, now

    def size(self) -> int:
        """The window now, in bytes."""
        want = self._probe if self.startup else int(GAIN * self._full)
        return max(min(self.floor, self.cap), min(want, self.cap))
