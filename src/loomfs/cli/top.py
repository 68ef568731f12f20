"""``loomfs status`` and ``loomfs top`` (protocol layer): what a running site moves and
measures."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable

import click
from rich.table import Table

from . import (
    JSON_LINES,
    _json_line,
    connected,
    console,
    main,
    out,
    run,
)

# -- status ------------------------------------------------------------------------------


@main.command("status")
@JSON_LINES
@click.pass_context
@run
async def status(ctx: click.Context, as_json: bool) -> None:
    """A site at a glance (the --hub URL: a hub's or a spoke's): its readiness; at a hub
    its volumes, change log and leases; at a spoke its link (up, round trip), cache,
    write-back backlog and prefetch jobs; and the bytes moved as chunks (logical, on the
    wire, saved by dedup and by compression), per role and direction. With --json a
    line for the site, then one per role and direction."""
    from ..chunks.metrics import REPORTED, summarize
    from ..core.metrics import SNAPSHOT, role_of, totals

    async with connected(ctx) as ns:
        ready = await ns.readiness()
        text = await ns.metrics()
    now, rows = totals(text), summarize(text)
    role = role_of(now)
    # since the site started: no earlier sample, the whole count is the increase
    figures = [(m, m.value(now, {}, 1.0)) for m in SNAPSHOT[role]]
    if as_json:
        _json_line(
            {"site": ready.get("site"), "role": role, "status": ready.get("status"),
             "reasons": ready.get("reasons", [])}
            | {m.title: v for m, v in figures}
        )  # fmt: skip
        for (r, direction), values in sorted(rows.items()):  # bytes: whole numbers
            _json_line({"role": r, "direction": direction} | {k: int(values[k]) for k in values})
        return
    site = Table(title=f"{role} {ready.get('site')}: {ready.get('status')}", show_header=False)
    site.add_column("measure")
    site.add_column("value", justify="right")
    for reason in ready.get("reasons", []):
        site.add_row("degraded", str(reason))
    for measure, value in figures:
        site.add_row(measure.title, measure.shown(value))
    console.print(site)
    if not rows:
        console.print("no chunk transfers yet")
        return
    table = Table(title="chunk transfers since the site started")
    for column in ("role", "direction", *REPORTED, "wire/logical"):
        table.add_column(column, justify="left" if column in ("role", "direction") else "right")
    for (r, direction), values in sorted(rows.items()):
        logical = values["logical"]
        ratio = f"{values['wire'] / logical:.3f}" if logical else "-"
        table.add_row(r, direction, *(f"{int(v):,}" for v in values.values()), ratio)
    console.print(table)


# -- top ---------------------------------------------------------------------------------

_SPARKS = " ▁▂▃▄▅▆▇█"


def _spark(values: Iterable[float | None]) -> str:
    """A row of block characters, one a value, scaled to the largest (blank: none)."""
    seen = list(values)
    top = max((v for v in seen if v is not None), default=0.0) or 1.0
    return "".join(
        " " if v is None else _SPARKS[1 + round(min(v, top) / top * (len(_SPARKS) - 2))]
        for v in seen
    )


@main.command("top")
@click.option("--once", is_flag=True, help="Print one frame (two samples --interval apart).")
@click.option(
    "--interval", default=2.0, show_default=True, type=click.FloatRange(min=0.1),
    help="Seconds between frames.",
)  # fmt: skip
@click.pass_context
def top(ctx: click.Context, once: bool, interval: float) -> None:
    """Live rates of a site (the --hub URL: a hub's or a spoke's) from its /metrics:
    requests, link bytes, catalog and audit at a hub; the link, cache hits, cache use and
    the write-back backlog at a spoke. Refreshes until Ctrl-C."""
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how a live view ends
        _top(ctx, once, interval)


@run
async def _top(ctx: click.Context, once: bool, interval: float) -> None:
    from rich.live import Live

    from ..core.metrics import MEASURES, History, role_of, totals

    async with connected(ctx) as ns:
        now = totals(await ns.metrics())
        # each role's /metrics holds its own metrics only (core.metrics)
        role = role_of(now)
        history = History(MEASURES[role], keep=40)
        history.sample(now, time.monotonic())

        async def frame() -> Table:
            await asyncio.sleep(interval)
            history.sample(totals(await ns.metrics()), time.monotonic())
            table = Table(title=f"loomfs top: {role} {ns.base_url}, every {interval:g} s")
            table.add_column("measure")
            table.add_column("now", justify="right")
            table.add_column(f"last {history.series[history.measures[0]].maxlen}")
            for measure, points in history.series.items():
                values = [v for _, v in points]
                table.add_row(measure.title, measure.shown(values[-1]), _spark(values))
            return table

        if once:
            out.print(await frame())
            return
        with Live(console=out, auto_refresh=False) as live:
            while True:
                live.update(await frame(), refresh=True)
