"""Caps on the objects lancetx reads whole: manifests, transaction files, tags.

Such an object is buffered in memory and decoded (two to three times its size at
the peak), and its name alone says nothing of its size: a stray or hostile object
at a manifest's name would otherwise be read whole on open. Each kind has a cap,
checked against the size the store reports *before* the body is read (one ranged
GET returns both: a tail of at most the cap and the object's total size), so no
more than the cap is ever buffered.

The defaults are far above real files: a manifest holds about 200 bytes per
fragment, so 256 MiB is over a million fragments; a transaction file carries at
most a manifest's worth of fragments; a tag is a few dozen bytes of JSON. Set them
per table with the storage options ``lancetx_max_manifest_bytes``,
``lancetx_max_transaction_bytes`` and ``lancetx_max_tag_bytes``, or per process
with ``LANCETX_MAX_MANIFEST_BYTES``, ``LANCETX_MAX_TRANSACTION_BYTES`` and
``LANCETX_MAX_TAG_BYTES`` (bytes, or with a ``KiB``/``MiB``/``GiB`` suffix; an
option wins over the environment).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Protocol

from lancetx.commit.errors import (
    FormatError,
    ManifestFormatError,
    ManifestTooLargeError,
    ObjectTooLargeError,
    StorageOptionError,
    TransactionFileError,
    TransactionTooLargeError,
)

MANIFEST: Final = "manifest"
TRANSACTION: Final = "transaction file"
TAG: Final = "tag"

_MIB = 1 << 20
DEFAULT_MAX_MANIFEST_BYTES: Final = 256 * _MIB
DEFAULT_MAX_TRANSACTION_BYTES: Final = 256 * _MIB
DEFAULT_MAX_TAG_BYTES: Final = 1 * _MIB

#: kind → (storage option, environment variable).
SETTINGS: Final[dict[str, tuple[str, str]]] = {
    MANIFEST: ("lancetx_max_manifest_bytes", "LANCETX_MAX_MANIFEST_BYTES"),
    TRANSACTION: ("lancetx_max_transaction_bytes", "LANCETX_MAX_TRANSACTION_BYTES"),
    TAG: ("lancetx_max_tag_bytes", "LANCETX_MAX_TAG_BYTES"),
}

_SIZE = re.compile(r"^\s*(\d+)\s*(b|kib|mib|gib|kb|mb|gb)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kib": 1 << 10, "mib": _MIB, "gib": 1 << 30, "kb": 1000, "mb": 10**6, "gb": 10**9}


def parse_size(name: str, raw: str) -> int:
    """``"1048576"``, ``"64MiB"``, ``"1 GiB"`` → bytes; StorageOptionError otherwise."""
    match = _SIZE.match(raw)
    if match is None or int(match.group(1)) <= 0:
        raise StorageOptionError(
            f"option {name}={raw!r} is not a positive size; use bytes or e.g. 64MiB"
        )
    return int(match.group(1)) * _UNITS[(match.group(2) or "b").lower()]


@dataclass(frozen=True)
class ReadLimits:
    """The cap, in bytes, on each kind of object read whole."""

    manifest: int = DEFAULT_MAX_MANIFEST_BYTES
    transaction: int = DEFAULT_MAX_TRANSACTION_BYTES
    tag: int = DEFAULT_MAX_TAG_BYTES

    @classmethod
    def from_options(
        cls, options: Mapping[str, str] | None = None, environ: Mapping[str, str] | None = None
    ) -> ReadLimits:
        """Caps from storage options, else the environment, else the defaults."""
        lowered = {k.lower(): v for k, v in (options or {}).items()}
        env = os.environ if environ is None else environ
        values: dict[str, int] = {}
        for kind, field in ((MANIFEST, "manifest"), (TRANSACTION, "transaction"), (TAG, "tag")):
            option, variable = SETTINGS[kind]
            if option in lowered:
                values[field] = parse_size(option, lowered[option])
            elif env.get(variable):
                values[field] = parse_size(variable, env[variable])
        return cls(**values)

    def cap(self, kind: str) -> int:
        """The cap on ``kind`` (:data:`MANIFEST`, :data:`TRANSACTION` or :data:`TAG`)."""
        return {MANIFEST: self.manifest, TRANSACTION: self.transaction, TAG: self.tag}[kind]


class TailReader(Protocol):
    """What a capped read needs of a store (an ``ObjectStore``): the stores hold their
    :class:`ReadLimits`, so this module knows them only by these two methods."""

    def uri(self, key: str) -> str: ...

    def get_tail(self, key: str, length: int) -> tuple[bytes, int]: ...


class AsyncTailReader(Protocol):
    """:class:`TailReader` of an asyncio store (an ``AsyncObjectStore``)."""

    def uri(self, key: str) -> str: ...

    async def get_tail(self, key: str, length: int) -> tuple[bytes, int]: ...


def limits_of(store: TailReader | AsyncTailReader) -> ReadLimits:
    """The caps ``store`` was opened with (see ``open_object_store``), else the
    environment's (a store built directly, or a wrapper around one)."""
    limits = getattr(store, "read_limits", None)
    return limits if isinstance(limits, ReadLimits) else ReadLimits.from_options()


def too_large(path: str, kind: str, size: int, cap: int) -> ObjectTooLargeError:
    """The typed error for an object of ``kind`` over its cap."""
    option, variable = SETTINGS[kind]
    setting = f"storage option {option} or environment variable {variable}"
    if kind == MANIFEST:
        return ManifestTooLargeError(path, kind, size, cap, setting)
    if kind == TRANSACTION:
        return TransactionTooLargeError(path, kind, size, cap, setting)
    return ObjectTooLargeError(path, kind, size, cap, setting)


def _checked(
    store: TailReader | AsyncTailReader, key: str, kind: str, data: bytes, total: int
) -> bytes:
    cap = limits_of(store).cap(kind)
    if total > cap or len(data) > cap:
        raise too_large(store.uri(key), kind, max(total, len(data)), cap)
    if len(data) != total:
        # The tail of a capped read is the whole object; anything else means the
        # object changed between the size and the bytes (or a store misreported).
        error = {MANIFEST: ManifestFormatError, TRANSACTION: TransactionFileError}.get(
            kind, FormatError
        )
        raise error(
            store.uri(key), f"changed while being read (expected {total} bytes, got {len(data)})"
        )
    return data


def read_capped(store: TailReader, key: str, kind: str) -> bytes:
    """The whole object at ``key``, refused with :class:`ObjectTooLargeError` (before
    its body is read) when it is larger than the cap on ``kind``. One request."""
    data, total = store.get_tail(key, limits_of(store).cap(kind))
    return _checked(store, key, kind, data, total)


async def read_capped_async(store: AsyncTailReader, key: str, kind: str) -> bytes:
    """:func:`read_capped` for an asyncio store."""
    data, total = await store.get_tail(key, limits_of(store).cap(kind))
    return _checked(store, key, kind, data, total)


__all__ = [
    "DEFAULT_MAX_MANIFEST_BYTES",
    "DEFAULT_MAX_TAG_BYTES",
    "DEFAULT_MAX_TRANSACTION_BYTES",
    "MANIFEST",
    "SETTINGS",
    "TAG",
    "TRANSACTION",
    "AsyncTailReader",
    "ReadLimits",
    "TailReader",
    "limits_of",
    "parse_size",
    "read_capped",
    "read_capped_async",
    "too_large",
]
