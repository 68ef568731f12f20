"""The loomfs command as a plain ``pip install loomfs`` gives it: without the extras, and
loading at its start only what the command run uses."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from loomfs.testing.hubproc import HubProcess

ROOT = Path(__file__).resolve().parents[1]
SITE_CODE = ("loomfs.service", "loomfs.hub", "loomfs.spoke")  # what serves, not what asks

# Runs the CLI with every module of the named distributions missing, as a plain install
# lacks them (an import of one fails as it would there), then says what was imported.
BLOCKED_RUN = """
import importlib.abc, json, sys
blocked = set(json.loads(sys.argv.pop(1)))

class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Missing())
try:
    from loomfs.cli import main
    main(prog_name="loomfs")
finally:
    print("imported:", json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def extras_modules() -> set[str]:
    """The top-level modules of what pyproject.toml's extras add to the base install
    (the developers' tools aside), read from pyproject itself so no list here drifts."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {_name(r) for r in project["dependencies"]}
    names = {
        _name(requirement)
        for extra, requirements in project["optional-dependencies"].items()
        if extra != "dev"
        for requirement in requirements
    }
    # boto3's own dependency, not the base's: without the s3 extra it is not there either
    return (names | {"botocore"}) - base - {"loomfs"}


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match is not None, requirement
    return match.group(0).lower().replace("-", "_")


def cli(
    data_dir: Path, *args: str, blocked: set[str], stdin: bytes | None = None
) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """``loomfs ARGS`` as the site with its data in ``data_dir``, with ``blocked``
    missing; the result, and the modules the command had imported when it ended."""
    env = {**os.environ, "LOOMFS_SITE__DATA_DIR": str(data_dir)}
    for name in ("LOOMFS_ACCESS_KEY", "LOOMFS_SECRET_KEY", "LOOMFS_HUB"):
        env.pop(name, None)
    result = subprocess.run(
        [sys.executable, "-c", BLOCKED_RUN, json.dumps(sorted(blocked)), *args],
        input=None if stdin is None else stdin.decode(),
        capture_output=True, text=True, check=False, timeout=120, env=env,
    )  # fmt: skip
    said = result.stderr.splitlines()
    modules = [line for line in said if line.startswith("imported: ")]
    result.stderr = "\n".join(line for line in said if line not in modules)
    assert modules, result.stderr
    return result, set(json.loads(modules[0].removeprefix("imported: ")))


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[HubProcess]:
    with HubProcess(tmp_path / "site") as process:
        yield process


def test_the_extras_are_known() -> None:
    # a check of the check: the blocked run below blocks what the extras bring
    assert {"blake3", "zstandard", "pyfastcdc", "numpy", "boto3", "asyncssh"} <= extras_modules()


def test_help_loads_no_layer_below_the_cli(tmp_path: Path) -> None:
    # the extras blocked too, so an eager import of one of them fails the run outright
    result, modules = cli(tmp_path, "--help", blocked=extras_modules())
    assert result.returncode == 0, result.stderr
    assert "Commands:" in result.stdout
    heavy = {"aiohttp", "pydantic", "cryptography", "prometheus_client", "awscrt", "tenacity"}
    assert not {m for m in modules if m.partition(".")[0] in heavy}
    assert not {
        m for m in modules if m.startswith(("loomfs.service", "loomfs.hub", "loomfs.spoke"))
    }


def test_a_plain_install_uses_a_hub_and_says_which_extra_a_command_needs(
    hub: HubProcess, tmp_path: Path
) -> None:
    blocked = extras_modules()
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("alpha")

    def ok(*args: str, stdin: bytes | None = None) -> tuple[str, set[str]]:
        result, modules = cli(hub.data_dir, "--hub", hub.url, *args, blocked=blocked, stdin=stdin)
        assert result.returncode == 0, result.stderr
        return result.stdout, modules

    assert "1 new" in ok("volume", "add", "/d", f"posix://{data}")[0]
    listed, modules = ok("ls", "/d")
    assert listed.split() == ["a.txt"]
    # a client's command: neither the hub's nor the spoke's code, nor the site's crypto
    assert not {
        m for m in modules if m.startswith(("loomfs.service", "loomfs.hub", "loomfs.spoke"))
    }
    assert not {m for m in modules if m.partition(".")[0] in {"cryptography", "prometheus_client"}}
    assert ok("cat", "/d/a.txt")[0] == "alpha"
    assert "version" in ok("put", "-", "/d/b.txt", stdin=b"beta")[0]
    assert (data / "b.txt").read_bytes() == b"beta"
    assert json.loads(ok("stat", "--json", "/d/b.txt")[0])["size"] == 4
    assert "admin" in ok("user", "list")[0]
    # a command that needs an extra: one line naming what to install, no traceback
    serve, _ = cli(tmp_path / "other", "hub", "serve", "--listen", "127.0.0.1:0", blocked=blocked)
    assert serve.returncode == 1
    assert serve.stderr.strip().count("\n") == 0, serve.stderr
    assert "pip install 'loomfs[chunks]'" in serve.stderr
