"""Several hub gateways over one PostgreSQL catalog and one posix volume (hub layer, over
REST): two real ``loomfs hub serve`` processes, one path hammered with conditional writes
from both, and a history checker: no two writes with the same expected version both
succeed, and no acknowledged write is lost. And one gateway's change feed wakes for a
commit made through the other (LISTEN/NOTIFY), not at its next poll."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from loomfs.config import Config
from loomfs.core.catalog.postgres import PostgresCatalog
from loomfs.core.types import SYSTEM
from loomfs.errors import Conflict
from loomfs.rest.client import RestNamespace
from loomfs.service import HubService
from loomfs.testing.hubproc import HubProcess, cli_ok
from loomfs.testing.postgres import PostgresServer

WHO = SYSTEM  # the REST server decides who the caller is, from the credentials sent
PATH = "/v/hot.txt"
WRITERS_PER_GATEWAY = 3
ATTEMPTS_PER_WRITER = 25


@dataclass(frozen=True)
class Attempt:
    """One conditional write as its client saw it: ``version`` is None when refused."""

    gateway: int
    expected: int
    payload: bytes
    version: int | None


async def _body(data: bytes) -> AsyncIterator[bytes]:
    yield data


def check_history(initial: int, attempts: list[Attempt]) -> list[Attempt]:
    """The acknowledged writes in commit order, asserting they are linearizable as
    compare-and-swaps: no two succeed on the same expected version, and each succeeds on
    the version the one before it made (so none was overwritten unseen: none lost)."""
    done = sorted((a for a in attempts if a.version is not None), key=lambda a: a.version or 0)
    expected = [a.expected for a in done]
    assert len(set(expected)) == len(expected), f"two writes won on one version: {done}"
    at = initial
    for attempt in done:
        assert attempt.expected == at, f"{attempt} did not follow version {at}: {done}"
        assert attempt.version is not None and attempt.version > at
        at = attempt.version
    return done


@pytest.fixture
def gateways(postgres: PostgresServer, tmp_path: Path) -> Iterator[list[HubProcess]]:
    volume = tmp_path / "volume"
    volume.mkdir()
    env = {"LOOMFS_CATALOG__URL": postgres.create_database(), "LOOMFS_HUB__RESCAN_INTERVAL": "0"}
    with HubProcess(tmp_path / "a", env) as first:
        cli_ok(first.data_dir, "--hub", first.url, "volume", "add", "/v", f"posix://{volume}")
        # the second finds the volume in the shared catalog
        with HubProcess(tmp_path / "b", env) as second:
            yield [first, second]


async def _hammer(urls: list[str], admin: tuple[str, str]) -> tuple[int, list[Attempt]]:
    clients = [RestNamespace(url, credentials=admin) for url in urls]
    try:
        initial = (await clients[0].write(WHO, PATH, _body(b"initial"))).version
        attempts: list[Attempt] = []

        async def writer(gateway: int, name: str) -> None:
            client = clients[gateway]
            for n in range(ATTEMPTS_PER_WRITER):
                expected = (await client.stat(WHO, PATH)).version
                payload = f"{name} {n}".encode()
                try:
                    made = await client.write(WHO, PATH, _body(payload), if_version=expected)
                except Conflict:
                    attempts.append(Attempt(gateway, expected, payload, None))
                else:
                    attempts.append(Attempt(gateway, expected, payload, made.version))

        await asyncio.gather(
            *(
                writer(gateway, f"g{gateway}w{w}")
                for gateway in range(len(clients))
                for w in range(WRITERS_PER_GATEWAY)
            )
        )
        return initial, attempts
    finally:
        for client in clients:
            await client.close()


async def _content(url: str, admin: tuple[str, str]) -> tuple[int, bytes]:
    client = RestNamespace(url, credentials=admin)
    try:
        async with await client.read(WHO, PATH) as reader:
            return reader.entry.version, b"".join([chunk async for chunk in reader.chunks()])
    finally:
        await client.close()


def test_two_gateways_never_both_win_one_version_nor_lose_a_write(
    gateways: list[HubProcess], tmp_path: Path
) -> None:
    admin = gateways[0].admin
    urls = [gateway.url for gateway in gateways]
    initial, attempts = asyncio.run(_hammer(urls, admin))
    done = check_history(initial, attempts)
    # the hammering raced: some writes on each gateway were refused, some won
    assert any(a.version is None for a in attempts), attempts
    assert {a.gateway for a in done} == {0, 1}, done
    last = done[-1]
    for url in urls:  # both gateways, and the volume itself, hold the last acknowledged
        assert asyncio.run(_content(url, admin)) == (last.version, last.payload)
    assert (tmp_path / "volume" / "hot.txt").read_bytes() == last.payload


@pytest.mark.parametrize(
    ("attempts", "ok"),
    [
        ([Attempt(0, 1, b"a", 2), Attempt(1, 2, b"b", 3)], True),
        ([Attempt(0, 1, b"a", 2), Attempt(1, 1, b"b", 3)], False),  # both won on 1
        ([Attempt(0, 1, b"a", 3), Attempt(1, 2, b"b", 4)], False),  # b's 2 never acked
        ([Attempt(0, 1, b"a", None), Attempt(1, 1, b"b", 2)], True),
    ],
)
def test_the_history_checker_refuses_what_it_must(attempts: list[Attempt], ok: bool) -> None:
    if ok:
        assert check_history(1, attempts)
    else:
        with pytest.raises(AssertionError):
            check_history(1, attempts)


def _hub_config(data_dir: Path, catalog_url: str) -> Config:
    return Config.model_validate(
        {"site": {"data_dir": str(data_dir)}, "audit": {"enabled": False},
         "catalog": {"url": catalog_url},
         "hub": {"rescan_interval": 0, "watch": False, "volume_roots": [str(data_dir.parent)]}}
    )  # fmt: skip


async def test_a_commit_on_one_gateway_wakes_a_long_poll_on_the_other(
    postgres: PostgresServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # no poll would come in the test's lifetime: only a notification can wake the feed
    monkeypatch.setattr(PostgresCatalog, "NOTIFIED_POLL_S", 3600.0)
    waiting = asyncio.Event()
    woken: list[bool] = []  # each of the feed's waits: ended by a notification?
    changed = PostgresCatalog.changed

    async def waits(catalog: PostgresCatalog, seen: int, poll: float, limit: float) -> None:
        waiting.set()  # the feed found nothing and waits: what comes now must wake it
        await changed(catalog, seen, poll, limit)
        woken.append(catalog.commits_seen() != seen)

    monkeypatch.setattr(PostgresCatalog, "changed", waits)
    url = postgres.create_database()
    (tmp_path / "volume").mkdir()
    first = HubService(_hub_config(tmp_path / "a", url))
    await first.start()
    second = HubService(_hub_config(tmp_path / "b", url))
    try:
        await first.add_volume("/v", f"posix://{tmp_path / 'volume'}", lambda _: None)
        await second.start()
        head = await second.catalog.head_seq()
        polled = asyncio.ensure_future(second.feed(None, head, 100, wait=30.0))
        await waiting.wait()
        made = await first.namespace.write(SYSTEM, "/v/new.txt", _body(b"news"))
        feed = await polled
        # the new file, and its directory's new times in the same commit
        assert [(c.path, c.version) for c in feed.changes] == [
            ("/v/new.txt", made.version),
            ("/v", made.version + 1),
        ]
        # woken by the commit's notification, not by the long poll's end (the old code)
        assert woken == [True], woken
    finally:
        await second.stop()
        await first.stop()
