"""The loomfs command against a real hub process, as a user types it."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import pkgutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loomfs import cli
from loomfs.cli import main
from loomfs.cli.files import _shown
from loomfs.core.types import KIND_BITS, Entry, EntryKind
from loomfs.testing.hubproc import HubProcess, cli_ok, hub_cert


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[HubProcess]:
    with HubProcess(tmp_path / "site") as process:
        yield process


def loomfs(
    hub: HubProcess, *args: str, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    """The CLI on the hub's machine, of the hub's data directory (so administration
    commands use its local administrator's key)."""
    env = {**os.environ, "LOOMFS_SITE__DATA_DIR": str(hub.data_dir)}
    for name in ("LOOMFS_ACCESS_KEY", "LOOMFS_SECRET_KEY"):
        env.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "loomfs.cli", "--hub", hub.url, *args],
        input=stdin, capture_output=True, check=False, timeout=120, env=env,
    )  # fmt: skip


def ok(hub: HubProcess, *args: str, stdin: bytes | None = None) -> str:
    result = loomfs(hub, *args, stdin=stdin)
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode()


def test_a_session(hub: HubProcess, tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "train").mkdir(parents=True)
    (data / "train" / "a.jsonl").write_text('{"x": 1}\n')
    out = ok(hub, "volume", "add", "/datasets/sample", f"posix://{data}")
    assert "2 scanned" in out and "2 new" in out
    assert "/datasets/sample" in ok(hub, "volume", "list")
    assert ok(hub, "ls", "/datasets/sample").split() == ["train/"]
    assert ok(hub, "cat", "/datasets/sample/train/a.jsonl") == '{"x": 1}\n'
    assert (
        ok(hub, "cat", "/datasets/sample/train/a.jsonl", "--offset", "2", "--length", "3") == 'x":'
    )
    local = tmp_path / "upload.bin"
    local.write_bytes(os.urandom(300_000))
    assert "300,000 bytes" in ok(hub, "put", str(local), "/datasets/sample/up.bin")
    assert (data / "up.bin").read_bytes() == local.read_bytes()  # in place, original form
    ok(hub, "put", "-", "/datasets/sample/stdin.txt", stdin=b"from stdin")
    assert (data / "stdin.txt").read_bytes() == b"from stdin"
    shown = json.loads(ok(hub, "stat", "/datasets/sample/stdin.txt"))
    version = shown["version"]
    assert (shown["mode"], shown["permissions"]) == ("0644", "-rw-r--r--")
    stale = loomfs(
        hub, "put", "-", "/datasets/sample/stdin.txt", "--if-version", str(version - 1), stdin=b"x"
    )
    assert stale.returncode == 1 and b"Conflict" in stale.stderr
    ok(hub, "mkdir", "-p", "/datasets/sample/a/b")
    ok(hub, "mv", "/datasets/sample/stdin.txt", "/datasets/sample/a/b/moved.txt")
    assert (data / "a" / "b" / "moved.txt").read_bytes() == b"from stdin"
    assert ok(hub, "tag", "/datasets/sample/train", "split=train").strip() == "split=train"
    assert ok(hub, "tag", "/datasets/sample/train").strip() == "split=train"
    assert json.loads(ok(hub, "tag", "/datasets/sample/train", "--json")) == {"split": "train"}
    ok(hub, "rm", "-r", "/datasets/sample/a")
    assert not (data / "a").exists()
    listing = ok(hub, "ls", "-l", "/datasets/sample")
    assert "up.bin" in listing and "300,000" in listing
    changes = ok(hub, "changes", "--since", "0", "--limit", "1000")
    assert "rename" in changes and "delete" in changes
    # --json: what programs read, one object a line
    lines = ok(hub, "ls", "--json", "/datasets/sample").splitlines()
    sizes = {e["path"]: e["size"] for e in map(json.loads, lines)}
    assert sizes["/datasets/sample/up.bin"] == 300_000
    assert json.loads(ok(hub, "stat", "--json", "/datasets/sample/up.bin"))["size"] == 300_000
    feed = json.loads(ok(hub, "changes", "--json", "--since", "0", "--limit", "1000"))
    assert {"rename", "delete"} <= {c["op"] for c in feed["changes"]} and feed["head"] > 0
    # a table piped is not cut to 80 columns
    deep = tmp_path / ("a-long-directory-name-" * 4)
    deep.mkdir()
    ok(hub, "volume", "add", "/datasets/deep", f"posix://{deep}")
    volumes = [json.loads(line) for line in ok(hub, "volume", "list", "--json").splitlines()]
    assert {v["mount"]: v["url"] for v in volumes}["/datasets/deep"] == f"posix://{deep}"
    table = ok(hub, "volume", "list")
    assert f"posix://{deep}" in table and "…" not in table
    (data / "train" / "b.jsonl").write_text("{}\n")
    # inotify may already have seen it; after a rescan it is there either way
    assert "scanned" in ok(hub, "volume", "rescan", "/datasets/sample")
    assert "b.jsonl" in ok(hub, "ls", "/datasets/sample/train")


def test_errors_are_one_clear_line(hub: HubProcess, tmp_path: Path) -> None:
    missing = loomfs(hub, "cat", "/nope")
    assert missing.returncode == 1
    assert missing.stderr.decode().strip().startswith("loomfs: NotFound:")
    bad = loomfs(hub, "volume", "add", "/x", f"posix://{tmp_path}/absent")
    assert bad.returncode == 1 and b"NotFound" in bad.stderr
    scheme = loomfs(hub, "volume", "add", "/x", "gopher://host/x")
    assert scheme.returncode == 1 and b"known: posix://, s3://" in scheme.stderr
    traversal = loomfs(hub, "stat", "/x/../etc")
    assert traversal.returncode == 1 and b"InvalidPath" in traversal.stderr
    down = subprocess.run(
        [sys.executable, "-m", "loomfs.cli", "--hub", "http://127.0.0.1:9", "ls", "/"],
        capture_output=True, check=False, timeout=60,
    )  # fmt: skip
    assert down.returncode == 1 and b"BackendUnavailable" in down.stderr


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(list(EntryKind)), st.integers(0, 0o7777), st.booleans())
def test_stat_shows_a_mode_the_same_with_or_without_its_type_bits(
    kind: EntryKind, bits: int, typed: bool
) -> None:
    mode = KIND_BITS[kind] | bits if typed else bits
    shown = _shown(Entry("/v/x", kind, 0, 0, mode, 1, 0, 0))
    assert shown["mode"] == f"{bits:04o}"
    permissions = shown["permissions"]
    assert isinstance(permissions, str) and len(permissions) == 10
    assert permissions == _shown(Entry("/v/x", kind, 0, 0, bits, 1, 0, 0))["permissions"]
    letters = {"file": "-", "dir": "d", "symlink": "l", "fifo": "p", "chardev": "c"}
    assert permissions[0] == {**letters, "blockdev": "b", "socket": "s"}[kind.value]


def _leaves(group: click.Group) -> Iterator[click.Command]:
    # looked up by name: main imports a command's module when it is asked for
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        if isinstance(command, click.Group):
            yield from _leaves(command)
        else:
            yield command


def test_each_command_is_found_in_the_module_that_adds_it() -> None:
    # a command missing from the table would be invisible; one named wrongly, not found
    for info in pkgutil.iter_modules(cli.__path__):
        if info.name != "__main__":  # which runs the command
            importlib.import_module(f"loomfs.cli.{info.name}")
    assert set(main.commands) == set(cli.COMMAND_MODULES)
    for name, command in main.commands.items():
        assert command.callback is not None, name
        module = inspect.unwrap(command.callback).__module__
        assert module == f"loomfs.cli.{cli.COMMAND_MODULES[name]}", name


def test_every_command_takes_the_global_options_after_its_name() -> None:
    # every command, those added later too: the group adds them, not each command
    for command in _leaves(main):
        flags = {flag for param in command.params for flag in param.opts}
        assert {"--hub", "--config"} <= flags, command.name
    spoke = main.get_command(click.Context(main), "spoke")
    own = {p.name for p in spoke.commands["serve"].params}  # type: ignore[union-attr]
    assert "hub_url" in own  # spoke serve's --hub is the hub it attaches, its own


def test_global_options_after_the_command(hub: HubProcess, tmp_path: Path) -> None:
    env = {**os.environ, "LOOMFS_SITE__DATA_DIR": str(hub.data_dir)}
    for name in ("LOOMFS_ACCESS_KEY", "LOOMFS_SECRET_KEY", "LOOMFS_HUB"):
        env.pop(name, None)

    def run(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "loomfs", *args], capture_output=True, text=True,
            check=False, timeout=120, env={**env, **extra},
        )  # fmt: skip

    def ok(*args: str, **extra: str) -> str:
        result = run(*args, **extra)
        assert result.returncode == 0, result.stderr
        return result.stdout

    assert run("ls", "/", "--hub", hub.url).returncode == 0
    assert ok("stat", "--json", "/", f"--hub={hub.url}")
    assert "admin" in ok("user", "list", "--hub", hub.url)
    config = tmp_path / "client.toml"
    config.write_text(f'[client]\nhub = "{hub.url}"\n')
    assert ok("stat", "/", "--config", str(config))
    # the same twice is fine; an environment's is overridden, as before the command
    assert ok("--hub", hub.url, "stat", "/", "--hub", hub.url)
    assert ok("stat", "/", "--hub", hub.url, LOOMFS_HUB="http://127.0.0.1:9")
    twice = run("--hub", "http://127.0.0.1:9", "stat", "/", "--hub", hub.url)
    assert twice.returncode == 2
    assert "--hub is given twice" in twice.stderr and "http://127.0.0.1:9" in twice.stderr


def test_admin_listings_in_json(hub: HubProcess, tmp_path: Path) -> None:
    cli_ok(tmp_path / "gpu", "site", "init", "--name", "gpu", "--label", "region=us")
    ok(hub, "group", "add", "team")
    ok(hub, "user", "add", "alice", "--group", "team")
    ok(hub, "site", "add", "gpu", "--cert", str(hub_cert(tmp_path / "gpu")))
    ok(hub, "policy", "add", "us-only", "--paths", "/d/**", "--allow-sites", "region=us")
    ok(hub, "acl", "grant", "group:team", "read", "/d")
    ok(hub, "acl", "private", "/p")

    def lines(*args: str) -> list[dict[str, object]]:
        found = [json.loads(line) for line in ok(hub, *args, "--json").splitlines()]
        assert all(isinstance(one, dict) for one in found)
        return found

    users = {u["user"]: u for u in lines("user", "list")}
    assert users["alice"]["groups"] == ["team"] and "secret" not in json.dumps(users)
    assert {"group": "team", "members": ["alice"]} in lines("group", "list")
    assert [(s["site"], s["labels"]) for s in lines("site", "list")] == [("gpu", {"region": "us"})]
    assert [(p["policy"], p["paths"]) for p in lines("policy", "list")] == [("us-only", ["/d/**"])]
    [rules] = lines("acl", "list")
    assert rules == {
        "rules": [{"path": "/d", "subject": "group:team", "permission": "read"}],
        "private": ["/p"],
    }
    # the site's own line; no chunk has moved, so no line of transfers
    [site] = lines("status")
    assert site["role"] == "hub" and site["status"] == "ready" and site["reasons"] == []
    assert site["Volumes"] == 0 and site["Write leases"] == 0
