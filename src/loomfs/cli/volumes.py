"""``loomfs volume ...`` (protocol layer): assimilate existing storage, over the hub's
admin API."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click
from rich.progress import (
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from . import (
    JSON_LINES,
    _json_lines,
    _time,
    connected,
    console,
    main,
    out,
    run,
)

# -- volumes -----------------------------------------------------------------------------


@main.group()
def volume() -> None:
    """Assimilate existing storage into the namespace (metadata only, nothing copied)."""


def _scan_progress(title: str) -> tuple[Progress, Callable[[dict[str, Any]], None]]:
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TextColumn("{task.completed:,.0f} entries"),
        TextColumn("[dim]{task.fields[rate]:,.0f}/s"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
    task = progress.add_task(title, total=None, rate=0)

    def update(line: dict[str, Any]) -> None:
        progress.update(task, completed=line.get("scanned", 0), rate=line.get("rate", 0))

    return progress, update


def _print_stats(stats: dict[str, Any]) -> None:
    out.print(
        f"{stats['mount']}: {stats['scanned']:,} scanned, {stats['created']:,} new, "
        f"{stats['modified']:,} changed, {stats['meta']:,} attributes, "
        f"{stats['deleted']:,} removed in {stats['elapsed']:.2f}s"
        + (f" (resumed after {stats['resumed_after']!r})" if stats.get("resumed_after") else "")
    )
    if stats.get("skipped"):  # named, the first of them: what to fix, or to know is missing
        out.print(
            f"{stats['skipped']:,} could not be read and were skipped: "
            + ", ".join(stats.get("skipped_paths", []))
        )


@volume.command("add")
@click.argument("mount")
@click.argument("url")
@click.pass_context
@run
async def volume_add(ctx: click.Context, mount: str, url: str) -> None:
    """Assimilate URL (posix:///dir or s3://bucket/prefix?endpoint=...) at MOUNT."""
    progress, update = _scan_progress(f"importing {mount}")
    async with connected(ctx, admin=True) as ns:
        with progress:
            stats = await ns.add_volume(mount, url, update)
    _print_stats(stats)


@volume.command("rescan")
@click.argument("mount")
@click.pass_context
@run
async def volume_rescan(ctx: click.Context, mount: str) -> None:
    """Find changes made behind loomfs's back (new versions, added and removed files)."""
    progress, update = _scan_progress(f"rescanning {mount}")
    async with connected(ctx, admin=True) as ns:
        with progress:
            stats = await ns.rescan(mount, update)
    _print_stats(stats)


@volume.command("list")
@JSON_LINES
@click.pass_context
@run
async def volume_list(ctx: click.Context, as_json: bool) -> None:
    """Volumes of the hub."""
    async with connected(ctx, admin=True) as ns:
        volumes = await ns.volumes()
    if as_json:
        _json_lines(volumes)
        return
    table = Table("mount", "url", "state", "last scan")
    for v in volumes:
        last = v["last_scan_ns"]
        table.add_row(v["mount"], v["url"], v["state"], _time(last) if last else "-")
    out.print(table)


@volume.command("remove")
@click.argument("mount")
@click.pass_context
@run
async def volume_remove(ctx: click.Context, mount: str) -> None:
    """Forget a volume's metadata; its files stay where they are."""
    async with connected(ctx, admin=True) as ns:
        await ns.remove_volume(mount)
