"""Server-side encryption of file content at rest (namespace layer), for every protocol.

A file's content can be stored encrypted on its volume, as S3 names the ways:

- **server** (S3's SSE-S3, ``AES256``): with a key this site holds (``KeyStore.master``);
- **kms** (``aws:kms``): with a named key of ``KeyStore``, a local stand-in for a KMS: the
  keys are files under the site's data directory (``sse/kms/ID.key``), those ``[hub]
  kms_keys`` names made on first use, and no other id is accepted;
- **customer** (SSE-C): with a key the writer sends and must send again to read; it is
  never stored, only the data key wrapped with it is, so a wrong key fails to unwrap.

Each file has its own random data key, and the content is AES-256-CTR under it, so a
range of the plaintext is the same range of the volume's bytes (sizes, ranges and the
version store's chunks need no second layout). The data key, wrapped with AES-256-GCM by
the key named above, and the counter's start are the file's ``sse.`` tags, committed with
its content (``WriteTags``): a crash leaves the old bytes with their tags or the new ones
with theirs. A directory's ``DEFAULT_TAG`` encrypts the files written below it that ask
for nothing (S3's bucket default encryption), whatever protocol writes them.

CTR keeps the content confidential at rest, not authentic: a change of the volume's bytes
behind loomfs's back reads as other bytes, as it would unencrypted.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import os
import re
import secrets
from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..core.types import WriteTags
from ..errors import InvalidArgument, KeyRequired, NotSupported, WrongKey
from .base import Reader

PREFIX = "sse."
KIND_TAG = "sse.kind"  # Kind's value
KEY_ID_TAG = "sse.key-id"  # the KMS key's id
DATA_KEY_TAG = "sse.data-key"  # base64 of the GCM nonce and the wrapped data key
IV_TAG = "sse.iv"  # base64 of the counter's first block
CUSTOMER_MD5_TAG = "sse.customer-md5"  # base64 MD5 of a customer's key, as S3 answers it
#: on a directory: how files written below it are encrypted ("server" or "kms ID")
DEFAULT_TAG = "sse.default"
KEY_BYTES = 32
_BLOCK = 16
_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


class Kind(enum.StrEnum):
    SERVER = "server"
    KMS = "kms"
    CUSTOMER = "customer"


@dataclass(frozen=True, slots=True)
class Sealing:
    """How a write encrypts, or the key a read brings: a customer's key is only ever here,
    in memory, for one call."""

    kind: Kind
    key_id: str | None = None
    customer_key: bytes | None = field(default=None, repr=False)

    @classmethod
    def customer(cls, key: bytes) -> Sealing:
        if len(key) != KEY_BYTES:
            raise InvalidArgument(f"a customer's key is {KEY_BYTES * 8} bits")
        return cls(Kind.CUSTOMER, customer_key=key)

    @property
    def customer_md5(self) -> str:
        assert self.customer_key is not None
        return base64.b64encode(hashlib.md5(self.customer_key).digest()).decode()

    def as_default(self) -> str:
        """The ``DEFAULT_TAG`` value of a directory that encrypts this way."""
        if self.kind is Kind.CUSTOMER:
            raise InvalidArgument("a customer's key cannot be a directory's default")
        return self.kind.value if self.key_id is None else f"{self.kind.value} {self.key_id}"

    @classmethod
    def of_default(cls, value: str) -> Sealing:
        kind, _, key_id = value.partition(" ")
        return cls(Kind(kind), key_id or None)


@dataclass(frozen=True, slots=True)
class Sealed:
    """How a file's content is encrypted, as its tags say (no key material)."""

    kind: Kind
    key_id: str | None = None
    customer_md5: str | None = None

    @classmethod
    def of(cls, tags: Mapping[str, str]) -> Sealed | None:
        kind = tags.get(KIND_TAG)
        if kind is None:
            return None
        return cls(Kind(kind), tags.get(KEY_ID_TAG), tags.get(CUSTOMER_MD5_TAG))


class KeyStore:
    """The keys a site encrypts with for SSE-S3 and SSE-KMS: 256-bit random keys in files
    of mode 0600 under ``root``. A local stand-in for a KMS: a key id is one of
    ``kms_keys`` (made on first use) or one whose file is already there."""

    def __init__(self, root: Path, kms_keys: Sequence[str] = ()) -> None:
        for key_id in kms_keys:
            if not _KEY_ID.fullmatch(key_id):
                raise InvalidArgument(f"invalid KMS key id {key_id!r}: letters, digits, ._-")
        self.root = root
        self.kms_keys = tuple(kms_keys)
        self._cache: dict[str, bytes] = {}

    @property
    def default_kms(self) -> str:
        """The key of an ``aws:kms`` write that names none (S3's aws/s3 managed key)."""
        return self.kms_keys[0] if self.kms_keys else "default"

    def key(self, kind: Kind, key_id: str | None) -> bytes:
        if kind is Kind.SERVER:
            return self._load("master.key", create=True)
        if key_id is None or not _KEY_ID.fullmatch(key_id):
            raise InvalidArgument(f"no such KMS key: {key_id!r}")
        known = key_id in self.kms_keys or key_id == self.default_kms
        return self._load(f"kms/{key_id}.key", create=known)

    def _load(self, name: str, *, create: bool) -> bytes:
        if (hit := self._cache.get(name)) is not None:
            return hit
        path = self.root / name
        try:
            key = path.read_bytes()
        except FileNotFoundError:
            if not create:
                raise InvalidArgument(f"no such KMS key: {path.stem}") from None
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            key = secrets.token_bytes(KEY_BYTES)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:  # made by a concurrent first use: that one stands
                key = path.read_bytes()
            else:
                with os.fdopen(fd, "wb") as out:
                    out.write(key)
                    out.flush()
                    os.fsync(out.fileno())
        if len(key) != KEY_BYTES:
            raise InvalidArgument(f"{path} is not a {KEY_BYTES * 8}-bit key")
        self._cache[name] = key
        return key


def _aad(kind: Kind, key_id: str | None) -> bytes:
    # the wrapping is bound to how the key was named: tags edited to name another way fail
    return f"loomfs-sse:{kind.value}:{key_id or ''}".encode()


def _wrapping_key(sealing: Sealing | Sealed, keys: KeyStore | None, key: bytes | None) -> bytes:
    if sealing.kind is Kind.CUSTOMER:
        assert key is not None
        return key
    if keys is None:
        raise NotSupported("this site keeps no encryption keys")
    return keys.key(sealing.kind, sealing.key_id)


@dataclass(frozen=True, slots=True)
class Cipherer:
    """One file's data key and counter start: what encrypts or decrypts its bytes."""

    data_key: bytes = field(repr=False)
    iv: bytes

    def stream(self, offset: int) -> tuple[object, int]:
        counter = (int.from_bytes(self.iv, "big") + offset // _BLOCK) % (1 << 128)
        cipher = Cipher(algorithms.AES(self.data_key), modes.CTR(counter.to_bytes(_BLOCK, "big")))
        return cipher.encryptor(), offset % _BLOCK

    async def through(self, data: AsyncIterable[bytes], offset: int = 0) -> AsyncIterator[bytes]:
        """``data`` (starting at ``offset`` of the file) en- or decrypted: CTR is both."""
        ctx, skip = self.stream(offset)
        if skip:
            ctx.update(bytes(skip))  # type: ignore[attr-defined]
        async for chunk in data:
            if chunk:
                yield ctx.update(chunk)  # type: ignore[attr-defined]


def seal(sealing: Sealing, keys: KeyStore | None) -> tuple[Cipherer, dict[str, str]]:
    """A new data key for a write that encrypts as ``sealing``: its cipher and the tags
    to commit with its content."""
    if sealing.kind is Kind.KMS and sealing.key_id is None:
        if keys is None:
            raise NotSupported("this site keeps no encryption keys")
        sealing = Sealing(Kind.KMS, keys.default_kms)
    wrapping = _wrapping_key(sealing, keys, sealing.customer_key)
    cipherer = Cipherer(secrets.token_bytes(KEY_BYTES), secrets.token_bytes(_BLOCK))
    nonce = secrets.token_bytes(12)
    wrapped = AESGCM(wrapping).encrypt(nonce, cipherer.data_key, _aad(sealing.kind, sealing.key_id))
    tags = {
        KIND_TAG: sealing.kind.value,
        DATA_KEY_TAG: base64.b64encode(nonce + wrapped).decode(),
        IV_TAG: base64.b64encode(cipherer.iv).decode(),
    }
    if sealing.key_id is not None:
        tags[KEY_ID_TAG] = sealing.key_id
    if sealing.kind is Kind.CUSTOMER:
        tags[CUSTOMER_MD5_TAG] = sealing.customer_md5
    return cipherer, tags


def unseal(
    tags: Mapping[str, str], keys: KeyStore | None, key: Sealing | None, path: str
) -> Cipherer | None:
    """The cipher of content with these tags (None: stored as it came), refused where it
    needs a customer's key and ``key`` is not that key. A key brought to content that
    needs none is refused as S3 refuses it."""
    sealed = Sealed.of(tags)
    if sealed is None or sealed.kind is not Kind.CUSTOMER:
        if key is not None and key.kind is Kind.CUSTOMER:
            raise InvalidArgument(
                "the object was not stored with a customer-provided key: send none", path=path
            )
        if sealed is None:
            return None
        customer = None
    else:
        if key is None or key.customer_key is None:
            raise KeyRequired(
                f"{path} is encrypted with a key its writer holds (SSE-C): it can be read "
                "only over S3, with that key",
                path=path,
            )
        customer = key.customer_key
    try:
        blob = base64.b64decode(tags[DATA_KEY_TAG])
        iv = base64.b64decode(tags[IV_TAG])
        data_key = AESGCM(_wrapping_key(sealed, keys, customer)).decrypt(
            blob[:12], blob[12:], _aad(sealed.kind, sealed.key_id)
        )
    except InvalidTag:
        if sealed.kind is Kind.CUSTOMER:
            raise WrongKey(f"{path} is encrypted with another key", path=path) from None
        raise InvalidArgument(f"{path}: its data key does not unwrap", path=path) from None
    except (KeyError, binascii.Error):
        raise InvalidArgument(f"{path}: its encryption tags are damaged", path=path) from None
    return Cipherer(data_key, iv)


def write_tags(made: WriteTags | None, sealed: Mapping[str, str]) -> WriteTags:
    """A write's tags with its encryption's (none: a plain content), the file's old ones
    replaced either way: tags left from an encrypted content would misread a plain one."""
    if made is None:
        return WriteTags(dict(sealed), drop_prefix=PREFIX)
    return WriteTags({**made.set, **sealed}, made.stamped, made.replace_prefix, PREFIX)


class DecryptedReader(Reader):
    """A read of encrypted content, handing out the plaintext: never the volume's local
    file region, which holds the ciphertext."""

    def __init__(self, reader: Reader, cipherer: Cipherer) -> None:
        super().__init__(reader.entry, reader.offset, reader)
        self.region = None
        self._cipherer = cipherer

    def chunks(self) -> AsyncIterator[bytes]:
        return self._cipherer.through(self.source.chunks(), self.offset)
