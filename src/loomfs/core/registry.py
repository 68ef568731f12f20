"""URL scheme registry for backends and catalog engines (core layer).

Explicit, lazily imported, refusing duplicates: ``posix://``, ``s3://``, ``sqlite://`` and
``postgresql://`` resolve here, and an unknown scheme is an error that names what is
installed (and which extra to install when a known scheme's package is missing).
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ..errors import UnsupportedScheme

if TYPE_CHECKING:
    from .backends.base import Backend
    from .catalog.base import Catalog


@dataclass(frozen=True, slots=True)
class _Impl:
    target: str  # "module:callable"
    extra: str | None  # the pip extra that brings its dependencies


_BACKENDS: dict[str, _Impl] = {}
_CATALOGS: dict[str, _Impl] = {}


def _register(table: dict[str, _Impl], scheme: str, target: str, extra: str | None) -> None:
    if scheme in table:
        raise ValueError(f"scheme {scheme!r} is already registered to {table[scheme].target}")
    table[scheme] = _Impl(target, extra)


def register_backend(scheme: str, target: str, extra: str | None = None) -> None:
    _register(_BACKENDS, scheme, target, extra)


def register_catalog(scheme: str, target: str, extra: str | None = None) -> None:
    _register(_CATALOGS, scheme, target, extra)


def _load(table: dict[str, _Impl], what: str, url: str) -> object:
    scheme = urlsplit(url).scheme
    impl = table.get(scheme)
    if impl is None:
        known = ", ".join(f"{s}://" for s in sorted(table))
        raise UnsupportedScheme(f"unknown {what} URL scheme {scheme!r} in {url!r}; known: {known}")
    module_name, _, attr = impl.target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f"pip install 'loomfs[{impl.extra}]'" if impl.extra else "reinstall loomfs"
        raise UnsupportedScheme(
            f"{what} scheme {scheme}:// needs a package that is not installed ({exc.name}); "
            f"install it with: {hint}"
        ) from exc
    # The target may be a dotted path inside the module ("PosixBackend.from_url").
    return functools.reduce(getattr, attr.split("."), module)


def open_backend(url: str) -> Backend:
    factory = _load(_BACKENDS, "volume", url)
    return factory(url)  # type: ignore[operator,no-any-return]


def open_catalog(url: str) -> Catalog:
    factory = _load(_CATALOGS, "catalog", url)
    return factory(url)  # type: ignore[operator,no-any-return]


def backend_schemes() -> list[str]:
    return sorted(_BACKENDS)


register_backend("posix", "loomfs.core.backends.posix:PosixBackend.from_url")
register_backend("s3", "loomfs.core.backends.s3:S3Backend.from_url", extra="s3")
register_catalog("sqlite", "loomfs.core.catalog.sqlite:SqliteCatalog.from_url")
register_catalog("postgresql", "loomfs.core.catalog.postgres:PostgresCatalog.from_url", "postgres")
register_catalog("postgres", "loomfs.core.catalog.postgres:PostgresCatalog.from_url", "postgres")
