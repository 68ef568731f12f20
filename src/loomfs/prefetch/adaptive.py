"""Eviction and prediction when no plan was published (spoke layer, pure Python, no I/O).

Without a plan the spoke cannot know the future, so it hedges. ``Forecast`` holds predictors
(sequential and stride within a file or directory, history of earlier runs) and the trust
each earned online; the spoke's prefetcher fetches what trusted ones expect. ``AdaptivePolicy``
weighs experts by online regret in the style of LeCaR and CACHEUS: LRU, LFU, and, when
predictors are given, an expert that evicts the least recently used key no trusted predictor
expects. Each expert keeps a ghost list of the keys it evicted; a miss on a ghost lowers that
expert's weight. When LRU is the best expert its weight goes to one and the policy behaves as
LRU, which is what keeps it from doing meaningfully worse than LRU.
"""

from __future__ import annotations

import itertools
import math
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Generator, Hashable, Iterator, Sequence

from ..errors import InvalidArgument
from .policy import EvictionPolicy, Key


class Predictor(ABC):
    """Guesses which keys follow an access."""

    @abstractmethod
    def observe(self, key: Key) -> list[Key]:
        """Record an access and return the keys expected next, nearest first."""


class StridePredictor(Predictor):
    """Sequential and strided reads within a group (a file's chunks, a directory's files).

    ``group`` maps a key to its file or directory; two equal steps in a row in one group
    predict the next ``depth`` keys along that stride.
    """

    def __init__(self, group: Callable[[Key], Hashable], depth: int = 8):
        self._group = group
        self._depth = depth
        self._last: dict[Hashable, tuple[Key, int]] = {}

    def observe(self, key: Key) -> list[Key]:
        group = self._group(key)
        previous = self._last.get(group)
        self._last[group] = (key, 0 if previous is None else key - previous[0])
        if previous is None or previous[1] == 0 or key - previous[0] != previous[1]:
            return []
        stride = previous[1]
        return [key + stride * step for step in range(1, self._depth + 1)]


class HistoryPredictor(Predictor):
    """Earlier runs over the same data: after a key, expect what followed it last time.

    Catches a job resumed mid-epoch from a checkpoint, and reruns with the same seed. At most
    ``capacity`` accesses are remembered; the older half is dropped when it is full.
    """

    def __init__(self, depth: int = 8, capacity: int = 1 << 20):
        if capacity < 2:
            raise InvalidArgument("history capacity must be at least 2")
        self._depth = depth
        self._capacity = capacity
        self._sequence: list[Key] = []
        self._where: dict[Key, int] = {}

    def observe(self, key: Key) -> list[Key]:
        index = self._where.get(key)
        guess = [] if index is None else self._sequence[index + 1 : index + 1 + self._depth]
        if len(self._sequence) >= self._capacity:
            self._sequence = self._sequence[self._capacity // 2 :]
            self._where = {seen: at for at, seen in enumerate(self._sequence)}
        self._where[key] = len(self._sequence)
        self._sequence.append(key)
        return guess


class SequentialPredictor(Predictor):
    """The next keys after each access: sibling files in name order, the next blocks of a
    file. Weaker evidence than a stride (one access suffices, so reads that several workers
    interleave still predict), which the trust of ``Forecast`` weighs."""

    def __init__(self, depth: int = 8):
        self._depth = depth

    def observe(self, key: Key) -> list[Key]:
        return [key + step for step in range(1, self._depth + 1)]


class _Track:
    """How often one predictor's guesses were read while still outstanding, decayed."""

    __slots__ = ("confirmed", "issued")

    def __init__(self) -> None:
        self.issued = 0.0
        self.confirmed = 0.0


class Forecast:
    """Predictors and the trust each has earned online: a guess read within ``window``
    accesses counts for the predictor that made it, one not read (or refuted: fetched
    and dropped unread) only counts as issued. A predictor is trusted after ``16``
    guesses of which at least ``min_precision`` were read, so a random order, which
    confirms few guesses, soon turns it down.

    The window is short because predictors look a few steps ahead: a longer one would
    credit a random guess that a whole epoch happens to read.
    """

    def __init__(
        self, predictors: Sequence[Predictor], *, window: int = 64, min_precision: float = 0.5
    ):
        if window < 1 or not 0 < min_precision <= 1:
            raise InvalidArgument("the guess window must be positive, precision in (0, 1]")
        self._predictors = list(predictors)
        self._tracks = [_Track() for _ in self._predictors]
        self._window = window
        self._min_precision = min_precision
        self._now = 0
        # outstanding guess -> (index of the predictor that made it, when), oldest first.
        self._guesses: OrderedDict[Key, tuple[int, int]] = OrderedDict()

    def __bool__(self) -> bool:
        return bool(self._predictors)

    @property
    def now(self) -> int:
        """Accesses observed so far."""
        return self._now

    def predictions(self) -> list[Key]:
        """Outstanding guesses of predictors that have been right lately, the one expected
        soonest first: the oldest (a predictor gives its guesses nearest first, and a later
        access guesses beyond the earlier ones)."""
        return [key for key, (which, _) in self._guesses.items() if self._trusted(which)]

    def expected(self, key: Key) -> bool:
        """Whether a trusted predictor expects ``key`` (and it was not read since)."""
        guessed = self._guesses.get(key)
        return guessed is not None and self._trusted(guessed[0])

    def outstanding(self, key: Key) -> bool:
        """Whether some predictor guessed ``key`` lately and it was not read since."""
        return key in self._guesses

    def refute(self, key: Key) -> None:
        """A guess fetched and dropped unread: it can no longer be confirmed."""
        self._guesses.pop(key, None)

    def _trusted(self, which: int) -> bool:
        track = self._tracks[which]
        return track.issued >= 16 and track.confirmed >= self._min_precision * track.issued

    def observe(self, key: Key) -> None:
        """An access: confirms the guess of it, expires old guesses, makes new ones."""
        self._now += 1
        guessed = self._guesses.pop(key, None)
        if guessed is not None:
            self._tracks[guessed[0]].confirmed += 1
        while self._guesses:
            oldest = next(iter(self._guesses.values()))
            if oldest[1] >= self._now - self._window:
                break
            self._guesses.popitem(last=False)
        for index, predictor in enumerate(self._predictors):
            track = self._tracks[index]
            for guess in predictor.observe(key):
                if guess not in self._guesses:
                    self._guesses[guess] = (index, self._now)
                    track.issued += 1
            # Forget slowly so a predictor that stops being right loses its trust.
            track.issued *= 0.999
            track.confirmed *= 0.999


class AdaptivePolicy(EvictionPolicy):
    """LeCaR-style regret-weighted choice between LRU, LFU and what predictors expect.

    ``learning_rate`` is LeCaR's lambda; a ghost hit found ``age`` requests after its eviction
    counts ``discount ** age``, with ``discount = 0.005 ** (1 / cached keys)`` as in LeCaR, so
    only regrets within about one cache turnover matter.

    Unlike LeCaR, which draws the expert at random by weight, the heaviest expert decides.
    On shuffled epochs the ghosts forget before keys return, so the weights hardly move, and a
    random draw keeps letting LRU evict the stable set LFU holds: in ``bench/cachesim.py --quick``
    (W4 random, 10% cache) drawing scored 0.005 and following the leader 0.06, LRU 0.004.
    """

    def __init__(
        self,
        predictors: Sequence[Predictor] = (),
        *,
        learning_rate: float = 0.45,
        min_precision: float = 0.5,
    ):
        super().__init__()
        if learning_rate <= 0:
            raise InvalidArgument("learning rate must be positive")
        self._forecast = Forecast(predictors, min_precision=min_precision)
        self._learning_rate = learning_rate
        # On equal weights the first wins: LFU, which resists the scans that epochs are.
        self._experts = ("lfu", "lru", "predicted") if self._forecast else ("lfu", "lru")
        self.weights = dict.fromkeys(self._experts, 1 / len(self._experts))
        self._recency: OrderedDict[Key, None] = OrderedDict()
        self._frequency: dict[Key, int] = {}
        # frequency -> keys with it, in order of their last access.
        self._buckets: dict[int, OrderedDict[Key, None]] = {}
        self._ghosts: dict[str, OrderedDict[Key, int]] = {
            name: OrderedDict() for name in self._experts
        }

    def predictions(self) -> list[Key]:
        """Outstanding guesses of predictors that have been right lately, soonest first."""
        return self._forecast.predictions()

    def _bump(self, key: Key, frequency: int) -> None:
        self._frequency[key] = frequency
        self._buckets.setdefault(frequency, OrderedDict())[key] = None

    def _unbump(self, key: Key) -> int:
        frequency = self._frequency.pop(key)
        bucket = self._buckets[frequency]
        del bucket[key]
        if not bucket:
            del self._buckets[frequency]
        return frequency

    def _on_insert(self, key: Key, prefetched: bool) -> None:
        self._recency[key] = None
        self._bump(key, 1)
        if prefetched:
            return
        self._forecast.observe(key)
        # An insert is a miss: a ghost hit means the expert that evicted this key was wrong.
        discount = 0.005 ** (1 / max(1, len(self)))
        for name, ghosts in self._ghosts.items():
            evicted_at = ghosts.pop(key, None)
            if evicted_at is not None:
                regret = discount ** (self._forecast.now - evicted_at)
                self.weights[name] *= math.exp(-self._learning_rate * regret)
        total = sum(self.weights.values())
        for name in self.weights:
            # A floor keeps a beaten expert able to win back the cache when the workload turns.
            self.weights[name] = max(self.weights[name] / total, 0.01)

    def _on_access(self, key: Key) -> None:
        self._forecast.observe(key)
        self._recency.move_to_end(key)
        self._bump(key, self._unbump(key) + 1)

    def _on_remove(self, key: Key) -> None:
        del self._recency[key]
        self._unbump(key)

    def _lfu_order(self) -> Iterator[Key]:
        # Among equally frequent keys the newest goes first: a key read once recently is a scan
        # or an epoch passing by, and keeping the older ones lets a loop bigger than the cache
        # hit on what stayed (plain LRU ties would make LFU miss every read of such a loop).
        for frequency in sorted(self._buckets):
            yield from reversed(self._buckets[frequency])

    def _order(self, name: str) -> Iterator[Key]:
        """Every cached key, best victim first, in the eyes of one expert."""
        if name == "lfu":
            return self._lfu_order()
        if name == "lru":
            return iter(self._recency)
        # What no trusted predictor expects goes first, least recently used first.
        return itertools.chain(
            (key for key in self._recency if not self._forecast.expected(key)),
            (key for key in self._recency if self._forecast.expected(key)),
        )

    def _victim_order(self) -> Generator[Key, None, None]:
        taken: set[Key] = set()
        limit = max(1, len(self))
        # Nothing the orders depend on changes until the base closes this generator, so each
        # expert's order is walked once however many victims one eviction needs.
        orders = {name: self._order(name) for name in self._experts}
        heads: dict[str, Key | None] = {}

        def head(name: str) -> Key | None:
            current = heads.get(name)
            if current is None or current in taken:
                usable = (k for k in orders[name] if k not in taken and k not in self._pinned)
                current = heads[name] = next(usable, None)
            return current

        while True:
            chosen = max(self._experts, key=self.weights.__getitem__)
            victim = head(chosen)
            if victim is None:
                return
            picks = {name: head(name) for name in self._experts}
            # Only a disagreement teaches anything; then every expert that picked this victim
            # shares the blame (two experts that agree must not shield each other).
            if len(set(picks.values())) > 1:
                for name, pick in picks.items():
                    if pick == victim:
                        ghosts = self._ghosts[name]
                        ghosts[victim] = self._forecast.now
                        while len(ghosts) > limit:
                            ghosts.popitem(last=False)
            taken.add(victim)
            yield victim
