"""The console charts' samples kept on disk (protocol layer): each value the sampler takes,
by measure and wall-clock time, for a day, so a chart spans restarts and reaches an hour or
a day back; the time a site was down shows as a gap in its lines.

These are figures for a person to look at, not data: the file is written without a sync
per sample (sqlite's WAL with ``synchronous=NORMAL``), so a crash may lose the last few
seconds of them, and each day of samples takes a few MB (5 s apart, about ten measures)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from ...errors import InvalidArgument

KEEP_S = 86_400.0  # the samples older than this go
SPANS = {"10m": 600.0, "1h": 3_600.0, "6h": 21_600.0, "24h": 86_400.0}  # a chart's widths
POINTS = 240  # at most per line: wider spans average their samples into this many
PRUNE_EVERY = 120  # samples between removals of the old ones

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS samples (at REAL NOT NULL, measure TEXT NOT NULL, value REAL)",
    "CREATE INDEX IF NOT EXISTS samples_at ON samples (at)",
)

Points = list[tuple[float, float | None]]


def span_of(name: str | None) -> float:
    """The seconds a chart named ``name`` (``10m``, ``1h``, ``6h``, ``24h``; none: 10m)
    covers."""
    if name is None:
        return SPANS["10m"]
    if name not in SPANS:
        raise InvalidArgument(f"span must be one of {', '.join(SPANS)}, not {name!r}")
    return SPANS[name]


class HistoryStore:
    def __init__(self, path: Path | None, *, every: float) -> None:
        """``path``: the sqlite file (made 0600 with its directory); none keeps the
        samples in memory, for as long as the process. ``every``: the sampler's seconds
        between samples, which tells a pause in them (a site down) from their spacing."""
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch(mode=0o600, exist_ok=True)
        # one connection from the sampler's and the pages' threads, taken in turn
        self._db = sqlite3.connect(
            ":memory:" if path is None else str(path), isolation_level=None,
            check_same_thread=False,
        )  # fmt: skip
        self._lock = threading.Lock()
        self.every = every
        self._added = 0
        with self._lock:
            if path is not None:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")
            for statement in _SCHEMA:
                self._db.execute(statement)

    def add(self, at: float, values: Mapping[str, float | None]) -> None:
        """One sample: each measure's value (None: it had none) at ``at`` (seconds since
        the epoch)."""
        with self._lock:
            self._db.execute("BEGIN")
            self._db.executemany(
                "INSERT INTO samples VALUES (?, ?, ?)", [(at, m, v) for m, v in values.items()]
            )
            self._added += 1
            if self._added % PRUNE_EVERY == 1:
                self._db.execute("DELETE FROM samples WHERE at < ?", (at - KEEP_S,))
            self._db.execute("COMMIT")

    def series(self, measures: Sequence[str], span: float, now: float) -> dict[str, Points]:
        """Each of ``measures``' points over the ``span`` seconds up to ``now``: the mean
        of the samples in each of at most ``POINTS`` equal slices (by the slice's middle),
        and a None wherever no sample came for longer than the sampler's pauses explain."""
        width = max(span / POINTS, self.every)
        since = now - span
        with self._lock:
            rows = self._db.execute(
                "SELECT measure, CAST((at - ?) / ? AS INTEGER) AS slice, AVG(value) "
                "FROM samples WHERE at >= ? AND at <= ? GROUP BY measure, slice "
                "ORDER BY measure, slice",
                (since, width, since, now),
            ).fetchall()
        found: dict[str, Points] = {m: [] for m in measures}
        gap = max(3 * self.every, 2 * width)
        for measure, part, value in rows:
            points = found.get(measure)
            if points is None:  # a measure this site no longer charts
                continue
            at = since + (part + 0.5) * width
            if points and points[-1][1] is not None and at - points[-1][0] > gap:
                points.append((points[-1][0] + width, None))  # the line breaks there
            points.append((at, value))
        return found

    def close(self) -> None:
        with self._lock:
            self._db.close()
