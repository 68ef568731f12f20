"""NFS exports and SMB shares an administrator adds and removes at run time (core layer),
kept in the catalog beside those of the config file.

The exports in force are the config file's (``[nfs.exports]``, or where it sets none "/"
to loopback clients only; ``[smb.shares]``, or where it sets none one share "loomfs" of
the whole namespace) and the catalog's, which ``rest.admin.AdminApi`` adds and removes.
An NFS path, an SMB share name, is exported once: the config's exports are an edit of
the file and a restart, so one added here may not share a path (a name) with them, nor
may they be removed here. The NFS server (``protocols.nfs``) takes its table afresh at
each MNT and EXPORT call, the SMB server (``protocols.smb``) every few seconds, both at
once where the change is made in their own process (``changed``).
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from .. import paths
from ..config import NfsExport, SmbShare
from ..errors import AlreadyExists, ConfigError, InvalidArgument, LoomError, NotFound
from .catalog.base import Catalog

DEFAULT = {"/": NfsExport()}  # what an NFS server serves where the config sets no export
DEFAULT_SHARES = {"loomfs": SmbShare(path="/")}  # an SMB server's where the config sets none
M = TypeVar("M", bound=BaseModel)
# Samba's share names: no brackets, '=', '/', '\' or spaces; some are its own
_SHARE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")
_RESERVED_SHARES = frozenset({"global", "homes", "printers", "ipc$"})


def check_share_name(name: str) -> str:
    if not _SHARE_NAME.match(name) or name.lower() in _RESERVED_SHARES:
        raise ConfigError(
            f"[smb.shares] {name!r} is not a share name: 1-80 letters, digits, '.', '_' or "
            "'-', and none of global, homes, printers"
        )
    return name


def _validated(model: type[M], fields: Mapping[str, Any], what: str) -> M:
    try:
        return model.model_validate(dict(fields))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'export'}: {err['msg']}"
            for err in exc.errors()
        )
        raise InvalidArgument(f"{what}: {problems}") from None


def nfs_export(path: str, fields: Mapping[str, Any]) -> tuple[str, NfsExport]:
    """``path`` and ``fields`` (clients, access, squash, anonymous) as an export, or
    ``InvalidArgument`` saying what is wrong: an absolute namespace path, networks that
    parse, access ro or rw, squash root, all or none."""
    try:
        path = paths.normalize(path)
    except LoomError as exc:
        raise InvalidArgument(f"an NFS export's path: {exc}") from None
    return path, _validated(NfsExport, fields, f"an NFS export of {path}")


def smb_share(name: str, fields: Mapping[str, Any]) -> tuple[str, SmbShare]:
    """``name`` and ``fields`` (path, access) as a share, or ``InvalidArgument`` saying
    what is wrong: a name Samba takes, an absolute namespace path, access ro or rw."""
    try:
        check_share_name(name)
    except ConfigError as exc:
        raise InvalidArgument(str(exc).removeprefix("[smb.shares] ")) from None
    share = _validated(SmbShare, fields, f"the SMB share {name}")
    try:
        return name, share.model_copy(update={"path": paths.normalize(share.path)})
    except LoomError as exc:
        raise InvalidArgument(f"the SMB share {name}'s path: {exc}") from None


class _InForce(ABC, Generic[M]):
    """One protocol's exports in force: ``configured`` (the config file's) and the
    catalog's, each by its name (an NFS export's path, an SMB share's name)."""

    model: ClassVar[type[BaseModel]]
    #: what one is called in messages, the config section they are in, and the field
    #: that names one in a listing
    noun: ClassVar[str]
    section: ClassVar[str]
    field: ClassVar[str]

    def __init__(self, catalog: Catalog, configured: Mapping[str, M]) -> None:
        self.records = catalog.export_records()
        self.configured = {self.name_of(n): x for n, x in configured.items()}
        #: called after each change made here (the server of this process)
        self.changed: list[Callable[[], Awaitable[None]]] = []

    def name_of(self, name: str) -> str:
        return name

    def key(self, name: str) -> str:
        """The name as the catalog keys it (two names with one key are one export)."""
        return name

    def _configured(self, name: str) -> bool:
        return self.key(name) in {self.key(n) for n in self.configured}

    @abstractmethod
    async def _rows(self) -> dict[str, str]: ...

    @abstractmethod
    async def _insert(self, key: str, record: str) -> bool: ...

    @abstractmethod
    async def _delete(self, key: str) -> bool: ...

    async def added(self) -> dict[str, M]:
        """The catalog's (one named as the config names one is the config's)."""
        found: dict[str, M] = {}
        for key, text in (await self._rows()).items():
            record = json.loads(text)
            name = record.pop(self.field, key)
            if not self._configured(name):
                found[name] = self.model.model_validate(record)  # type: ignore[assignment]
        return found

    async def table(self) -> dict[str, M]:
        return {**await self.added(), **self.configured}

    async def listed(self) -> list[dict[str, Any]]:
        """Each with its ``source``: "config" or "catalog", by name."""
        added = await self.added()
        rows = [
            {self.field: name, **export.model_dump(), "source": source}
            for source, table in (("config", self.configured), ("catalog", added))
            for name, export in table.items()
        ]
        return sorted(rows, key=lambda row: str(row[self.field]))

    async def add(self, name: str, export: M) -> dict[str, Any]:
        if self._configured(name):
            raise AlreadyExists(f"{name} is {self.noun} of the config file ({self.section})")
        record = {self.field: name, **json.loads(export.model_dump_json())}
        if not await self._insert(self.key(name), json.dumps(record)):
            raise AlreadyExists(f"{name} is {self.noun} already")
        await self._changed()
        return {self.field: name, **export.model_dump(), "source": "catalog"}

    async def remove(self, name: str) -> None:
        if self._configured(name):
            raise InvalidArgument(
                f"{name} is {self.noun} of the config file: remove it there ({self.section}) "
                "and restart"
            )
        if not await self._delete(self.key(name)):
            raise NotFound(f"{name} is no {self.noun.removeprefix('an ')}")
        await self._changed()

    async def _changed(self) -> None:
        for call in self.changed:
            await call()


class NfsExports(_InForce[NfsExport]):
    """The NFS exports in force, by path."""

    model, noun, section, field = NfsExport, "an NFS export", "[nfs.exports]", "path"

    def __init__(self, catalog: Catalog, configured: Mapping[str, NfsExport]) -> None:
        super().__init__(catalog, configured or DEFAULT)

    def name_of(self, name: str) -> str:
        return paths.normalize(name)

    async def _rows(self) -> dict[str, str]:
        return await self.records.nfs_exports()

    async def _insert(self, key: str, record: str) -> bool:
        return await self.records.add_nfs_export(key, record)

    async def _delete(self, key: str) -> bool:
        return await self.records.remove_nfs_export(key)


class SmbShares(_InForce[SmbShare]):
    """The SMB shares in force, by name (Samba's names are the same in any case)."""

    model, noun, section, field = SmbShare, "an SMB share", "[smb.shares]", "share"

    def __init__(self, catalog: Catalog, configured: Mapping[str, SmbShare]) -> None:
        super().__init__(catalog, configured or DEFAULT_SHARES)

    def key(self, name: str) -> str:
        return name.lower()

    async def _rows(self) -> dict[str, str]:
        return await self.records.smb_shares()

    async def _insert(self, key: str, record: str) -> bool:
        return await self.records.add_smb_share(key, record)

    async def _delete(self, key: str) -> bool:
        return await self.records.remove_smb_share(key)
