"""XDR (RFC 4506) encoding and decoding (protocol layer): what ONC RPC, MOUNT and NFSv3 speak.

``Unpacker`` reads from one received record and raises ``XdrError`` for anything short,
too long or out of range, so a malformed call becomes GARBAGE_ARGS and never an exception
the server did not expect; lengths are checked against what the record still holds before
anything is sliced, so a huge length costs nothing.
"""

from __future__ import annotations

import struct

_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")


class XdrError(ValueError):
    """The bytes are not the XDR the call needs (short, too long, a bad value)."""


def _pad(n: int) -> int:
    return (4 - n % 4) % 4


class Unpacker:
    def __init__(self, data: bytes | memoryview) -> None:
        self.data = memoryview(data)
        self.pos = 0

    def _take(self, n: int) -> memoryview:
        end = self.pos + n
        if n < 0 or end > len(self.data):
            raise XdrError(f"short data: {n} bytes wanted at {self.pos} of {len(self.data)}")
        out = self.data[self.pos : end]
        self.pos = end
        return out

    def uint(self) -> int:
        return int(_U32.unpack(self._take(4))[0])

    def int32(self) -> int:
        return int(_I32.unpack(self._take(4))[0])

    def uhyper(self) -> int:
        return int(_U64.unpack(self._take(8))[0])

    def hyper(self) -> int:
        return int(_I64.unpack(self._take(8))[0])

    def boolean(self) -> bool:
        value = self.uint()
        if value > 1:
            raise XdrError(f"not a bool: {value}")
        return value == 1

    def fixed(self, n: int) -> bytes:
        out = bytes(self._take(n))
        self._take(_pad(n))
        return out

    def opaque(self, limit: int) -> bytes:
        """Variable-length opaque data of at most ``limit`` bytes."""
        n = self.uint()
        if n > limit:
            raise XdrError(f"{n} bytes where at most {limit} may be")
        return self.fixed(n)

    def view(self, limit: int) -> memoryview:
        """Variable-length opaque data without a copy (WRITE's data)."""
        n = self.uint()
        if n > limit:
            raise XdrError(f"{n} bytes where at most {limit} may be")
        out = self._take(n)
        self._take(_pad(n))
        return out

    def string(self, limit: int) -> str:
        raw = self.opaque(limit)
        try:
            return raw.decode()
        except UnicodeDecodeError as exc:
            raise XdrError("a name that is not UTF-8") from exc

    def done(self) -> None:
        if self.pos != len(self.data):
            raise XdrError(f"{len(self.data) - self.pos} bytes left over")


class Packer:
    def __init__(self) -> None:
        self.parts: list[bytes | memoryview] = []
        self.size = 0

    def _add(self, data: bytes | memoryview) -> None:
        self.parts.append(data)
        self.size += len(data)

    def uint(self, value: int) -> None:
        self._add(_U32.pack(value & 0xFFFFFFFF))

    def int32(self, value: int) -> None:
        self._add(_I32.pack(value))

    def uhyper(self, value: int) -> None:
        self._add(_U64.pack(value & 0xFFFFFFFFFFFFFFFF))

    def hyper(self, value: int) -> None:
        self._add(_I64.pack(value))

    def boolean(self, value: bool) -> None:
        self.uint(1 if value else 0)

    def fixed(self, data: bytes | memoryview) -> None:
        self._add(data)
        if pad := _pad(len(data)):
            self._add(b"\0" * pad)

    def opaque(self, data: bytes | memoryview) -> None:
        self.uint(len(data))
        self.fixed(data)

    def string(self, text: str) -> None:
        self.opaque(text.encode())

    def extend(self, other: Packer) -> None:
        self.parts.extend(other.parts)
        self.size += other.size

    def value(self) -> bytes:
        return b"".join(self.parts)
