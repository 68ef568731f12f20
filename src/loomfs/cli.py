"""The ``loomfs`` command (protocol layer): serve a hub, manage volumes, use files.

File and volume commands talk to a hub's REST API (``--hub`` or ``client.hub`` in the
config), so they work the same from the hub's machine or from anywhere that reaches it.

A command imports what it uses when it runs, not this module at its start: ``--help`` or
``ls`` then load neither a hub's nor a spoke's code (aiohttp, pydantic, cryptography,
the chunk codecs), and a plain ``pip install loomfs``, without the extras, starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import getpass
import json
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Coroutine, Iterable
from datetime import UTC, datetime
from pathlib import Path
from stat import S_IMODE, filemode
from typing import TYPE_CHECKING, Any, TypeVar

import click
from click.core import ParameterSource
from rich.console import Console
from rich.markup import escape
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

from .core.types import KIND_BITS, SYSTEM, Entry, Principal
from .errors import BackendUnavailable, ConfigError, LoomError, NotFound, NotSupported
from .log import setup_logging
from .rest.wire import change_json, entry_json

if TYPE_CHECKING:
    import aiohttp

    from .config import Config
    from .core.audit import AuditReader
    from .core.directory import Directory
    from .core.types import Feed
    from .namespace.base import Namespace
    from .rest.client import RestDirectory, RestNamespace
    from .service import HubService, SpokeService

    Administration = Directory | RestDirectory

T = TypeVar("T")
COMMAND_LINE = ParameterSource.COMMANDLINE
log = logging.getLogger(__name__)
console = Console(stderr=True, soft_wrap=True)  # an error is one line, however long
# piped or redirected, a table is as wide as its rows: never cut to a terminal's 80 columns
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 1 << 20)
WHO = SYSTEM  # the REST server decides who the caller is, from the credentials sent
JSON_LINES = click.option(
    "--json", "as_json", is_flag=True, help="JSON, one object a line, for programs."
)


def failed(line: str) -> None:
    """Say why a command failed, as one line on standard error: taken as it is, not as
    markup (``[spoke] attach``, ``loomfs[chunks]`` are words to read)."""
    console.print(f"[red]loomfs:[/red] {escape(line)}", highlight=False)


def _json_line(value: object) -> None:
    sys.stdout.write(json.dumps(value) + "\n")


def _json_lines(values: Iterable[object]) -> None:
    for value in values:
        _json_line(value)


class State:
    def __init__(
        self, config_path: Path | None, hub: str | None, given: Collection[str] = ()
    ) -> None:
        self.config_path = config_path
        self.hub_override = hub
        self.given = set(given)  # the global options given on the command line

    def given_after(self, name: str, flag: str, value: Any) -> None:
        """A global option given after the command's name: as before it, unless it is
        given there too, and otherwise."""
        attribute = "hub_override" if name == "hub" else name
        if name in self.given and getattr(self, attribute) != value:
            raise click.UsageError(
                f"{flag} is given twice, as {getattr(self, attribute)} and as {value}: give it once"
            )
        setattr(self, attribute, value)
        self.given.add(name)

    @functools.cached_property
    def config(self) -> Config:
        from .config import load_config

        return load_config(self.config_path)

    @property
    def hub(self) -> str:
        return self.hub_override or self.config.client.hub

    def rest(self, url: str | None = None, *, admin: bool = False) -> RestNamespace:
        """A client of ``url`` (default: the hub), with this CLI's credentials and trust;
        ``admin``: for an administration command, which without credentials of its own
        uses the local administrator's key where the hub addressed is this data
        directory's."""
        url = url or self.hub
        credentials = self.config.client.credentials()
        if admin and credentials is None:
            from .core.admin import LocalAdmin

            credentials = LocalAdmin(self.config.site.data_dir).credentials_for(url)
        return client_of(self.config, url, credentials=credentials)


def run(fn: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., T]:
    """Run an async command; loomfs errors become one clear line and exit status 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return asyncio.run(fn(*args, **kwargs))
        except LoomError as exc:
            failed(f"{exc.code}: {exc}")
            sys.exit(1)

    return wrapper


def client_of(
    config: Config, url: str, *, credentials: tuple[str, str] | None = None
) -> RestNamespace:
    """A REST client of ``url`` that sends ``credentials`` (default: ``[client]``'s, the
    environment's LOOMFS_* winning) and checks an https site against its ``ca_cert``."""
    from .rest.client import RestNamespace

    settings = config.client
    return RestNamespace(
        url, credentials=credentials or settings.credentials(), ca_cert=settings.trusted_cert()
    )


def explain(exc: BaseException) -> str | None:
    """One line for an error a user can act on (the cause, and the fix where there is
    one); None for a bug, whose traceback is what helps."""
    if isinstance(exc, LoomError):
        return f"{exc.code}: {exc}"
    if isinstance(exc, ImportError):
        from .extras import install_hint

        return install_hint(exc)
    # an aiohttp error only where a command imported aiohttp (--help does not)
    aiohttp = sys.modules.get("aiohttp")
    if aiohttp is not None and isinstance(exc, aiohttp.ClientError):
        return _link_failure(exc)
    if isinstance(exc, OSError):
        where = f" {exc.filename}" if exc.filename else ""
        if exc.errno == errno.EADDRINUSE:  # asyncio's strerror names the address
            return (
                f"{exc.strerror}: another process listens there; stop it, or choose another "
                "address (--listen, or the section's listen in the config)"
            )
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return (
                f"{exc.strerror}:{where}: make it writable by this user, or point the config "
                "elsewhere ([site] data_dir, [spoke] cache_dir)"
            )
        if exc.strerror:
            return f"{exc.strerror}:{where}" if where else exc.strerror
    return None


def _link_failure(exc: aiohttp.ClientError) -> str:
    import aiohttp

    if isinstance(exc, aiohttp.InvalidURL):
        return f"not a URL: {exc}; give one as http://HOST:PORT (--hub, client.hub)"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return (
            f"cannot reach {exc.host}:{exc.port}: {exc.os_error.strerror or exc.os_error}; "
            "is the hub running there? (--hub, client.hub)"
        )
    if isinstance(exc, aiohttp.ClientPayloadError | aiohttp.ServerDisconnectedError):
        return "the hub's answer ended early (it stopped, or dropped the link): see its log"
    return f"the link to the hub failed: {exc}"


#: main's options, which every command takes after its own name too, as people type them
#: (``loomfs ls /x --hub URL``): the option, its parameter, its type
GLOBALS = (("--config", "config_path", click.Path(path_type=Path)), ("--hub", "hub", click.STRING))


def _given_after(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    if value is not None:
        assert param.name is not None
        state: State = ctx.find_object(State)  # type: ignore[assignment]
        state.given_after(param.name, param.opts[0], value)


class Commands(click.Group):
    """A group whose every command takes the global options after its name too, where it
    has no option of that name itself (``spoke serve --hub``: the hub it attaches)."""

    group_class: type[click.Group] | type[type] | None = type  # its groups are such too

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        if not isinstance(cmd, click.Group):
            taken = {flag for param in cmd.params for flag in param.opts}
            cmd.params.extend(
                click.Option(
                    [flag, dest], type=kind, hidden=True, expose_value=False, callback=_given_after
                )
                for flag, dest, kind in GLOBALS
                if flag not in taken
            )
        super().add_command(cmd, name)


class OneLineErrors(Commands):
    """Errors a user can act on end a command as one line and exit status 1, whichever
    command raised them (``explain``)."""

    group_class = Commands

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as exc:
            line = explain(exc)
            if line is None:
                raise
            failed(line)
            sys.exit(1)


def client(ctx: click.Context, *, admin: bool = False) -> RestNamespace:
    """A client of the hub (or spoke); ``admin``: for an administration command."""
    state: State = ctx.find_object(State)  # type: ignore[assignment]
    return state.rest(admin=admin)


@contextlib.asynccontextmanager
async def connected(ctx: click.Context, *, admin: bool = False) -> AsyncIterator[RestNamespace]:
    """The hub (or spoke) this command talks to, closed when the command is done."""
    ns = client(ctx, admin=admin)
    try:
        yield ns
    finally:
        await ns.close()


@click.group(cls=OneLineErrors)
@click.option(
    "--config", "config_path", type=click.Path(path_type=Path), help="loomfs.toml to use."
)
@click.option(
    "--hub",
    envvar="LOOMFS_HUB",
    help="Hub URL, or several gateways' comma-separated (default: client.hub in the config).",
)
@click.version_option(package_name="loomfs")
@click.pass_context
def main(ctx: click.Context, config_path: Path | None, hub: str | None) -> None:
    """loomfs: one namespace for AI data, wherever it lives.

    --config and --hub go before the command or after it (loomfs ls /x --hub URL)."""
    given = [n for n in ("config_path", "hub") if ctx.get_parameter_source(n) is COMMAND_LINE]
    ctx.obj = State(config_path, hub, given)


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
    """Serve the namespace, follow volumes for changes, expose /metrics (and S3 where
    [s3] listen is set)."""
    _serve(ctx, {"hub": {"listen": listen}} if listen else {}, ready_file)


def _serve(
    ctx: click.Context,
    overrides: dict[str, dict[str, Any]],
    ready: Path | None,
    *,
    spoke: bool = False,
) -> None:
    state: State = ctx.find_object(State)  # type: ignore[assignment]
    try:
        config = state.config
        for section, values in overrides.items():
            current = getattr(config, section)
            config = config.model_copy(update={section: current.model_copy(update=values)})
        setup_logging(config.log.level, config.log.format)
        from .service import HubService, SpokeService

        service = SpokeService(config) if spoke else HubService(config)
        asyncio.run(service.serve(ready))
    except LoomError as exc:
        failed(f"{exc.code}: {exc}")
        sys.exit(1)


@main.group()
def serve() -> None:
    """Serve the namespace over one more protocol (shorthands for `hub serve`)."""


#: protocol (its config section) -> (what listens, its default address, the command's help)
SERVED: dict[str, tuple[str, str, str]] = {
    "s3": ("the S3 endpoint", "127.0.0.1:9000",
           "Serve the hub with its S3 gateway on; keys come from `loomfs user add`."),
    "sftp": ("the SFTP server", "127.0.0.1:2222",
             "Serve the hub with SFTP on; logins by the SSH keys of `loomfs user add --ssh-key`."),
    "nfs": ("the NFSv3 and MOUNT server", "127.0.0.1:2049",
            "Serve the hub over NFSv3 (MOUNT on the same port: mount with port=N,mountport=N)."),
    "smb": ("smbd", "127.0.0.1:445",
            "Serve the hub over SMB (Samba, run by loomfs); logins by `loomfs user passwd`."),
}  # fmt: skip


def _serve_command(section: str, what: str, default: str, text: str) -> None:
    @serve.command(section, help=text)
    @click.option("--listen", help=f"HOST:PORT of {what} (default: {section}.listen).")
    @click.option("--port", type=int, help="Port on 127.0.0.1 (instead of --listen).")
    @click.option("--ready-file", type=click.Path(path_type=Path), help="As for `hub serve`.")
    @click.pass_context
    def command(
        ctx: click.Context, listen: str | None, port: int | None, ready_file: Path | None
    ) -> None:
        _serve_protocol(ctx, section, listen, port, ready_file, default)


for _section, (_what, _default, _text) in SERVED.items():
    _serve_command(_section, _what, _default, _text)


def _serve_protocol(
    ctx: click.Context,
    section: str,
    listen: str | None,
    port: int | None,
    ready_file: Path | None,
    default: str,
) -> None:
    """The hub with one more protocol's listener on: at --listen, at --port on loopback,
    where the config's [section] listen says, or at ``default``."""
    state: State = ctx.find_object(State)  # type: ignore[assignment]
    address = listen or (f"127.0.0.1:{port}" if port is not None else None)
    address = address or getattr(state.config, section).listen or default
    _serve(ctx, {section: {"listen": address}}, ready_file)


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


# -- files -------------------------------------------------------------------------------


def _time(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S")


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


# -- users -------------------------------------------------------------------------------


def offline_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--offline``: for a hub that is not serving (before its first ``hub serve``, or
    to recover one), change its catalog directly instead of through the admin API."""

    def remember(ctx: click.Context, _: click.Parameter, value: bool) -> None:
        ctx.meta["offline"] = value

    return click.option(
        "--offline", is_flag=True, expose_value=False, callback=remember,
        help="The hub is stopped: change its catalog directly (bootstrap, recovery).",
    )(fn)  # fmt: skip


@contextlib.asynccontextmanager
async def administering(ctx: click.Context) -> AsyncIterator[Administration]:
    """The records this administration command changes: the hub's admin API (it decides
    and audits, ``rest.admin``), or with ``--offline`` the stopped hub's own catalog,
    the command's outcome recorded in its audit log."""
    from .rest.client import RestDirectory

    if not ctx.meta.get("offline"):
        async with connected(ctx, admin=True) as ns:
            yield RestDirectory(ns)
        return
    from .core.directory import Directory
    from .core.dirlock import DirectoryLock
    from .core.registry import open_catalog
    from .service import audit_log, own_names

    state: State = ctx.find_object(State)  # type: ignore[assignment]
    config = state.config
    lock = DirectoryLock(config.site.data_dir, "data directory")
    try:
        lock.acquire()  # no hub serves from it meanwhile: its admin API is the way then
    except ConfigError as exc:
        raise ConfigError(f"--offline is for a stopped hub: {exc}") from None
    audit, catalog = audit_log(config), open_catalog(config.catalog_url)
    who = Principal(getpass.getuser(), site=config.site.name, protocol="offline")
    try:
        if audit is not None:
            audit.start()
        await catalog.open()
        op = ctx.command_path.removeprefix(ctx.find_root().info_name or "").strip()
        try:
            yield Directory(catalog, own_names(config))
        except LoomError as exc:
            if audit is not None:
                audit.record(who, op, "/", exc.code, detail=str(exc))
            raise
        if audit is not None:
            audit.record(who, op, "/", "ok")
    finally:
        await catalog.close()
        if audit is not None:
            await asyncio.to_thread(audit.close)
        lock.release()


def _print_secret(key: dict[str, Any]) -> None:
    # the only time the secret is shown; it is never logged
    out.print(f"access key id:     {key['access_key']}")
    out.print(f"secret access key: {key['secret']}")


@main.group()
def user() -> None:
    """Users shared by every protocol: S3 access keys, SSH public keys (on the hub)."""


@user.command("add")
@click.argument("name")
@click.option("--group", "groups", multiple=True, help="A group of the user (repeatable).")
@click.option("--ssh-key", "ssh_key", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@offline_option
@click.pass_context
@run
async def user_add(
    ctx: click.Context, name: str, groups: tuple[str, ...], ssh_key: Path | None
) -> None:
    """Add a user with a new S3 access key (shown once) and optionally an SSH key."""
    line = None if ssh_key is None else ssh_key.read_text()
    async with administering(ctx) as admin:
        _print_secret(await admin.add_user(name, groups, line))


@user.command("list")
@JSON_LINES
@offline_option
@click.pass_context
@run
async def user_list(ctx: click.Context, as_json: bool) -> None:
    """Users, their groups and key ids (never secrets)."""
    async with administering(ctx) as admin:
        users = await admin.list_users()
    if as_json:
        _json_lines(users)
        return
    table = Table("user", "groups", "access keys", "ssh keys")
    for u in users:
        table.add_row(
            u["user"],
            ",".join(u["groups"]),
            " ".join(u["access_keys"]),
            "\n".join(f"{k['key_type']} {k['comment']}".strip() for k in u["ssh_keys"]),
        )
    out.print(table)


@user.command("remove")
@click.argument("name")
@offline_option
@click.pass_context
@run
async def user_remove(ctx: click.Context, name: str) -> None:
    """Remove a user and all their keys."""
    async with administering(ctx) as admin:
        await admin.remove_user(name)


@user.command("passwd")
@click.argument("name")
@click.option("--stdin", "from_stdin", is_flag=True, help="Read the password from stdin.")
@offline_option
@click.pass_context
@run
async def user_passwd(ctx: click.Context, name: str, from_stdin: bool) -> None:
    """Set NAME's SMB password (only its NT hash is sent and kept)."""
    from .core.nthash import nt_hash

    if from_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt("SMB password", hide_input=True, confirmation_prompt=True)
    if not password:
        raise click.UsageError("the password is empty")
    async with administering(ctx) as admin:
        login = await admin.set_smb_password(name, nt_hash(password))
    out.print(f"user {login['user']}: SMB password set (runs as uid {login['uid']})")


@user.group("key")
def user_key() -> None:
    """Add or remove a user's S3 access keys and SSH public keys."""


@user_key.command("add")
@click.argument("name")
@click.option("--ssh-key", "ssh_key", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              help="Add this public key file instead of a new S3 access key.")  # fmt: skip
@offline_option
@click.pass_context
@run
async def user_key_add(ctx: click.Context, name: str, ssh_key: Path | None) -> None:
    """A new S3 access key for NAME (shown once), or an SSH public key."""
    async with administering(ctx) as admin:
        if ssh_key is not None:
            await admin.add_ssh_key(name, ssh_key.read_text())
            return
        _print_secret(await admin.add_access_key(name))


@user_key.command("remove")
@click.argument("name")
@click.option("--access-key", help="The S3 access key id to revoke.")
@click.option("--ssh-key", "ssh_key", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              help="The public key file to revoke.")  # fmt: skip
@offline_option
@click.pass_context
@run
async def user_key_remove(
    ctx: click.Context, name: str, access_key: str | None, ssh_key: Path | None
) -> None:
    """Revoke one of NAME's keys."""
    if (access_key is None) == (ssh_key is None):
        raise click.UsageError("give exactly one of --access-key and --ssh-key")
    async with administering(ctx) as admin:
        if ssh_key is not None:
            await admin.remove_ssh_key(name, ssh_key.read_text())
        else:
            assert access_key is not None
            await admin.remove_access_key(name, access_key)


# -- sites and spokes --------------------------------------------------------------------


@main.group()
def site() -> None:
    """This site's identity, and (on a hub) the spokes it trusts."""


@site.command("init")
@click.option("--name", required=True, help="This site's name (it goes in the certificate).")
@click.option("--label", "labels", multiple=True, help="KEY=VALUE, e.g. region=us-west.")
@click.option("--host", "hosts", multiple=True, help="A name or address this site is reached by.")
@click.option("--cache-key", is_flag=True, help="Also a key sealing this spoke's cache at rest.")
@click.pass_context
def site_init(
    ctx: click.Context,
    name: str,
    labels: tuple[str, ...],
    hosts: tuple[str, ...],
    cache_key: bool,
) -> None:
    """Create this site's key and self-signed certificate (give the .pem to the other side)."""
    from .core.certs import fingerprint
    from .core.sites import parse_labels
    from .fabric.identity import SiteIdentity

    state: State = ctx.find_object(State)  # type: ignore[assignment]
    if cache_key:  # before anything is made: sealing needs BLAKE3 (the chunks extra)
        from .spoke.sealed import load_key as load_cache_key
    try:
        identity = SiteIdentity.create(state.config.identity_dir, name, hosts, parse_labels(labels))
        key_file = state.config.spoke.cache_key_file or state.config.identity_dir / "cache.key"
        if cache_key:
            load_cache_key(key_file, create=True)
    except LoomError as exc:
        failed(f"{exc.code}: {exc}")
        sys.exit(1)
    out.print(f"site {identity.name}: certificate {identity.cert_path}")
    out.print(f"fingerprint {fingerprint(identity.cert_pem)}")
    if cache_key:
        out.print(f"cache key {key_file} (mode 0600)")
        if state.config.spoke.cache_key_file is None:
            out.print(f'seal the cache with it: [spoke] cache_key_file = "{key_file}"')


@site.command("add")
@click.argument("name")
@click.option("--cert", type=click.Path(path_type=Path, exists=True), required=True)
@click.option("--label", "labels", multiple=True, help="KEY=VALUE, beside the certificate's.")
@offline_option
@click.pass_context
@run
async def site_add(ctx: click.Context, name: str, cert: Path, labels: tuple[str, ...]) -> None:
    """On a hub: trust site NAME, pinned to its certificate (never under the hub's name)."""
    from .core.sites import parse_labels

    async with administering(ctx) as admin:
        pinned = await admin.add_site(cert.read_bytes(), parse_labels(labels), name)
    tags = ", ".join(f"{k}={v}" for k, v in pinned["labels"].items())
    out.print(
        f"trusting {pinned['site']} ({pinned['fingerprint'][:16]}...){' ' + tags if tags else ''}"
    )


@site.command("list")
@JSON_LINES
@offline_option
@click.pass_context
@run
async def site_list(ctx: click.Context, as_json: bool) -> None:
    """Sites this hub trusts (and those it revoked)."""
    table = Table("site", "labels", "fingerprint", "state")
    async with administering(ctx) as admin:
        sites = await admin.list_sites()
    if as_json:
        _json_lines(sites)
        return
    for s in sites:
        labels = ", ".join(f"{k}={v}" for k, v in s["labels"].items())
        state = "trusted" if s["trusted"] else "revoked"
        table.add_row(s["site"], labels, s["fingerprint"][:16], state)
    out.print(table)


@site.command("revoke")
@click.argument("name")
@offline_option
@click.pass_context
@run
async def site_revoke(ctx: click.Context, name: str) -> None:
    """Stop trusting a site: its next request is refused."""
    async with administering(ctx) as admin:
        await admin.revoke_site(name)


@site.command("remove")
@click.argument("name")
@offline_option
@click.pass_context
@run
async def site_remove(ctx: click.Context, name: str) -> None:
    """Forget a site entirely (to pin a new certificate for it)."""
    async with administering(ctx) as admin:
        await admin.remove_site(name)


@main.group()
def spoke() -> None:
    """Run a spoke: a hub's exports, cached near the GPUs."""


@spoke.command("serve")
@click.option(
    "--hub", "hub_url", help="The hub's fabric URL, https://host:port (gateways: comma-separated)."
)
@click.option("--hub-cert", type=click.Path(path_type=Path), help="The hub's certificate.")
@click.option("--attach", multiple=True, help="A namespace path of the hub to serve here.")
@click.option("--cache-dir", type=click.Path(path_type=Path), help="Where cached data lives.")
@click.option("--cache-size", help="Cache capacity, e.g. 200G.")
@click.option("--write-back", is_flag=True, default=None, help="Acknowledge writes once journaled.")
@click.option("--listen", help="HOST:PORT of this spoke's REST API.")
@click.option("--ready-file", type=click.Path(path_type=Path), help="As for `hub serve`.")
@click.option(
    "--cache-key-file", type=click.Path(path_type=Path), help="Seal the cache with this key."
)
@click.pass_context
def spoke_serve(
    ctx: click.Context,
    hub_url: str | None,
    hub_cert: Path | None,
    attach: tuple[str, ...],
    cache_dir: Path | None,
    cache_size: str | None,
    write_back: bool | None,
    listen: str | None,
    ready_file: Path | None,
    cache_key_file: Path | None,
) -> None:
    """Attach exports of a hub and serve them here (options override [spoke] in the config)."""
    given = {
        "hub": hub_url,
        "hub_cert": hub_cert,
        "attach": list(attach) or None,
        "cache_dir": cache_dir,
        "cache_size": cache_size,
        "write_back": write_back,
        "listen": listen,
        "cache_key_file": cache_key_file,
    }
    _serve(
        ctx, {"spoke": {k: v for k, v in given.items() if v is not None}}, ready_file, spoke=True
    )


@main.command("warm")
@click.argument("path")
@click.option("--site", "site_url", help="The spoke's URL (default: --hub / client.hub).")
@click.option("--pin", is_flag=True, help="Keep it cached: never evicted.")
@click.pass_context
@run
async def warm(ctx: click.Context, path: str, site_url: str | None, pin: bool) -> None:
    """Fetch PATH into a spoke's cache ahead of training; resumable."""
    state: State = ctx.find_object(State)  # type: ignore[assignment]
    ns = state.rest(site_url)
    progress = Progress(
        SpinnerColumn(),
        TextColumn(f"warming {path}"),
        TextColumn("{task.fields[files]:,} files"),
        DownloadColumn(),
        TimeElapsedColumn(),
        console=console,
    )
    task = progress.add_task("warm", total=None, files=0)

    def update(line: dict[str, Any]) -> None:
        progress.update(task, completed=line.get("bytes", 0), files=line.get("files", 0))

    try:
        with progress:
            stats = await ns.warm(path, pin=pin, progress=update)
    finally:
        await ns.close()
    out.print(
        f"{stats['files']:,} files, {stats['bytes']:,} bytes cached; "
        f"{stats['fetched']:,} bytes fetched now"
        + (f"; {stats['refused']:,} files refused by placement" if stats.get("refused") else "")
    )


@main.command("sync")
@click.option("--site", "site_url", help="The spoke's URL (default: --hub / client.hub).")
@click.pass_context
@run
async def sync(ctx: click.Context, site_url: str | None) -> None:
    """Wait until a spoke has committed every write it acknowledged."""
    state: State = ctx.find_object(State)  # type: ignore[assignment]
    ns = state.rest(site_url)
    try:
        await ns.sync()
    finally:
        await ns.close()


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

    With --hub (or the global --hub) over that hub's REST API; otherwise this site runs
    in this process, from the configuration: its spoke where [spoke] hub is set, else
    its hub."""
    from .protocols.fuse.session import event_loop

    state: State = ctx.find_object(State)  # type: ignore[assignment]
    uids = _uid_map(uid_map)
    try:
        config = state.config
        setup_logging(config.log.level, config.log.format)
        with asyncio.Runner(loop_factory=lambda: event_loop(config.fuse.poll_us)) as runner:
            runner.run(
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
        failed(f"{exc.code}: {exc}")
        sys.exit(1)


def _hub_feed(service: HubService, since: int, wait: float) -> Awaitable[Feed]:
    """The change feed of the hub running in this process, as a mount follows it."""
    return service.feed(None, since, 1000, wait=wait)


def _rest_feed(rest: RestNamespace, since: int, wait: float) -> Awaitable[Feed]:
    """The change feed of a hub over REST, as a mount follows it."""
    return rest.changes(since, wait=wait)


async def _serves_feed(rest: RestNamespace) -> bool:
    """Whether the site has a change feed to follow: a hub has; a spoke keeps its own
    coherent with its hub but serves none, so a mount of it trusts the kernel's cache for
    the short timeout instead of retrying a feed that is not there."""
    try:
        await rest.changes(0, 1)
    except NotSupported:
        log.info("the site serves no change feed: kernel caches expire on their own")
        return False
    return True


async def _mount(
    config: Config,
    mountpoint: Path,
    *,
    hub_url: str | None,
    allow_other: bool,
    uid_map: dict[int, str],
    ready_file: Path | None,
) -> None:
    from .protocols.fuse.follow import Poll
    from .protocols.fuse.mount import check_mountpoint, serve

    check_mountpoint(mountpoint)  # before a hub starts in this process for nothing

    def ready() -> None:
        if ready_file is not None:
            ready_file.write_text(json.dumps({"pid": os.getpid(), "mountpoint": str(mountpoint)}))

    spool = config.site.data_dir / "fuse-spool"
    service: HubService | SpokeService | None = None
    follow: Poll | None = None
    if hub_url:
        rest = client_of(config, hub_url)  # the CLI's credentials, for every local user
        ns: Namespace = rest
    elif config.spoke.hub:
        # this site is a spoke, run here: the kernel reads what its cache holds whole
        # straight from the cache files (passthrough). It keeps itself coherent with its
        # hub but has no feed to follow, so the kernel's caches expire on their own.
        from .service import SpokeService

        service = SpokeService(config)
        await service.start()
        ns = service.namespace
    else:
        # this process serves the mount alone: its changes follow POSIX's durability
        from .service import HubService

        hub = service = HubService(config, durable=config.fuse.durable_each_change)
        await hub.start()
        ns = hub.governed  # the mapped users are decided for like any other caller
        follow = functools.partial(_hub_feed, hub)  # invalidation only: no data
    try:
        if hub_url:
            follow = functools.partial(_rest_feed, rest) if await _serves_feed(rest) else None
        await serve(
            ns,
            mountpoint,
            spool_dir=spool,
            allow_other=allow_other,
            uid_map=uid_map,
            on_ready=ready,
            follow=follow,
            passthrough=config.fuse.passthrough,
        )
    finally:
        if service is not None:
            await service.stop()
        else:
            await ns.close()
        if ready_file is not None:
            ready_file.unlink(missing_ok=True)


# -- placement policies ------------------------------------------------------------------


@main.group()
def policy() -> None:
    """Residency: which sites (by label) may hold or receive the data of which paths."""


@policy.command("add")
@click.argument("name")
@click.option("--paths", "globs", multiple=True, required=True, help="A path glob, /a/b/**.")
@click.option("--tag", help="KEY=VALUE: files with this tag are covered too, wherever they are.")
@click.option(
    "--allow-sites", "allow", multiple=True, required=True, help="A site label KEY=VALUE (any)."
)
@click.option(
    "--metadata",
    type=click.Choice(["visible", "hidden"]),
    default="visible",
    help="Whether refused sites see names and sizes (visible) or nothing (hidden).",
)
@offline_option
@click.pass_context
@run
async def policy_add(
    ctx: click.Context,
    name: str,
    globs: tuple[str, ...],
    tag: str | None,
    allow: tuple[str, ...],
    metadata: str,
) -> None:
    """Add (or replace) policy NAME; returns once every spoke that may no longer hold its
    data has evicted it (the hub at --hub confirms; --offline: once they reconnect)."""
    from .core.directory import Directory
    from .core.placement import Policy

    rule = Policy.build(name, globs, allow, tag, metadata)
    async with administering(ctx) as admin:
        seq = await admin.put_policy(rule)
        if isinstance(admin, Directory):  # no hub serves: spokes evict as they come back
            out.print(f"policy {name} stored; spokes apply it when their hub serves again")
            return
        try:
            await admin.rest.settle(seq)
        except BackendUnavailable as exc:
            raise BackendUnavailable(
                f"policy {name} is stored, but no spoke's eviction is confirmed: {exc}"
            ) from None
    out.print(f"policy {name} in force; spokes it refuses hold none of its data")


@policy.command("list")
@JSON_LINES
@offline_option
@click.pass_context
@run
async def policy_list(ctx: click.Context, as_json: bool) -> None:
    """The placement policies of this hub."""
    table = Table("policy", "paths", "tag", "allowed sites", "metadata")
    async with administering(ctx) as admin:
        policies = await admin.list_policies()
    if as_json:
        _json_lines(policies)
        return
    for p in policies:
        table.add_row(
            p["policy"], " ".join(p["paths"]), p["tag"] or "", " ".join(p["allow"]), p["metadata"]
        )
    out.print(table)


@policy.command("remove")
@click.argument("name")
@offline_option
@click.pass_context
@run
async def policy_remove(ctx: click.Context, name: str) -> None:
    """Remove policy NAME (a loosening: nothing to evict)."""
    async with administering(ctx) as admin:
        await admin.remove_policy(name)


# -- access control ----------------------------------------------------------------------


@main.group()
def group() -> None:
    """Groups of users, for ACL rules (on the hub)."""


@group.command("add")
@click.argument("name")
@offline_option
@click.pass_context
@run
async def group_add(ctx: click.Context, name: str) -> None:
    """Create a group (add users with `loomfs user add --group` or `group member`)."""
    async with administering(ctx) as admin:
        await admin.add_group(name)


@group.command("list")
@JSON_LINES
@offline_option
@click.pass_context
@run
async def group_list(ctx: click.Context, as_json: bool) -> None:
    """Groups and their members."""
    table = Table("group", "members")
    async with administering(ctx) as admin:
        groups = await admin.list_groups()
    if as_json:
        _json_lines(groups)
        return
    for g in groups:
        table.add_row(g["group"], ",".join(g["members"]))
    out.print(table)


@group.command("remove")
@click.argument("name")
@offline_option
@click.pass_context
@run
async def group_remove(ctx: click.Context, name: str) -> None:
    """Remove a group and its memberships (refused while an ACL rule names it)."""
    async with administering(ctx) as admin:
        await admin.remove_group(name)


@group.command("member")
@click.argument("name")
@click.argument("user_name", metavar="USER")
@click.option("--remove", is_flag=True, help="Take USER out of the group instead.")
@offline_option
@click.pass_context
@run
async def group_member(ctx: click.Context, name: str, user_name: str, remove: bool) -> None:
    """Put USER in group NAME (or take them out)."""
    async with administering(ctx) as admin:
        await admin.set_member(name, user_name, member=not remove)


@main.group()
def acl() -> None:
    """Path-prefix access rules (on the hub): who may list, read, write or administer what.

    A path no rule governs (on it or an ancestor) and not under a private export is open
    to everyone; once a rule governs it, only what rules grant is allowed."""


PERMISSIONS = click.Choice(["list", "read", "put", "write", "admin"])


@acl.command("grant")
@click.argument("subject")
@click.argument("permission", type=PERMISSIONS)
@click.argument("path")
@offline_option
@click.pass_context
@run
async def acl_grant(ctx: click.Context, subject: str, permission: str, path: str) -> None:
    """Give SUBJECT (user:NAME, group:NAME or a group's name) PERMISSION on PATH and below."""
    async with administering(ctx) as admin:
        rule = await admin.grant(subject, permission, path)
    out.print(f"{rule['subject']} may {rule['permission']} {rule['path']}")


@acl.command("revoke")
@click.argument("subject")
@click.argument("permission", type=PERMISSIONS)
@click.argument("path")
@offline_option
@click.pass_context
@run
async def acl_revoke(ctx: click.Context, subject: str, permission: str, path: str) -> None:
    """Take back a rule made with `acl grant`."""
    async with administering(ctx) as admin:
        await admin.revoke(subject, permission, path)


@acl.command("list")
@click.option(
    "--json", "as_json", is_flag=True, help='One JSON object: {"rules": [...], "private": [...]}.'
)
@offline_option
@click.pass_context
@run
async def acl_list(ctx: click.Context, as_json: bool) -> None:
    """Every rule and every private export."""
    async with administering(ctx) as admin:
        found = await admin.list_rules()
    if as_json:
        _json_line(found)
        return
    table = Table("path", "subject", "permission")
    for rule in found["rules"]:
        table.add_row(rule["path"], rule["subject"], rule["permission"])
    for path in found["private"]:
        table.add_row(path, "(private export)", "")
    out.print(table)


@acl.command("private")
@click.argument("path")
@click.option("--off", is_flag=True, help="Make PATH open again (where no rule governs it).")
@offline_option
@click.pass_context
@run
async def acl_private(ctx: click.Context, path: str, off: bool) -> None:
    """Mark an export private: below PATH only what rules grant is allowed."""
    async with administering(ctx) as admin:
        await admin.set_private(path, not off)


@main.command("whoami")
@click.pass_context
@run
async def whoami(ctx: click.Context) -> None:
    """Who the hub (or spoke) takes this client for."""
    async with connected(ctx) as ns:
        found = await ns.whoami()
    groups = ",".join(found["groups"]) or "-"
    out.print(f"{found['user']} (groups {groups}) at {found['site']} over {found['protocol']}")


# -- status ------------------------------------------------------------------------------


@main.command("status")
@JSON_LINES
@click.pass_context
@run
async def status(ctx: click.Context, as_json: bool) -> None:
    """Bytes moved as chunks by a site (the --hub URL: a hub's or a spoke's): logical,
    on the wire, and saved by dedup and by compression, per role and direction."""
    from .chunks.metrics import REPORTED, summarize

    async with connected(ctx) as ns:
        rows = summarize(await ns.metrics())
    if as_json:
        for (role, direction), values in sorted(rows.items()):  # bytes: whole numbers
            _json_line({"role": role, "direction": direction} | {k: int(values[k]) for k in values})
        return
    if not rows:
        console.print("no chunk transfers yet")
        return
    table = Table(title="chunk transfers since the site started")
    for column in ("role", "direction", *REPORTED, "wire/logical"):
        table.add_column(column, justify="left" if column in ("role", "direction") else "right")
    for (role, direction), values in sorted(rows.items()):
        logical = values["logical"]
        ratio = f"{values['wire'] / logical:.3f}" if logical else "-"
        table.add_row(role, direction, *(f"{int(v):,}" for v in values.values()), ratio)
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

    from .core.metrics import MEASURES, History, Role, totals

    async with connected(ctx) as ns:
        now = totals(await ns.metrics())
        # each role's /metrics holds its own metrics only (core.metrics)
        role: Role = "spoke" if "loomfs_spoke_link_up" in now else "hub"
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
    from .core.audit import AuditReader, load_key

    state: State = ctx.find_object(State)  # type: ignore[assignment]
    config = state.config
    if not config.audit_dir.is_dir():
        raise NotFound(f"no audit log in {config.audit_dir} (is [site] data_dir right?)")
    return AuditReader(config.audit_dir, load_key(config.audit.key_file))


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
@click.pass_context
@_audit_command
def audit_query(
    ctx: click.Context,
    *,
    user: str | None,
    site_name: str | None,
    op: str | None,
    path_prefix: str | None,
    since: str | None,
    until: str | None,
    result: str | None,
    as_json: bool,
) -> None:
    """Records that match every filter given, oldest first (streamed)."""
    records = _audit_reader(ctx).query(
        user=user, site=site_name, op=op, path_prefix=path_prefix,
        since=_instant(since), until=_instant(until), result=result,
    )  # fmt: skip
    if as_json:
        for r in records:
            _json_line(r.as_dict())
        return
    table = Table("seq", "time", "site", "protocol", "user", "op", "path", "bytes", "result")
    for r in records:
        table.add_row(
            str(r.seq), _time(r.time_ns), r.site, r.protocol, r.user, r.op, r.path,
            f"{r.nbytes:,}", r.result,
        )  # fmt: skip
    out.print(table)


@audit.command("verify")
@click.option("--anchor", help="SEQ:HASH from an earlier `loomfs audit head`, kept elsewhere.")
@click.pass_context
@_audit_command
def audit_verify(ctx: click.Context, anchor: str | None) -> None:
    """Check the whole chain; exit 1 naming each place it breaks (edited, removed,
    reordered, truncated); a torn tail from a crash is reported but is no break."""
    from .core.audit import parse_anchor

    report = _audit_reader(ctx).verify(parse_anchor(anchor) if anchor else None)
    for finding in report.findings:
        color = "red" if finding.tampering else "yellow"
        out.print(f"[{color}]{finding}[/{color}]", highlight=False)
    summary = (
        f"{report.records:,} records in {report.segments} segments; "
        f"head {report.head_seq}:{report.head_hash}"
    )
    if not report.ok:
        out.print(f"[red]BROKEN[/red] {summary}", highlight=False)
        sys.exit(1)
    out.print(f"ok {summary}", highlight=False)


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
    from .core.audit import archive

    for path in archive(_audit_reader(ctx).directory):
        out.print(str(path), highlight=False)


if __name__ == "__main__":
    main()
