"""The NT hash of a password (core layer): what SMB's NTLM logons are checked against.

The NT hash is MD4 over the password's UTF-16LE bytes. OpenSSL 3 leaves MD4 out of its
default provider (``hashlib.new("md4")`` fails), and nothing in loomfs's dependencies
has it, so it is here, after RFC 1320: a few dozen bytes per call, never a hot path.
"""

from __future__ import annotations

import struct

_MASK = 0xFFFFFFFF
_ROUND2_ORDER = tuple((i % 4) * 4 + i // 4 for i in range(16))
_ROUND3_ORDER = (0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15)


def _rotl(x: int, n: int) -> int:
    return ((x << n) | (x >> (32 - n))) & _MASK


def md4(data: bytes) -> bytes:
    """The MD4 digest of ``data`` (RFC 1320)."""
    padding = b"\x80" + b"\0" * ((55 - len(data)) % 64)
    message = data + padding + struct.pack("<Q", len(data) * 8)
    state = [0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476]
    for offset in range(0, len(message), 64):
        x = struct.unpack_from("<16I", message, offset)
        a, b, c, d = state
        # each step makes a new first word, then the words turn: (a, b, c, d) -> (d, a', b, c)
        for i in range(16):
            a = _rotl((a + ((b & c) | (~b & d)) + x[i]) & _MASK, (3, 7, 11, 19)[i % 4])
            a, b, c, d = d, a, b, c
        for i in range(16):
            f = (b & c) | (b & d) | (c & d)
            a = _rotl((a + f + x[_ROUND2_ORDER[i]] + 0x5A827999) & _MASK, (3, 5, 9, 13)[i % 4])
            a, b, c, d = d, a, b, c
        for i in range(16):
            f = b ^ c ^ d
            a = _rotl((a + f + x[_ROUND3_ORDER[i]] + 0x6ED9EBA1) & _MASK, (3, 9, 11, 15)[i % 4])
            a, b, c, d = d, a, b, c
        state = [(s + v) & _MASK for s, v in zip(state, (a, b, c, d), strict=True)]
    return struct.pack("<4I", *state)


def nt_hash(password: str) -> str:
    """The NT hash of ``password`` as 32 upper-case hex digits (Samba's smbpasswd form)."""
    return md4(password.encode("utf-16-le")).hex().upper()
