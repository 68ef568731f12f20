"""Cache encryption at rest (spoke layer): AES-GCM per cached block, with a key of this site.

For spokes in places the data's owner does not control: each block of the cache is sealed
with a fresh random nonce, and the cached file's id, version and the block's index are its
associated data, so a block can't be moved to another place or version unnoticed. Opening
authenticates: a tampered or swapped block is ``CorruptData`` (the cache refetches it).
The key is 32 random bytes in a file only its owner may read (``[spoke] cache_key_file``).
"""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path

import blake3
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..errors import ConfigError, CorruptData

KEY_BYTES = 32
NONCE = 12
OVERHEAD = NONCE + 16  # the nonce and the GCM tag beside each block


def load_key(path: Path, *, create: bool = False) -> bytes:
    """The cache key at ``path``; with ``create``, a new one (mode 0600) if there is none."""
    if create:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            pass
        except OSError as exc:
            raise ConfigError(f"cannot create the cache key {path}: {exc.strerror}") from None
        else:
            with os.fdopen(fd, "wb") as out:
                out.write(os.urandom(KEY_BYTES))
                out.flush()
                os.fsync(out.fileno())
    try:
        st = path.stat()
        key = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the cache key {path}: {exc.strerror}") from None
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise ConfigError(f"the cache key {path} is readable by others; chmod 600 it")
    if len(key) != KEY_BYTES:
        raise ConfigError(f"the cache key {path} must hold {KEY_BYTES} bytes, not {len(key)}")
    return key


class BlockCipher:
    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)
        #: names the key without revealing it: a cache sealed with another key is dropped
        self.key_id = blake3.blake3(b"loomfs cache key id" + key).hexdigest()[:32]

    @staticmethod
    def _ad(file_id: int, version: int, idx: int) -> bytes:
        return struct.pack(">QQQ", file_id, version, idx)

    def seal(self, file_id: int, version: int, idx: int, plain: bytes | memoryview) -> bytes:
        nonce = os.urandom(NONCE)
        return nonce + self._aead.encrypt(nonce, plain, self._ad(file_id, version, idx))

    def open(self, file_id: int, version: int, idx: int, sealed: bytes) -> bytes:
        try:
            return self._aead.decrypt(
                sealed[:NONCE], sealed[NONCE:], self._ad(file_id, version, idx)
            )
        except (InvalidTag, ValueError):
            raise CorruptData(
                f"cache block {idx} of file {file_id} failed authentication"
            ) from None
