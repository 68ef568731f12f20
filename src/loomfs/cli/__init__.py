"""The ``loomfs`` command (protocol layer): serve a hub, manage volumes, use files.

File and volume commands talk to a hub's REST API (``--hub`` or ``client.hub`` in the
config), so they work the same from the hub's machine or from anywhere that reaches it.

A command imports what it uses when it runs, not this module at its start: ``--help`` or
``ls`` then load neither a hub's nor a spoke's code (aiohttp, pydantic, cryptography,
the chunk codecs), and a plain ``pip install loomfs``, without the extras, starts.

This package holds the root group and what every command shares (the client, errors as
one line, output, the global options); a module a command group (``files``, ``volumes``,
``serving``, ``sites``, ``access``, ``mount``, ``top``, ``audit``) adds its commands to it,
imported only when one of its commands is asked for (``COMMAND_MODULES``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import importlib
import json
import sys
from collections.abc import AsyncIterator, Callable, Collection, Coroutine, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from click.core import ParameterSource
from rich.console import Console
from rich.markup import escape

from ..core.types import SYSTEM
from ..errors import LoomError

if TYPE_CHECKING:
    import aiohttp

    from ..config import Config
    from ..rest.client import RestNamespace

T = TypeVar("T")
COMMAND_LINE = ParameterSource.COMMANDLINE
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
        from ..config import load_config

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
            from ..core.admin import LocalAdmin

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
    from ..rest.client import RestNamespace

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
        from ..extras import install_hint

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


#: main's commands -> the module of this package that adds them: a command loads its own
#: module alone (``ls`` neither rich's tables nor the modules of mount, top, audit...)
COMMAND_MODULES = {
    **dict.fromkeys(("ls", "stat", "cat", "put", "rm", "mv", "mkdir", "tag", "changes"), "files"),
    **dict.fromkeys(("hub", "serve", "spoke", "warm", "sync"), "serving"),
    **dict.fromkeys(("user", "group", "acl", "whoami"), "access"),
    **dict.fromkeys(("site", "policy"), "sites"),
    **dict.fromkeys(("status", "top"), "top"),
    "volume": "volumes",
    "mount": "mount",
    "audit": "audit",
    "export": "exports",
}


class Root(OneLineErrors):
    """The root group, whose commands' modules are imported when a command is looked up."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMAND_MODULES:
            importlib.import_module(f"{__name__}.{COMMAND_MODULES[cmd_name]}")
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *COMMAND_MODULES})


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


@click.group(cls=Root)
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


def _time(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S")
