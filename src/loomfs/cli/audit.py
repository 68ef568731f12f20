"""``loomfs audit ...`` (protocol layer): read and verify the hub's tamper-evident log."""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from ..errors import LoomError, NotFound

if TYPE_CHECKING:
    from ..core.audit import AuditReader

from . import (
    State,
    _json_line,
    _time,
    failed,
    main,
    out,
)

# -- audit -------------------------------------------------------------------------------

_AGO = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _instant(text: str | None) -> int | None:
    """'1h', '30m', '2d' ago, or an ISO time ('2026-11-30T12:00', UTC unless it says);
    nanoseconds since the epoch."""
    if text is None:
        return None
    number, unit = text[:-1], text[-1:]
    if unit in _AGO and number.replace(".", "", 1).isdigit():
        return time.time_ns() - int(float(number) * _AGO[unit] * 1e9)
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is neither 1h/30m/2d/... nor an ISO time") from None
    return int((when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp() * 1e9)


def _audit_reader(ctx: click.Context) -> AuditReader:
    """The audit directory of this site, from the config: audit commands run on the hub."""
    state: State = ctx.find_object(State)  # type: ignore[assignment]
    return _audit_readers(ctx, (state.config.audit_dir,))[0]


def _audit_readers(ctx: click.Context, dirs: tuple[Path, ...]) -> list[AuditReader]:
    """A reader of each audit directory named (each gateway of a hub writes its own
    chain), or of this site's, from the config."""
    from ..core.audit import AuditReader, load_key

    state: State = ctx.find_object(State)  # type: ignore[assignment]
    config = state.config
    readers = []
    for directory in dirs or (config.audit_dir,):
        if not directory.is_dir():
            raise NotFound(f"no audit log in {directory} (is [site] data_dir right?)")
        readers.append(AuditReader(directory, load_key(config.audit.key_file)))
    return readers


_DIRS = click.option(
    "--dir",
    "dirs",
    multiple=True,
    type=click.Path(path_type=Path),
    help="An audit directory (repeat: one per gateway); default: this site's.",
)


def _audit_command(fn: Callable[..., None]) -> Callable[..., None]:
    """loomfs errors (a bad config, a key missing) become one clear line and status 2,
    apart from the status 1 that a broken chain gives."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except LoomError as exc:
            failed(f"{exc.code}: {exc}")
            sys.exit(2)

    return wrapper


@main.group()
def audit() -> None:
    """The tamper-evident record of every access and policy decision (on the hub)."""


@audit.command("query")
@click.option("--user", help="Only this user.")
@click.option("--site", "site_name", help="Only requests from this site.")
@click.option("--op", help="Only this operation (read, write, stat, list, connect...).")
@click.option("--path", "path_prefix", help="Only this path and everything below it.")
@click.option("--since", help="From this time on: 1h, 30m, 2d ago or an ISO time.")
@click.option("--until", help="Before this time (same forms).")
@click.option("--result", help="Only this result: ok, denied or an error code.")
@click.option("--json", "as_json", is_flag=True, help="JSON lines (everything, hashes too).")
@_DIRS
@click.pass_context
@_audit_command
def audit_query(
    ctx: click.Context,
    *,
    dirs: tuple[Path, ...],
    user: str | None,
    site_name: str | None,
    op: str | None,
    path_prefix: str | None,
    since: str | None,
    until: str | None,
    result: str | None,
    as_json: bool,
) -> None:
    """Records that match every filter given, oldest first (streamed); of several
    directories, merged by time, each with the directory it came from."""
    from ..core.audit import merged

    readers = _audit_readers(ctx, dirs)
    records = merged(
        readers, user=user, site=site_name, op=op, path_prefix=path_prefix,
        since=_instant(since), until=_instant(until), result=result,
    )  # fmt: skip
    several = len(readers) > 1
    if as_json:
        for index, r in records:
            _json_line(r.as_dict() | ({"chain": str(dirs[index])} if several else {}))
        return
    columns = ["seq", "time", "site", "protocol", "user", "op", "path", "bytes", "result"]
    table = Table(*(["chain", *columns] if several else columns))
    for index, r in records:
        row = [
            str(r.seq), _time(r.time_ns), r.site, r.protocol, r.user, r.op, r.path,
            f"{r.nbytes:,}", r.result,
        ]  # fmt: skip
        table.add_row(*([str(dirs[index]), *row] if several else row))
    out.print(table)


@audit.command("verify")
@click.option("--anchor", help="SEQ:HASH from an earlier `loomfs audit head`, kept elsewhere.")
@_DIRS
@click.pass_context
@_audit_command
def audit_verify(ctx: click.Context, anchor: str | None, dirs: tuple[Path, ...]) -> None:
    """Check the whole chain (of each directory given); exit 1 naming each place one
    breaks (edited, removed, reordered, truncated); a torn tail from a crash is reported
    but is no break."""
    from ..core.audit import parse_anchor

    if anchor and len(dirs) > 1:
        raise click.BadParameter("an anchor is one chain's: give one --dir with it")
    broken = False
    for index, reader in enumerate(_audit_readers(ctx, dirs)):
        report = reader.verify(parse_anchor(anchor) if anchor else None)
        for finding in report.findings:
            color = "red" if finding.tampering else "yellow"
            out.print(f"[{color}]{finding}[/{color}]", highlight=False)
        summary = (
            f"{report.records:,} records in {report.segments} segments; "
            f"head {report.head_seq}:{report.head_hash}"
        )
        if len(dirs) > 1:
            summary += f" ({dirs[index]})"
        broken |= not report.ok
        verdict = "ok" if report.ok else "[red]BROKEN[/red]"
        out.print(f"{verdict} {summary}", highlight=False)
    if broken:
        sys.exit(1)


@audit.command("head")
@click.pass_context
@_audit_command
def audit_head(ctx: click.Context) -> None:
    """SEQ:HASH of the newest record: keep it elsewhere, give it to `verify --anchor`."""
    seq, digest = _audit_reader(ctx).head()
    out.print(f"{seq}:{digest}", highlight=False)


@audit.command("archive")
@click.pass_context
@_audit_command
def audit_archive(ctx: click.Context) -> None:
    """Compress closed segments (gzip); they still verify and query."""
    from ..core.audit import archive

    for path in archive(_audit_reader(ctx).directory):
        out.print(str(path), highlight=False)
