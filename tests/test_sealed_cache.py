"""Cache encryption at rest: a spoke whose cache is sealed with AES-GCM, over the fabric.

The cache directory never holds the plaintext (scanned for a random marker); a tampered or
swapped block fails authentication and is refetched, never served; a cache sealed with
another key is emptied on open.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from loomfs.core.types import Principal
from loomfs.errors import ConfigError
from loomfs.spoke.cache import BLOCK, CORRUPT, Cache
from loomfs.spoke.sealed import KEY_BYTES, OVERHEAD, BlockCipher, load_key
from loomfs.testing.fabric import Fabric, fabric

WHO = Principal(user="tester", protocol="test")
MiB = 1 << 20


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Fabric]:
    async with fabric(tmp_path, lease_ttl=3.0, sealed=("gpu-west",)) as created:
        yield created


def marked(size: int) -> tuple[bytes, bytes]:
    marker = os.urandom(16).hex().encode()
    return marker, ((marker + os.urandom(4000)) * (size // 4032 + 1))[:size]


def unique_marked(size: int) -> tuple[bytes, bytes]:
    """Like ``marked``, with bytes that never repeat (no dedup within the file)."""
    marker = os.urandom(16).hex().encode()
    return marker, b"".join(marker + os.urandom(4000) for _ in range(size // 4032 + 1))[:size]


def holding(directory: Path, marker: bytes) -> list[Path]:
    return [p for p in directory.rglob("*") if p.is_file() and marker in p.read_bytes()]


def corrupt_count() -> float:
    return float(CORRUPT._value.get())


async def test_the_cache_holds_no_plaintext_and_reads_are_exact(env: Fabric) -> None:
    marker, data = marked(3 * MiB + 12345)
    await env.hub.namespace.write_bytes(WHO, "/vol/a.bin", data)
    spoke = env.spoke
    assert await spoke.read_bytes(WHO, "/vol/a.bin") == data  # cold
    before = env.link.down.bytes
    for offset, length in ((0, None), (BLOCK - 3, 10), (2 * BLOCK + 7, BLOCK), (len(data) - 5, 50)):
        want = data[offset:] if length is None else data[offset : offset + length]
        assert await spoke.read_bytes(WHO, "/vol/a.bin", offset, length) == want
    assert env.link.down.bytes - before < 64 * 1024  # warm: no data crossed the link
    async with await spoke.read(WHO, "/vol/a.bin") as reader:
        assert reader.region is None  # no sendfile of a sealed file
    # written at the spoke: kept in the cache as the new version, sealed as well
    written_marker, written = marked(2 * MiB)
    await spoke.write_bytes(WHO, "/vol/b.bin", written)
    assert await spoke.read_bytes(WHO, "/vol/b.bin") == written
    assert (env.volume / "b.bin").read_bytes() == written
    assert not holding(spoke.cache.directory, marker)
    assert not holding(spoke.cache.directory, written_marker)


def _data_file(cache: Cache, path: str) -> Path:
    [cached] = cache.versions(path)
    return cache.directory / "data" / f"{cached.id}.bin"


async def test_a_tampered_or_swapped_block_is_refetched_never_served(env: Fabric) -> None:
    _, data = marked(3 * MiB)
    await env.hub.namespace.write_bytes(WHO, "/vol/t.bin", data)
    spoke = env.spoke
    assert await spoke.read_bytes(WHO, "/vol/t.bin") == data
    slot = BLOCK + OVERHEAD
    target = _data_file(spoke.cache, "/vol/t.bin")

    with target.open("r+b") as f:  # flip one byte inside block 1's ciphertext
        f.seek(slot + 100)
        byte = f.read(1)
        f.seek(slot + 100)
        f.write(bytes([byte[0] ^ 0xFF]))
    corrupt = corrupt_count()
    assert await spoke.read_bytes(WHO, "/vol/t.bin", BLOCK, BLOCK) == data[BLOCK : 2 * BLOCK]
    assert corrupt_count() == corrupt + 1
    # filled again: fetched, or (the link moves chunks) rebuilt from chunks held elsewhere
    # in the cache (this data repeats itself), read back through the cipher and verified
    cached = spoke.cache.get("/vol/t.bin", (await spoke.stat(WHO, "/vol/t.bin")).version)
    assert cached is not None and 1 in cached.hashes

    with target.open("r+b") as f:  # a whole valid block moved to another place
        f.seek(0)
        first = f.read(slot)
        f.seek(2 * slot)
        f.write(first)
    corrupt = corrupt_count()
    assert await spoke.read_bytes(WHO, "/vol/t.bin") == data
    assert corrupt_count() == corrupt + 1


async def test_a_cache_sealed_with_another_key_is_emptied(env: Fabric) -> None:
    _, data = marked(MiB)
    await env.hub.namespace.write_bytes(WHO, "/vol/k.bin", data)
    assert await env.spoke.read_bytes(WHO, "/vol/k.bin") == data
    await env.spoke.close()
    await env.new_spoke().start()  # the same key: still cached
    assert len(env.spoke.cache.versions("/vol/k.bin")) == 1
    await env.spoke.close()
    env.ciphers[env.first] = BlockCipher(os.urandom(KEY_BYTES))
    await env.new_spoke().start()
    assert env.spoke.cache.versions("/vol/k.bin") == []
    assert list((env.spoke.cache.directory / "data").iterdir()) == []
    assert await env.spoke.read_bytes(WHO, "/vol/k.bin") == data


def test_the_key_file(tmp_path: Path) -> None:
    path = tmp_path / "cache.key"
    key = load_key(path, create=True)
    assert len(key) == KEY_BYTES and (path.stat().st_mode & 0o777) == 0o600
    assert load_key(path, create=True) == key  # kept, not replaced
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        load_key(path)
    short = tmp_path / "short.key"
    short.write_bytes(b"x" * 16)
    short.chmod(0o600)
    with pytest.raises(ConfigError, match="32 bytes"):
        load_key(short)
    with pytest.raises(ConfigError, match="cannot read"):
        load_key(tmp_path / "missing.key")


async def test_journaled_writes_are_sealed_too(env: Fabric) -> None:
    spoke = env.spoke
    spoke.write_back = True
    env.link.cut()  # the write waits in the journal
    marker, data = marked(2 * MiB + 5)
    await spoke.write_bytes(WHO, "/vol/j.bin", data)
    assert [p.sealed for p in spoke.journal] == [True]
    assert not holding(spoke.cache.directory, marker)
    assert (await spoke.stat(WHO, "/vol/j.bin")).size == len(data)
    assert await spoke.read_bytes(WHO, "/vol/j.bin", MiB - 3, 100) == data[MiB - 3 : MiB + 97]
    assert await spoke.read_bytes(WHO, "/vol/j.bin") == data
    await spoke.close()  # a restart replays the sealed journal with the same key
    spoke = env.new_spoke()
    await spoke.start()
    assert await spoke.read_bytes(WHO, "/vol/j.bin") == data
    env.link.restore()
    await asyncio.wait_for(spoke.sync(), 60)
    assert (env.volume / "j.bin").read_bytes() == data
    before = env.link.down.bytes
    assert await spoke.read_bytes(WHO, "/vol/j.bin") == data  # adopted into the cache
    assert env.link.down.bytes - before < 64 * 1024
    assert not holding(spoke.cache.directory, marker)


async def test_chunk_fills_are_sealed_and_the_chunk_index_opens_them(env: Fabric) -> None:
    """Fills by chunks store sealed blocks; the chunk index reads chunks back out of sealed
    files (dedup, delta bases) and a chunked upload from the sealed journal sends the
    plaintext: the cache directory never holds the marker."""
    spoke = env.spoke
    assert spoke.cache.chunks is not None and spoke.cache.cipher is not None
    marker, data = unique_marked(6 * MiB)
    await env.hub.namespace.mkdir(WHO, "/vol/d")
    await env.hub.namespace.write_bytes(WHO, "/vol/d/a.bin", data)
    assert await spoke.read_bytes(WHO, "/vol/d/a.bin") == data
    assert spoke.cache.chunks.maps  # filled by chunks
    assert not holding(spoke.cache.directory, marker)
    # a second file sharing most chunks: they are found in the sealed cache, not fetched
    edited = data[: 3 * MiB] + os.urandom(50_000) + data[3 * MiB :]
    await env.hub.namespace.write_bytes(WHO, "/vol/d/b.bin", edited)
    before = env.link.down.bytes
    assert await spoke.read_bytes(WHO, "/vol/d/b.bin") == edited
    assert env.link.down.bytes - before < len(edited) // 3
    assert not holding(spoke.cache.directory, marker)
    # a chunked upload out of the sealed journal: the hub gets the plaintext
    up_marker, up = unique_marked(3 * MiB)
    await spoke.write_bytes(WHO, "/vol/d/up.bin", up)
    assert await env.hub.namespace.read_bytes(WHO, "/vol/d/up.bin") == up
    again = up[:MiB] + os.urandom(1000) + up[MiB:]
    sent = env.link.up.bytes
    await spoke.write_bytes(WHO, "/vol/d/up2.bin", again)  # dedup against up.bin at the hub
    assert env.link.up.bytes - sent < len(again) // 2
    assert await env.hub.namespace.read_bytes(WHO, "/vol/d/up2.bin") == again
    assert not holding(spoke.cache.directory, up_marker)
    # a restart with the same key: the chunk index comes back and still opens the blocks
    spoke = await env.restart_spoke(env.first)
    assert spoke.cache.chunks is not None and spoke.cache.chunks.maps
    assert await spoke.read_bytes(WHO, "/vol/d/b.bin") == edited
    assert not holding(spoke.cache.directory, marker)
