"""Resolve a table URI to an object store and the table's base key in it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final
from urllib.parse import unquote, urlsplit

from lancetx.commit.errors import InvalidUriError
from lancetx.commit.storage.limits import ReadLimits
from lancetx.commit.storage.localstore import LocalObjectStore
from lancetx.commit.storage.objectstore import ObjectStore

#: Storage option that declares an S3 bucket legacy (see :class:`S3ObjectStore`).
LEGACY_S3_OPTION: Final = "lancetx_legacy_s3"
#: Storage option that declares S3 listings possibly stale (``consistent_list=False``).
CONSISTENT_LIST_OPTION: Final = "lancetx_consistent_list"

SUPPORTED_SCHEMES: Final = ("file", "s3", "s3+ddb")


def _option(options: Mapping[str, str], name: str) -> str | None:
    for key, value in options.items():
        if key.lower() == name:
            return value
    return None


def open_object_store(
    uri: str, options: Mapping[str, str] | None = None, *, legacy: bool | None = None
) -> tuple[ObjectStore, str]:
    """The store holding the table at ``uri`` and the table's base key in it.

    * ``file:///a/b``, ``/a/b`` and relative paths (made absolute) →
      ``LocalObjectStore("/")`` and ``"a/b"``;
    * ``s3://bucket/a/b`` → ``S3ObjectStore("bucket")`` and ``"a/b"``;
    * ``s3+ddb://bucket/a/b?ddbTableName=T`` → the same S3 store; the query
      is for the DynamoDB side (``lancetx.externalstore``) and ignored here.

    The path of a ``file:`` or ``s3:`` URI is percent-decoded as Lance does
    (``s3://b/a%20b`` is the key ``a b``); a plain path is taken literally. A
    trailing slash is dropped. ``options`` are storage options
    (:meth:`S3Config.from_options`); ``legacy`` (or, when it is None, the
    option ``lancetx_legacy_s3=true``) declares the S3 bucket legacy, and the
    option ``lancetx_consistent_list=false`` declares its listings possibly
    stale. Both are ignored for local paths, which always support atomic
    create-if-absent. ``lancetx_max_manifest_bytes``, ``lancetx_max_transaction_bytes``
    and ``lancetx_max_tag_bytes`` cap the objects read whole
    (:mod:`lancetx.commit.storage.limits`).
    """
    opts: Mapping[str, str] = options or {}
    store, base = _open(uri, opts, legacy)
    # Caps on manifests, transaction files and tags read whole (lancetx_max_*_bytes).
    store.read_limits = ReadLimits.from_options(opts)
    return store, base


def _open(uri: str, opts: Mapping[str, str], legacy: bool | None) -> tuple[ObjectStore, str]:
    if "://" not in uri:
        if not uri:
            raise InvalidUriError(uri, "empty table URI")
        return LocalObjectStore("/"), _local_key(os.path.abspath(uri))
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise InvalidUriError(
                uri,
                f"file URI names host {parts.netloc!r}; only local paths "
                "(file:///path) are supported",
            )
        return LocalObjectStore("/"), _local_key(os.path.abspath(unquote(parts.path) or "/"))
    if scheme in ("s3", "s3+ddb"):
        # botocore is imported by an S3 table's store only: opening a local table
        # loads none of it (``tests/test_import_cost.py``).
        from lancetx.commit.storage.s3store import S3Config, S3ObjectStore, parse_bool_option

        bucket = parts.netloc
        if not bucket:
            raise InvalidUriError(uri, f"S3 URI has no bucket; use {scheme}://bucket/path")
        if legacy is None:
            raw = _option(opts, LEGACY_S3_OPTION)
            legacy = parse_bool_option(LEGACY_S3_OPTION, raw) if raw is not None else False
        raw_consistent = _option(opts, CONSISTENT_LIST_OPTION)
        consistent = (
            parse_bool_option(CONSISTENT_LIST_OPTION, raw_consistent)
            if raw_consistent is not None
            else True
        )
        store = S3ObjectStore(
            bucket,
            config=S3Config.from_options(opts),
            legacy=legacy,
            consistent_list=consistent,
        )
        return store, unquote(parts.path).strip("/")
    raise InvalidUriError(
        uri,
        f"unsupported URI scheme {parts.scheme!r}; supported: "
        + ", ".join(f"{s}://" for s in SUPPORTED_SCHEMES)
        + " and plain local paths",
    )


def _local_key(path: str) -> str:
    return path.replace(os.sep, "/").strip("/")


__all__ = ["CONSISTENT_LIST_OPTION", "LEGACY_S3_OPTION", "SUPPORTED_SCHEMES", "open_object_store"]
