"""``loomfs ls``, ``stat``, ``cat``, ``put``, ``rm``, ``mv``, ``mkdir``, ``tag``, ``changes``
(protocol layer): files, over a hub's or a spoke's REST API."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from stat import S_IMODE, filemode
from typing import TYPE_CHECKING

import click

from ..core.types import KIND_BITS, Entry
from ..rest.wire import change_json, entry_json
from . import (
    JSON_LINES,
    WHO,
    _json_line,
    _time,
    client,
    connected,
    console,
    main,
    out,
    run,
)

if TYPE_CHECKING:
    from rich.progress import Progress

# -- files -------------------------------------------------------------------------------


def _long(entry: Entry) -> str:
    kind = filemode(KIND_BITS[entry.kind])[0]
    return (
        f"{kind}{oct(entry.mode & 0o777)[2:]:>4} {entry.size:>12,} {_time(entry.mtime_ns)} "
        f"v{entry.version:<6} {entry.name}{'/' if entry.is_dir else ''}"
    )


@main.command("ls")
@click.argument("path", default="/")
@click.option("-l", "long", is_flag=True, help="Size, time and version too.")
@JSON_LINES
@click.pass_context
@run
async def ls(ctx: click.Context, path: str, long: bool, as_json: bool) -> None:
    """List a directory (streamed: fine for millions of entries)."""
    async with connected(ctx) as ns:
        async for entry in ns.list(WHO, path):
            if as_json:
                _json_line(_shown(entry))
            else:
                out.print(_long(entry) if long else entry.name + ("/" if entry.is_dir else ""))


def _shown(entry: Entry) -> dict[str, object]:
    """An entry as ``stat`` shows it: the mode as octal permission bits and as ``ls -l``
    does, the same whether the entry's mode holds its file-type bits or not."""
    bits = S_IMODE(entry.mode)
    return {
        **entry_json(entry),
        "mode": f"{bits:04o}",
        "permissions": filemode(KIND_BITS[entry.kind] | bits),
    }


@main.command("stat")
@click.argument("path")
@JSON_LINES
@click.pass_context
@run
async def stat(ctx: click.Context, path: str, as_json: bool) -> None:
    """An entry's metadata as JSON (version, size, etag...; mode as '0644' and
    '-rw-r--r--'), indented; --json: on one line."""
    async with connected(ctx) as ns:
        entry = await ns.stat(WHO, path)
    if as_json:
        _json_line(_shown(entry))
    else:
        out.print_json(json.dumps(_shown(entry)))


@main.command("cat")
@click.argument("path")
@click.option("--offset", type=int, default=0, help="First byte.")
@click.option("--length", type=int, default=None, help="Number of bytes.")
@click.option("--version", "vid", default=None, help="A kept old version's id.")
@click.pass_context
@run
async def cat(
    ctx: click.Context, path: str, offset: int, length: int | None, vid: str | None
) -> None:
    """Write a file (or a byte range of it, or an old version) to standard output."""
    sink = sys.stdout.buffer
    async with (
        connected(ctx) as ns,
        await (
            ns.read(WHO, path, offset, length)
            if vid is None
            else ns.read_version(WHO, path, vid, offset, length)
        ) as reader,
    ):
        async for chunk in reader.chunks():
            sink.write(chunk)
        await reader.verify()
    sink.flush()


async def _file_chunks(src: Path | None, progress: Progress | None) -> AsyncIterator[bytes]:
    fd = sys.stdin.buffer.fileno() if src is None else os.open(src, os.O_RDONLY)
    task = progress.add_task("upload", total=os.fstat(fd).st_size) if progress else None
    try:
        while chunk := await asyncio.to_thread(os.read, fd, 1 << 20):
            if progress is not None and task is not None:
                progress.advance(task, len(chunk))
            yield chunk
    finally:
        if src is not None:
            os.close(fd)


@main.command("put")
@click.argument("src")
@click.argument("dst")
@click.option("--if-version", type=int, help="Replace only this version (else Conflict).")
@click.option("--exclusive", is_flag=True, help="Create only; fail if DST exists.")
@click.pass_context
@run
async def put(
    ctx: click.Context, src: str, dst: str, if_version: int | None, exclusive: bool
) -> None:
    """Upload local file SRC ('-' for standard input) to DST, atomically."""
    # here, not at the module's start: the other file commands draw no progress bar
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TransferSpeedColumn,
    )

    ns = client(ctx)
    source = None if src == "-" else Path(src)
    progress = (
        Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            console=console,
            transient=True,
        )
        if source is not None and console.is_terminal
        else None
    )
    try:
        if progress is not None:
            progress.start()
        entry = await ns.write(
            WHO, dst, _file_chunks(source, progress), if_version=if_version, exclusive=exclusive
        )
    finally:
        if progress is not None:
            progress.stop()
        await ns.close()
    if entry.version == 0:  # a write-back spoke acknowledged it from its journal
        out.print(
            f"{entry.path}: {entry.size:,} bytes, journaled at the spoke; "
            "the hub's version follows on upload"
        )
    else:
        out.print(f"{entry.path}: {entry.size:,} bytes, version {entry.version}")


@main.command("rm")
@click.argument("path")
@click.option("-r", "recursive", is_flag=True, help="Remove a directory and its contents.")
@click.pass_context
@run
async def rm(ctx: click.Context, path: str, recursive: bool) -> None:
    """Remove a file or directory (from the volume too)."""
    async with connected(ctx) as ns:
        await ns.remove(WHO, path, recursive=recursive)


@main.command("mv")
@click.argument("src")
@click.argument("dst")
@click.option("--overwrite", is_flag=True, help="Replace DST if it is a file.")
@click.pass_context
@run
async def mv(ctx: click.Context, src: str, dst: str, overwrite: bool) -> None:
    """Move a file or directory within its volume."""
    async with connected(ctx) as ns:
        await ns.rename(WHO, src, dst, overwrite=overwrite)


@main.command("mkdir")
@click.argument("path")
@click.option("-p", "parents", is_flag=True, help="Create missing parents; no error if present.")
@click.pass_context
@run
async def mkdir(ctx: click.Context, path: str, parents: bool) -> None:
    """Create a directory."""
    async with connected(ctx) as ns:
        await ns.mkdir(WHO, path, parents=parents, exist_ok=parents)


@main.command("tag")
@click.argument("path")
@click.argument("assignments", nargs=-1)
@click.option("--remove", "remove", multiple=True, help="Tag name to remove (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="The tags as one JSON object.")
@click.pass_context
@run
async def tag(
    ctx: click.Context,
    path: str,
    assignments: tuple[str, ...],
    remove: tuple[str, ...],
    as_json: bool,
) -> None:
    """Show tags, or set KEY=VALUE tags and --remove KEY."""
    ns = client(ctx)
    set_: dict[str, str] = {}
    for item in assignments:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"expected KEY=VALUE, not {item!r}")
        set_[key] = value
    try:
        tags = (
            await ns.set_tags(WHO, path, set_, list(remove))
            if set_ or remove
            else await ns.get_tags(WHO, path)
        )
    finally:
        await ns.close()
    if as_json:
        _json_line(tags)
        return
    for key, value in tags.items():
        out.print(f"{key}={value}")


@main.command("changes")
@click.option("--since", type=int, help="Changes after this sequence number (default: the newest).")
@click.option("--limit", type=int, default=20, show_default=True)
@click.option(
    "--json", "as_json", is_flag=True, help='One JSON object: {"head": N, "changes": [...]}.'
)
@click.pass_context
@run
async def changes(ctx: click.Context, since: int | None, limit: int, as_json: bool) -> None:
    """The hub's change log (what spokes follow)."""
    async with connected(ctx) as ns:
        if since is None:
            since = max(0, (await ns.changes(0, 1)).head - limit)
        feed = await ns.changes(since, limit)
    if as_json:
        _json_line({"head": feed.head, "changes": [change_json(c) for c in feed.changes]})
        return
    for c in feed.changes:
        target = f" -> {c.new_path}" if c.new_path else ""
        out.print(f"{c.seq:>8} {_time(c.time_ns)} {c.op.value:<7} v{c.version:<6} {c.path}{target}")
    out.print(f"[dim]head {feed.head}[/dim]")
