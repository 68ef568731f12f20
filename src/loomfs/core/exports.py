"""NFS exports an administrator adds and removes at run time (core layer), kept in the
catalog beside those of the config file.

The exports in force are the config file's ``[nfs.exports]`` (or, where it sets none, "/"
to loopback clients only) and the catalog's, which ``rest.admin.AdminApi`` adds and
removes. A path is exported once: the config's exports are an edit of the file and a
restart, so one added here may not share a path with them, nor may they be removed here.
The NFS server (``protocols.nfs``) takes the table afresh at each MNT and EXPORT call,
and at once where the change is made in its own process (``changed``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pydantic import ValidationError

from .. import paths
from ..config import NfsExport
from ..errors import AlreadyExists, InvalidArgument, LoomError, NotFound
from .catalog.base import Catalog

DEFAULT = {"/": NfsExport()}  # what an NFS server serves where the config sets no export


def nfs_export(path: str, fields: Mapping[str, Any]) -> tuple[str, NfsExport]:
    """``path`` and ``fields`` (clients, access, squash, anonymous) as an export, or
    ``InvalidArgument`` saying what is wrong: an absolute namespace path, networks that
    parse, access ro or rw, squash root, all or none."""
    try:
        path = paths.normalize(path)
    except LoomError as exc:
        raise InvalidArgument(f"an NFS export's path: {exc}") from None
    try:
        return path, NfsExport.model_validate(dict(fields))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'export'}: {err['msg']}"
            for err in exc.errors()
        )
        raise InvalidArgument(f"an NFS export of {path}: {problems}") from None


class NfsExports:
    """The exports in force: ``configured`` (the config file's) and the catalog's."""

    def __init__(self, catalog: Catalog, configured: Mapping[str, NfsExport]) -> None:
        self.records = catalog.export_records()
        self.configured = {paths.normalize(p): x for p, x in (configured or DEFAULT).items()}
        #: called after each change made here (the NFS server of this process)
        self.changed: list[Callable[[], Awaitable[None]]] = []

    async def added(self) -> dict[str, NfsExport]:
        """The catalog's exports (a path the config also names is the config's)."""
        stored = await self.records.nfs_exports()
        found = {path: NfsExport.model_validate(json.loads(text)) for path, text in stored.items()}
        return {p: x for p, x in found.items() if p not in self.configured}

    async def table(self) -> dict[str, NfsExport]:
        return {**await self.added(), **self.configured}

    async def listed(self) -> list[dict[str, Any]]:
        """Each export with its ``source``: "config" or "catalog", by path."""
        added = await self.added()
        rows = [
            {"path": path, **export.model_dump(), "source": source}
            for source, table in (("config", self.configured), ("catalog", added))
            for path, export in table.items()
        ]
        return sorted(rows, key=lambda row: row["path"])

    async def add(self, path: str, export: NfsExport) -> dict[str, Any]:
        if path in self.configured:
            raise AlreadyExists(f"{path} is exported by the config file ([nfs.exports])", path=path)
        if not await self.records.add_nfs_export(path, export.model_dump_json()):
            raise AlreadyExists(f"{path} is exported already", path=path)
        await self._changed()
        return {"path": path, **export.model_dump(), "source": "catalog"}

    async def remove(self, path: str) -> None:
        if path in self.configured:
            raise InvalidArgument(
                f"{path} is exported by the config file: remove it there ([nfs.exports]) "
                "and restart"
            )
        if not await self.records.remove_nfs_export(path):
            raise NotFound(f"no NFS export at {path}", path=path)
        await self._changed()

    async def _changed(self) -> None:
        for call in self.changed:
            await call()
