"""Path rules and configuration: the checks every protocol relies on."""

from __future__ import annotations

import json
import logging
import re
import tomllib
import typing
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from loomfs import paths
from loomfs.config import Config, TlsSettings, load_config
from loomfs.errors import ConfigError, InvalidPath
from loomfs.log import TextFormatter, setup_logging


@pytest.mark.parametrize(
    ("raw", "normal"),
    [("/", "/"), ("/a", "/a"), ("/a//b/", "/a/b"), ("//a", "/a"), ("/é/ü", "/é/ü")],
)
def test_normalize(raw: str, normal: str) -> None:
    assert paths.normalize(raw) == normal


@pytest.mark.parametrize(
    "bad",
    ["", "a", "a/b", "/a/../b", "/..", "/.", "/a/./b", "/a\x00b", "/" + "x" * 256,
     "/" + "/".join(["abcdefgh"] * 1000), "/\udcff"],
)  # fmt: skip
def test_invalid_paths(bad: str) -> None:
    with pytest.raises(InvalidPath):
        paths.normalize(bad)


def test_a_path_inside_a_volume_may_be_path_max_long() -> None:
    """Under a mount prefix, a client's PATH_MAX-long relative path is a valid path."""
    inside = "/".join(["abcdefgh"] * 455)  # 4,094 bytes
    assert paths.normalize(f"/volumes/site-a/{inside}") == f"/volumes/site-a/{inside}"


def test_helpers() -> None:
    assert paths.split("/a/b") == ("/a", "b") and paths.split("/a") == ("/", "a")
    assert paths.ancestors("/a/b/c") == ["/", "/a", "/a/b"] and paths.ancestors("/") == []
    assert paths.is_within("/a/b", "/a") and not paths.is_within("/ab", "/a")
    assert paths.relative("/a/b/c", "/a") == "b/c" and paths.relative("/a", "/a") == ""
    with pytest.raises(InvalidPath):
        paths.relative("/ab", "/a")


def test_config_file_and_environment(tmp_path: Path) -> None:
    file = tmp_path / "loomfs.toml"
    file.write_text('[site]\nname = "hub-eu"\n[hub]\nlisten = "127.0.0.1:7071"\n')
    config = load_config(
        file, env={"LOOMFS_HUB__RESCAN_INTERVAL": "5", "LOOMFS_SITE__DATA_DIR": str(tmp_path)}
    )
    assert config.site.name == "hub-eu"
    assert config.listen_host_port == ("127.0.0.1", 7071)
    assert config.hub.rescan_interval == 5.0
    assert config.catalog_url == f"sqlite://{tmp_path.resolve()}/catalog.db"
    via_env = load_config(env={"LOOMFS_CONFIG": str(file)})
    assert via_env.site.name == "hub-eu"


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        ("[hub]\nlisten = 7\n", {}, "hub.listen"),
        ("[hub]\nbogus = 1\n", {}, "hub.bogus"),
        ("not toml [", {}, "not valid TOML"),
        ("", {"LOOMFS_HUB__WATCH": "maybe"}, "hub.watch"),
    ],
)
def test_config_errors_are_clear(
    tmp_path: Path, text: str, env: dict[str, str], message: str
) -> None:
    file = tmp_path / "loomfs.toml"
    file.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(file, env=env)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "absent.toml", env={})


def test_listen_must_be_host_port() -> None:
    config = load_config(env={"LOOMFS_HUB__LISTEN": "nonsense"})
    with pytest.raises(ConfigError, match="HOST:PORT"):
        _ = config.listen_host_port


def test_the_sftp_umask_is_octal_in_toml_and_the_environment(tmp_path: Path) -> None:
    config = tmp_path / "loomfs.toml"
    for written, env, umask in (
        ("", None, 0o022),
        ("[sftp]\numask = 0o077\n", None, 0o077),
        ('[sftp]\numask = "027"\n', None, 0o027),
        ("", "002", 0o002),
    ):
        config.write_text(written)
        environ = {} if env is None else {"LOOMFS_SFTP__UMASK": env}
        assert load_config(config, environ).sftp.umask == umask
    config.write_text("[sftp]\numask = 0o1777\n")
    with pytest.raises(ConfigError, match="umask"):
        load_config(config, {})


def test_list_and_table_keys_from_the_environment(tmp_path: Path) -> None:
    config = tmp_path / "loomfs.toml"
    config.write_text('[s3]\nbuckets = { old = "/old" }\n')
    loaded = load_config(
        config,
        {
            "LOOMFS_SPOKE__ATTACH": "/datasets:/models",
            "LOOMFS_S3__BUCKETS": '{"data": "/data", "logs": "/var/logs"}',
            "LOOMFS_HUB__VOLUME_ROOTS": '["/srv/a", "/srv/b"]',
            "LOOMFS_HUB__LISTEN": "[::1]:7070",  # a plain key stays as written
        },
    )
    assert loaded.spoke.attach == ["/datasets", "/models"]
    assert loaded.s3.buckets == {"data": "/data", "logs": "/var/logs"}
    assert loaded.hub.volume_roots == [Path("/srv/a"), Path("/srv/b")]
    assert loaded.hub.listen == "[::1]:7070"
    json_list = load_config(config, {"LOOMFS_SPOKE__ATTACH": '["/a:b", "/c"]'})
    assert json_list.spoke.attach == ["/a:b", "/c"]  # JSON holds a ':' in a path
    with pytest.raises(ConfigError, match="LOOMFS_S3__BUCKETS is not JSON"):
        load_config(config, {"LOOMFS_S3__BUCKETS": "data=/data"})


_RESERVED = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}
_FIELD = re.compile(r' (\w+)=("(?:[^"\\]|\\.)*"|\S+)')


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(
        st.from_regex(r"[a-z][a-z_]{0,9}", fullmatch=True).filter(lambda k: k not in _RESERVED),
        st.one_of(st.text(max_size=12), st.integers()),
        max_size=4,
    )
)
def test_the_text_log_format_keeps_every_field(fields: dict[str, object]) -> None:
    record = logging.makeLogRecord({"name": "loomfs.x", "msg": "mounted", "levelname": "INFO"})
    record.__dict__.update(fields)
    line = TextFormatter().format(record)
    assert "\n" not in line and "INFO loomfs.x: mounted" in line
    tail = line.partition(": mounted")[2]
    parsed = {k: json.loads(v) if v.startswith('"') else v for k, v in _FIELD.findall(tail)}
    assert parsed == {k: str(v) for k, v in fields.items()}


def test_log_format_text_is_what_setup_logging_installs() -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    setup_logging("INFO", "text")
    try:
        assert isinstance(root.handlers[0].formatter, TextFormatter)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def _undocumented(model: type[BaseModel], documented: dict[str, object], at: str) -> list[str]:
    """The keys of ``model`` (its sections', and its tables' of sections, each) that
    ``documented`` lacks. A listener's tls_cert/tls_key go with its ``tls`` ("as [hub]")."""
    missing = []
    for name, field in model.model_fields.items():
        if name not in documented:
            if not (issubclass(model, TlsSettings) and name in ("tls_cert", "tls_key")):
                missing.append(f"{at}{name}")
            continue
        value, kind = documented[name], field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            assert isinstance(value, dict), f"{at}{name}"
            missing += _undocumented(kind, value, f"{at}{name}.")
        elif typing.get_origin(kind) is dict:
            inner = typing.get_args(kind)[1]
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                assert isinstance(value, dict) and value, f"{at}{name}: no example"
                for key, one in value.items():
                    missing += _undocumented(inner, one, f"{at}{name}.{key}.")
    return missing


def test_the_config_reference_names_every_section_and_key() -> None:
    """docs/CONFIG.md's example is a valid config (no key there that loomfs does not know)
    and names every key of every section: a new key fails this until it is documented."""
    reference = (Path(__file__).parents[1] / "docs" / "CONFIG.md").read_text()
    example = reference.split("## Sections", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    documented = tomllib.loads(example)
    Config.model_validate(documented)
    assert _undocumented(Config, documented, "") == []
