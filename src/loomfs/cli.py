"""The ``loomfs`` command (protocol layer): serve a hub, manage volumes, use files.

File and volume commands talk to a hub's REST API (``--hub`` or ``client.hub`` in the
config), so they work the same from the hub's machine or from anywhere that reaches it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from .config import Config, load_config
from .core.types import SYSTEM, Entry
from .errors import LoomError
from .log import setup_logging
from .namespace.base import Namespace
from .rest.client import RestNamespace
from .rest.wire import entry_json
from .service import HubService

T = TypeVar("T")
console = Console(stderr=True)
out = Console(highlight=False, soft_wrap=True)
WHO = SYSTEM  # the REST server decides who the caller is; the client sends no identity yet


class State:
    def __init__(self, config_path: Path | None, hub: str | None) -> None:
        self.config_path = config_path
        self.hub_override = hub

    @functools.cached_property
    def config(self) -> Config:
        return load_config(self.config_path)

    @property
    def hub(self) -> str:
        return self.hub_override or self.config.client.hub


def run(fn: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., T]:
    """Run an async command; loomfs errors become one clear line and exit status 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return asyncio.run(fn(*args, **kwargs))
        except LoomError as exc:
            console.print(f"[red]loomfs: {exc.code}:[/red] {exc}", highlight=False)
            sys.exit(1)

    return wrapper


def client(ctx: click.Context) -> RestNamespace:
    state: State = ctx.find_object(State)  # type: ignore[assignment]
    return RestNamespace(state.hub)


@click.group()
@click.option(
    "--config", "config_path", type=click.Path(path_type=Path), help="loomfs.toml to use."
)
@click.option("--hub", envvar="LOOMFS_HUB", help="Hub URL (default: client.hub in the config).")
@click.version_option(package_name="loomfs")
@click.pass_context
def main(ctx: click.Context, config_path: Path | None, hub: str | None) -> None:
    """loomfs: one namespace for AI data, wherever it lives."""
    ctx.obj = State(config_path, hub)


# -- hub ---------------------------------------------------------------------------------


@main.group()
def hub() -> None:
    """Run a hub: the site that owns exports."""


@hub.command("serve")
@click.option("--listen", help="HOST:PORT to listen on (default: hub.listen).")
@click.option(
    "--ready-file",
    type=click.Path(path_type=Path),
    help="Write {'url': ...} here once listening (for scripts; port 0 picks a free port).",
)
@click.pass_context
def hub_serve(ctx: click.Context, listen: str | None, ready_file: Path | None) -> None:
    """Serve the namespace, follow volumes for changes, expose /metrics."""
    state: State = ctx.find_object(State)  # type: ignore[assignment]
    try:
        config = state.config
        if listen:
            config = config.model_copy(
                update={"hub": config.hub.model_copy(update={"listen": listen})}
            )
        setup_logging(config.log.level, config.log.format)
        asyncio.run(HubService(config).serve(ready_file))
    except LoomError as exc:
        console.print(f"[red]loomfs: {exc.code}:[/red] {exc}", highlight=False)
        sys.exit(1)


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


@volume.command("add")
@click.argument("mount")
@click.argument("url")
@click.pass_context
@run
async def volume_add(ctx: click.Context, mount: str, url: str) -> None:
    """Assimilate URL (posix:///dir or s3://bucket/prefix?endpoint=...) at MOUNT."""
    ns = client(ctx)
    progress, update = _scan_progress(f"importing {mount}")
    try:
        with progress:
            stats = await ns.add_volume(mount, url, update)
    finally:
        await ns.close()
    _print_stats(stats)


@volume.command("rescan")
@click.argument("mount")
@click.pass_context
@run
async def volume_rescan(ctx: click.Context, mount: str) -> None:
    """Find changes made behind loomfs's back (new versions, added and removed files)."""
    ns = client(ctx)
    progress, update = _scan_progress(f"rescanning {mount}")
    try:
        with progress:
            stats = await ns.rescan(mount, update)
    finally:
        await ns.close()
    _print_stats(stats)


@volume.command("list")
@click.pass_context
@run
async def volume_list(ctx: click.Context) -> None:
    """Volumes of the hub."""
    ns = client(ctx)
    try:
        volumes = await ns.volumes()
    finally:
        await ns.close()
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
    ns = client(ctx)
    try:
        await ns.remove_volume(mount)
    finally:
        await ns.close()


# -- files -------------------------------------------------------------------------------


def _time(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _long(entry: Entry) -> str:
    kind = {"dir": "d", "file": "-", "symlink": "l"}[entry.kind.value]
    return (
        f"{kind}{oct(entry.mode & 0o777)[2:]:>4} {entry.size:>12,} {_time(entry.mtime_ns)} "
        f"v{entry.version:<6} {entry.name}{'/' if entry.is_dir else ''}"
    )


@main.command("ls")
@click.argument("path", default="/")
@click.option("-l", "long", is_flag=True, help="Size, time and version too.")
@click.pass_context
@run
async def ls(ctx: click.Context, path: str, long: bool) -> None:
    """List a directory (streamed: fine for millions of entries)."""
    ns = client(ctx)
    try:
        async for entry in ns.list(WHO, path):
            out.print(_long(entry) if long else entry.name + ("/" if entry.is_dir else ""))
    finally:
        await ns.close()


@main.command("stat")
@click.argument("path")
@click.pass_context
@run
async def stat(ctx: click.Context, path: str) -> None:
    """An entry's metadata as JSON (version, size, etag...)."""
    ns = client(ctx)
    try:
        entry = await ns.stat(WHO, path)
    finally:
        await ns.close()
    out.print_json(json.dumps(entry_json(entry)))


@main.command("cat")
@click.argument("path")
@click.option("--offset", type=int, default=0, help="First byte.")
@click.option("--length", type=int, default=None, help="Number of bytes.")
@click.pass_context
@run
async def cat(ctx: click.Context, path: str, offset: int, length: int | None) -> None:
    """Write a file (or a byte range of it) to standard output."""
    ns = client(ctx)
    sink = sys.stdout.buffer
    try:
        async with await ns.read(WHO, path, offset, length) as reader:
            async for chunk in reader.chunks():
                sink.write(chunk)
            await reader.verify()
        sink.flush()
    finally:
        await ns.close()


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
    out.print(f"{entry.path}: {entry.size:,} bytes, version {entry.version}")


@main.command("rm")
@click.argument("path")
@click.option("-r", "recursive", is_flag=True, help="Remove a directory and its contents.")
@click.pass_context
@run
async def rm(ctx: click.Context, path: str, recursive: bool) -> None:
    """Remove a file or directory (from the volume too)."""
    ns = client(ctx)
    try:
        await ns.remove(WHO, path, recursive=recursive)
    finally:
        await ns.close()


@main.command("mv")
@click.argument("src")
@click.argument("dst")
@click.option("--overwrite", is_flag=True, help="Replace DST if it is a file.")
@click.pass_context
@run
async def mv(ctx: click.Context, src: str, dst: str, overwrite: bool) -> None:
    """Move a file or directory within its volume."""
    ns = client(ctx)
    try:
        await ns.rename(WHO, src, dst, overwrite=overwrite)
    finally:
        await ns.close()


@main.command("mkdir")
@click.argument("path")
@click.option("-p", "parents", is_flag=True, help="Create missing parents; no error if present.")
@click.pass_context
@run
async def mkdir(ctx: click.Context, path: str, parents: bool) -> None:
    """Create a directory."""
    ns = client(ctx)
    try:
        await ns.mkdir(WHO, path, parents=parents, exist_ok=parents)
    finally:
        await ns.close()


@main.command("tag")
@click.argument("path")
@click.argument("assignments", nargs=-1)
@click.option("--remove", "remove", multiple=True, help="Tag name to remove (repeatable).")
@click.pass_context
@run
async def tag(
    ctx: click.Context, path: str, assignments: tuple[str, ...], remove: tuple[str, ...]
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
    for key, value in tags.items():
        out.print(f"{key}={value}")


@main.command("changes")
@click.option("--since", type=int, help="Changes after this sequence number (default: the newest).")
@click.option("--limit", type=int, default=20, show_default=True)
@click.pass_context
@run
async def changes(ctx: click.Context, since: int | None, limit: int) -> None:
    """The hub's change log (what spokes follow)."""
    ns = client(ctx)
    try:
        if since is None:
            _, head = await ns.changes(0, 1)
            since = max(0, head - limit)
        records, head = await ns.changes(since, limit)
    finally:
        await ns.close()
    for c in records:
        target = f" -> {c.new_path}" if c.new_path else ""
        out.print(f"{c.seq:>8} {_time(c.time_ns)} {c.op.value:<7} v{c.version:<6} {c.path}{target}")
    out.print(f"[dim]head {head}[/dim]")


# -- FUSE --------------------------------------------------------------------------------


def _uid_map(pairs: tuple[str, ...]) -> dict[int, str]:
    table: dict[int, str] = {}
    for pair in pairs:
        uid, sep, user = pair.partition("=")
        if not sep or not uid.isdigit() or not user:
            raise click.BadParameter(f"{pair!r} is not UID=USER", param_hint="--uid-map")
        table[int(uid)] = user
    return table


@main.command("mount")
@click.argument("mountpoint", type=click.Path(path_type=Path))
@click.option("--hub", "hub_url", help="Mount this hub's namespace over its REST API.")
@click.option("--allow-other", is_flag=True, help="Let users other than the mounter in.")
@click.option(
    "--uid-map",
    multiple=True,
    metavar="UID=USER",
    help="The loomfs user a local uid acts as (repeatable; default: the local user name).",
)
@click.option(
    "--ready-file",
    type=click.Path(path_type=Path),
    help="Write {'pid': ...} here once mounted (for scripts).",
)
@click.pass_context
def mount(
    ctx: click.Context,
    *,
    mountpoint: Path,
    hub_url: str | None,
    allow_other: bool,
    uid_map: tuple[str, ...],
    ready_file: Path | None,
) -> None:
    """Mount the namespace at MOUNTPOINT (in the foreground; stop with Ctrl-C or SIGTERM).

    With --hub (or the global --hub) over that hub's REST API; otherwise this site's hub
    runs in this process, from the configuration."""
    state: State = ctx.find_object(State)  # type: ignore[assignment]
    uids = _uid_map(uid_map)
    try:
        config = state.config
        setup_logging(config.log.level, config.log.format)
        asyncio.run(
            _mount(
                config,
                mountpoint,
                hub_url=hub_url or state.hub_override,
                allow_other=allow_other,
                uid_map=uids,
                ready_file=ready_file,
            )
        )
    except LoomError as exc:
        console.print(f"[red]loomfs: {exc.code}:[/red] {exc}", highlight=False)
        sys.exit(1)


async def _mount(
    config: Config,
    mountpoint: Path,
    *,
    hub_url: str | None,
    allow_other: bool,
    uid_map: dict[int, str],
    ready_file: Path | None,
) -> None:
    # imported here: pyfuse3 is an optional, compiled dependency only mounts need
    from .protocols.fuse.mount import check_mountpoint, serve  # noqa: PLC0415

    check_mountpoint(mountpoint)  # before a hub starts in this process for nothing

    def ready() -> None:
        if ready_file is not None:
            ready_file.write_text(json.dumps({"pid": os.getpid(), "mountpoint": str(mountpoint)}))

    spool = config.site.data_dir / "fuse-spool"
    service: HubService | None = None
    if hub_url:
        ns: Namespace = RestNamespace(hub_url)
    else:
        service = HubService(config)
        await service.start()
        ns = service.namespace
    try:
        await serve(
            ns,
            mountpoint,
            spool_dir=spool,
            allow_other=allow_other,
            uid_map=uid_map,
            on_ready=ready,
        )
    finally:
        if service is not None:
            await service.stop()
        else:
            await ns.close()
        if ready_file is not None:
            ready_file.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
