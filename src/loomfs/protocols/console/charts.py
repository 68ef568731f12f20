"""The console's charts (protocol layer): each series of a ``core.metrics.History`` as
the points of an inline SVG line, scaled here, so a page needs no script to draw it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ...core.metrics import Measure

WIDTH, HEIGHT = 560, 110  # the SVG's viewBox


@dataclass(frozen=True)
class Chart:
    measure: Measure
    lines: list[str]  # each unbroken run of points, as an SVG polyline's points
    dot: tuple[float, float] | None  # the newest point, drawn even when it is alone
    top: str  # the value at the chart's top edge, shown
    last: str  # the newest value, shown
    span_s: float  # the seconds its width covers


def chart(measure: Measure, points: Sequence[tuple[float, float | None]], span_s: float) -> Chart:
    """``points`` (time in seconds, value or None for a gap) over the last ``span_s``
    seconds up to the newest: x by time, y by value from 0 at the bottom to the largest
    (1 for a ratio or the link's state) at the top."""
    values = [v for _, v in points if v is not None]
    top = 1.0 if measure.unit in ("ratio", "up") else max([*values, 0.0]) or 1.0
    end = points[-1][0] if points else 0.0
    lines: list[str] = []
    run: list[str] = []
    dot = None
    for at, value in points:
        if value is None:
            if run:
                lines.append(" ".join(run))
            run, dot = [], None
            continue
        dot = (
            round(WIDTH * max(0.0, 1 - (end - at) / span_s), 1),
            round(HEIGHT * (1 - min(value, top) / top), 1),
        )
        run.append(f"{dot[0]},{dot[1]}")
    if run:
        lines.append(" ".join(run))
    newest = points[-1][1] if points else None
    return Chart(measure, lines, dot, measure.shown(top), measure.shown(newest), span_s)


def charts(
    series: Iterable[tuple[Measure, Sequence[tuple[float, float | None]]]], span_s: float
) -> list[Chart]:
    return [chart(measure, points, span_s) for measure, points in series]
