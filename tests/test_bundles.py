"""Small files in bundles: one request for many, deltas against held versions, verified.

The codec round-trips any files against any bases and refuses a damaged frame or a wrong
base; over a real spoke and the link emulator, random small trees warmed, edited at
random (changed, restamped with the same bytes, added, removed) and warmed again come
out byte for byte, in one bundle request per warm-up; a tree of copies of files the
spoke holds under other paths moves their ids, not their bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loomfs.chunks import bundle
from loomfs.chunks.codec import chunk_id
from loomfs.core.types import SYSTEM, Principal
from loomfs.errors import CorruptData, LoomError, NotFound
from loomfs.namespace.chunklink import Named, SmallAsk
from loomfs.rest import client as rest_client
from loomfs.rest import wire
from loomfs.spoke.cache import SMALL_FILE
from loomfs.testing.fabric import fabric
from loomfs.testing.loop import LoopThread

WHO = Principal(user="tester", site="spoke", protocol="test")

WORDS = [b"import ", b"def ", b"return ", b"module.exports", b"{", b"}\n", b"lodash", b"  "]
TEXT = st.lists(st.sampled_from(WORDS) | st.binary(max_size=12), max_size=60).map(b"".join)


@settings(max_examples=40, deadline=None, database=None)
@given(st.lists(TEXT, max_size=8), st.lists(TEXT, max_size=4))
def test_a_bundle_decodes_to_its_files_and_refuses_a_wrong_base(
    datas: list[bytes], bases: list[bytes]
) -> None:
    ids = [chunk_id(d) for d in datas]
    frame = bundle.encode(datas, bases)
    assert bundle.decode(frame, [len(d) for d in datas], ids, bases) == datas
    if sum(map(len, datas)) and frame:
        flipped = bytearray(frame)
        flipped[len(flipped) // 2] ^= 0x55
        with pytest.raises(CorruptData):
            bundle.decode(bytes(flipped), [len(d) for d in datas], ids, bases)
    if bases and any(bases) and any(datas):  # a receiver that holds other bytes than named
        wrong = [bytes(b ^ 0xA5 for b in base) for base in bases]
        with contextlib.suppress(CorruptData):  # refused, or else the right bytes
            assert bundle.decode(frame, [len(d) for d in datas], ids, wrong) == datas


@st.composite
def edits(draw: st.DrawFn) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """A tree of small files and the same tree after random edits."""
    names = draw(st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=6, unique=True))
    before = {
        f"{'sub/' if draw(st.booleans()) else ''}{name}.js": draw(TEXT) + b"\n" for name in names
    }
    after: dict[str, bytes] = {}
    for path, data in before.items():
        how = draw(st.sampled_from(["keep", "restamp", "edit", "remove", "replace"]))
        if how in ("keep", "restamp"):
            after[path] = data
        elif how == "edit":
            at = draw(st.integers(0, len(data)))
            after[path] = data[:at] + draw(TEXT) + data[at:]
        elif how == "replace":
            after[path] = draw(TEXT) + b"!"
    for name in draw(st.lists(st.sampled_from("xyz"), max_size=2, unique=True)):
        after[f"new/{name}.js"] = draw(TEXT) + b"?"
    return before, after


def test_warmed_trees_edited_at_random_come_out_byte_for_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[int] = []
    real = rest_client.RestNamespace.fetch_small

    async def counted(self: rest_client.RestNamespace, asks: list, **how: Any) -> list:  # type: ignore[type-arg]
        asked.append(len(asks))
        return await real(self, asks, **how)

    monkeypatch.setattr(rest_client.RestNamespace, "fetch_small", counted)
    with LoopThread() as loop:
        made = fabric(tmp_path)
        env = loop.run(made.__aenter__())
        hub = env.hub.namespace
        rounds = iter(range(1_000))
        try:

            async def put(top: str, tree: dict[str, bytes], old: dict[str, bytes]) -> None:
                for path in sorted(set(old) - set(tree)):
                    await hub.remove(SYSTEM, f"{top}/{path}")
                for path, data in tree.items():
                    # every file is written again: same bytes are a new version (restamped)
                    await hub.mkdir(SYSTEM, f"{top}/{path}".rsplit("/", 1)[0], parents=True,
                                    exist_ok=True)  # fmt: skip
                    await hub.write_bytes(SYSTEM, f"{top}/{path}", data)

            async def check(top: str, tree: dict[str, bytes]) -> None:
                asked.clear()
                await env.spoke.warm(WHO, top)
                # every file is a new version: all in one bundle, none alone
                assert asked == ([len(tree)] if tree else [])
                for path, data in tree.items():
                    assert await env.spoke.read_bytes(WHO, f"{top}/{path}") == data

            @settings(
                max_examples=8,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(edits())
            def run(case: tuple[dict[str, bytes], dict[str, bytes]]) -> None:
                before, after = case
                top = f"/vol/t{next(rounds)}"
                loop.run(hub.mkdir(SYSTEM, top))
                loop.run(put(top, before, {}))
                loop.run(check(top, before))
                loop.run(put(top, after, before))
                loop.run(check(top, after))

            run()
        finally:
            loop.run(made.__aexit__(None, None, None))


@pytest.mark.parametrize("first", ["warm", "reads"])
def test_a_changed_small_file_comes_as_a_delta_in_its_bundle(tmp_path: Path, first: str) -> None:
    """An edit of a few bytes in each of many files costs far less than the files, whether
    the spoke got their old versions in a bundle or one by one (``first``)."""
    rng = random.Random(5)
    files = {f"m{i}.py": b"".join(rng.choice(WORDS) for _ in range(3_000)) for i in range(10)}
    with LoopThread() as loop:
        made = fabric(tmp_path)
        env = loop.run(made.__aenter__())
        hub = env.hub.namespace
        try:

            async def put(tree: dict[str, bytes], how: str) -> int:
                for path, data in tree.items():
                    await hub.write_bytes(SYSTEM, f"/vol/d/{path}", data)
                before = env.link.down.bytes
                if how == "warm":
                    await env.spoke.warm(WHO, "/vol/d")
                got = {p: await env.spoke.read_bytes(WHO, f"/vol/d/{p}") for p in tree}
                moved = env.link.down.bytes - before
                assert got == tree
                return moved

            loop.run(hub.mkdir(SYSTEM, "/vol/d"))
            whole = loop.run(put(files, first))
            edited = {p: d[:500] + b"# edited\n" + d[500:] for p, d in files.items()}
            assert loop.run(put(edited, "warm")) < whole // 4
        finally:
            loop.run(made.__aexit__(None, None, None))


async def test_a_bundle_skips_what_it_cannot_send_and_names_held_bytes(tmp_path: Path) -> None:
    """Missing, moved on, too large, a directory, token ids: None each (fetched alone);
    a file whose bytes the asker holds comes back as those bytes, without crossing, or
    as their id where the asker's filter of held ids names them."""
    async with fabric(tmp_path) as env:
        hub = env.hub.namespace
        await hub.mkdir(SYSTEM, "/vol/s")
        kept = await hub.write_bytes(SYSTEM, "/vol/s/kept", b"same bytes" * 50)
        old = await hub.write_bytes(SYSTEM, "/vol/s/moved", b"v1")
        await hub.write_bytes(SYSTEM, "/vol/s/moved", b"v2")
        big = await hub.write_bytes(SYSTEM, "/vol/s/big", b"x" * 5_000)
        plain = await hub.write_bytes(SYSTEM, "/vol/s/plain", b"plain text\n" * 20)
        rng = random.Random(3)  # token ids: shuffled into byte planes alone, not bundled
        ids = b"".join(rng.randrange(1_000).to_bytes(2, "little") for _ in range(1_500))
        tokens = await hub.write_bytes(SYSTEM, "/vol/s/tokens", ids)
        held = b"same bytes" * 50
        asks = [
            SmallAsk("/vol/s/kept", kept.version, held, chunk_id(held)),
            SmallAsk("/vol/s/moved", old.version),
            SmallAsk("/vol/s/big", big.version),
            SmallAsk("/vol/s/gone", 1),
            SmallAsk("/vol/s", 1),
            SmallAsk("/vol/s/plain", plain.version, b"other", chunk_id(b"other")),
            SmallAsk("/vol/s/tokens", tokens.version),
        ]
        link = env.spoke.cache.chunks
        assert link is not None
        got = await link.link.fetch_small(asks, small=4_096)
        assert got == [held, None, None, None, None, b"plain text\n" * 20, None]
        # bytes the asker's filter says it holds under another path: their id alone
        plain_id = chunk_id(b"plain text\n" * 20)
        named = await link.link.fetch_small(
            [SmallAsk("/vol/s/plain", plain.version)], small=4_096, holds=bundle.holds([plain_id])
        )
        assert named == [Named(plain_id)]


async def test_a_warm_up_falls_back_to_one_file_at_a_time_when_bundles_fail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hub from before bundles answers 404: every file still comes, one by one."""

    async def refused(*_: object, **__: object) -> list[bytes | None]:
        raise NotFound("no such route")

    monkeypatch.setattr(rest_client.RestNamespace, "fetch_small", refused)
    async with fabric(tmp_path) as env:
        tree = {f"/vol/f/{i}.txt": f"file {i}\n".encode() * (i + 1) for i in range(5)}
        await env.hub.namespace.mkdir(SYSTEM, "/vol/f")
        for path, data in tree.items():
            await env.hub.namespace.write_bytes(SYSTEM, path, data)
        stats = await env.spoke.warm(WHO, "/vol/f")
        assert stats.files == len(tree)
        assert {p: await env.spoke.read_bytes(WHO, p) for p in tree} == tree


@settings(max_examples=40, deadline=None, database=None)
@given(st.lists(st.binary(min_size=1, max_size=64), max_size=50, unique=True))
def test_a_holds_filter_holds_every_id_it_was_made_of(keys: list[bytes]) -> None:
    ids = [chunk_id(k) for k in keys]
    bits = bundle.holds(ids)
    assert all(bundle.may_hold(bits, cid) for cid in ids)
    assert len(bits) == max(8, (len(ids) * bundle.HOLD_BITS + 7) // 8)
    assert not bundle.may_hold(b"", chunk_id(b"anything"))  # an empty filter holds nothing


@st.composite
def copies(draw: st.DrawFn) -> tuple[int, int, dict[str, int]]:
    """A seed and a count of small incompressible files (``held``), and a tree of copies
    of them (renamed, moved to other directories, some copied twice): path -> file."""
    count = draw(st.integers(1, 6))
    made = draw(st.lists(st.integers(0, count - 1), min_size=1, max_size=8))
    dirs = ["", "lib/", "lib/deep/", "other/"]
    tree = {f"{draw(st.sampled_from(dirs))}c{i}.{n}.bin": n for i, n in enumerate(made)}
    return draw(st.integers(0, 1 << 30)), count, tree


def held(seed: int, count: int, top: str) -> dict[str, bytes]:
    # bytes of this round only (a replayed draw would find the last round's held)
    rng = random.Random(seed)
    return {f"src/{i}.bin": top.encode() + rng.randbytes(rng.randrange(16_000, 32_000))
            for i in range(count)}  # fmt: skip


def test_a_tree_of_copies_of_held_files_moves_only_their_ids(tmp_path: Path) -> None:
    """Files whose bytes the spoke holds under other paths cost ids, not bytes: a warm-up
    of a tree of copies moves under 2 KB and 500 bytes a file (listings, entries, ids;
    one of its files would cost 16 KB), and every file reads back byte for byte."""
    with LoopThread() as loop:
        made = fabric(tmp_path)
        env = loop.run(made.__aenter__())
        hub = env.hub.namespace
        rounds = iter(range(1_000))
        try:

            async def put(top: str, tree: dict[str, bytes]) -> None:
                for path, data in tree.items():
                    parent = f"{top}/{path}".rsplit("/", 1)[0]
                    await hub.mkdir(SYSTEM, parent, parents=True, exist_ok=True)
                    await hub.write_bytes(SYSTEM, f"{top}/{path}", data)

            async def warm(top: str, tree: dict[str, bytes]) -> int:
                before = env.link.down.bytes
                await env.spoke.warm(WHO, top)
                moved = env.link.down.bytes - before
                for path, data in tree.items():
                    assert await env.spoke.read_bytes(WHO, f"{top}/{path}") == data
                return moved

            @settings(
                max_examples=5,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(copies())
            def run(case: tuple[int, int, dict[str, int]]) -> None:
                seed, count, tree = case
                top = f"/vol/c{next(rounds)}"
                files = held(seed, count, top)
                loop.run(put(f"{top}/a", files))
                first = loop.run(warm(f"{top}/a", files))
                assert first > sum(map(len, files.values()))  # incompressible: all crossed
                copied = {path: files[f"src/{n}.bin"] for path, n in tree.items()}
                loop.run(put(f"{top}/b", copied))
                moved = loop.run(warm(f"{top}/b", copied))
                assert moved < 2_000 + 500 * len(copied)

            run()
        finally:
            loop.run(made.__aexit__(None, None, None))


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=12,
)


_ASKS = st.one_of(
    st.binary(max_size=64),  # not a packed ask at all
    _JSON.map(bundle.pack),
    st.fixed_dictionaries(  # the right shape, wrong parts
        {"small": st.integers(0, 1 << 20), "files": st.lists(_JSON, max_size=3)},
        optional={"holds": _JSON | st.just("ab" * (bundle.MAX_HOLDS * 2))},
    ).map(bundle.pack),
)


def test_a_malformed_bundle_ask_is_a_clear_refusal(tmp_path: Path) -> None:
    """Whatever a caller sends as a bundle's ask (bytes, any JSON, the right keys with
    wrong values, a filter past its bound), the hub answers it or refuses it in words
    (a 4xx): never an internal error."""
    with LoopThread() as loop:
        made = fabric(tmp_path)
        env = loop.run(made.__aenter__())
        try:
            link = env.spoke.cache.chunks
            assert link is not None
            rest = link.link
            assert isinstance(rest, rest_client.RestNamespace)

            async def ask(body: bytes) -> int:
                headers = {"Content-Type": "application/octet-stream"}
                try:
                    response = await rest._request(
                        "POST", f"{wire.API}/chunks/small", data=body, headers=headers
                    )
                except LoomError as exc:
                    return wire.status_of(exc)
                async with response:
                    return int(response.status)

            @settings(max_examples=60, deadline=None)
            @given(_ASKS)
            def refused_in_words(body: bytes) -> None:
                status = loop.run(ask(body))
                assert status < 500, f"{body!r}: {status}"

            refused_in_words()
        finally:
            loop.run(made.__aexit__(None, None, None))


async def test_parallel_reads_of_listed_small_files_open_in_one_bundle_as_the_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files a loader (or the prefetcher) opens together, named in a listing the spoke
    holds for the reader: one bundle request read for that reader, and then reads of
    them ask the hub nothing; a large file still opens alone."""
    bundles: list[tuple[int, object]] = []
    opens: list[str] = []
    real_small, real_open = (
        rest_client.RestNamespace.fetch_small,
        rest_client.RestNamespace.open_chunked,
    )

    async def small(self: rest_client.RestNamespace, asks: list, **how: Any) -> list:  # type: ignore[type-arg]
        bundles.append((len(asks), how.get("who")))
        return await real_small(self, asks, **how)

    async def opened(self: rest_client.RestNamespace, path: str, **how: Any) -> Any:
        opens.append(path)
        return await real_open(self, path, **how)

    monkeypatch.setattr(rest_client.RestNamespace, "fetch_small", small)
    monkeypatch.setattr(rest_client.RestNamespace, "open_chunked", opened)
    async with fabric(tmp_path) as env:
        hub = env.hub.namespace
        await hub.mkdir(SYSTEM, "/vol/p")
        tree = {f"/vol/p/{i}.txt": f"sample {i}\n".encode() * (i + 3) for i in range(6)}
        tree["/vol/p/big.bin"] = b"not small " * (SMALL_FILE // 10 + 1)
        for path, data in tree.items():
            await hub.write_bytes(SYSTEM, path, data)
        names = [e.name async for e in env.spoke.list(WHO, "/vol/p")]
        assert len(names) == len(tree)
        for _ in range(2):  # the second time from the cache, under the lease
            got = await asyncio.gather(*(env.spoke.read_bytes(WHO, p) for p in tree))
            assert dict(zip(tree, got, strict=True)) == tree
        assert bundles == [(6, WHO)]
        assert opens == ["/vol/p/big.bin"]
