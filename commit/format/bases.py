"""Base paths: where a file a manifest names lives when it is not under the table's own folder.

A manifest's ``base_paths`` (Lance's multi-base tables and shallow clones) register
other locations by id; a data file, deletion file or index whose ``base_id`` is set
lives under that base instead of the table's folder:

* data file: ``{base}/data/{path}`` when the base is a dataset root, else ``{base}/{path}``;
* deletion file: ``{base}/_deletions/{name}`` (only under a dataset root, as Lance requires);
* index: ``{base}/_indices/{uuid}/`` under a dataset root, else ``{base}/{uuid}/``.

A base path is a URI (``s3://bucket/a/t.lance``; pylance also writes the URI a table
was opened with, ``s3+ddb://bucket/a/t.lance?ddbTableName=T``, and plain local paths).
:func:`parse_base` reads one into a :class:`BaseRoot`; lancetx follows only ``s3``-
and ``file``-style bases (other schemes are kept as given: pylance reads them, lancetx
never touches them). A base whose path could walk up (``..``) or names no bucket is
refused (:class:`BasePathError`): nothing is read, committed or deleted through it.

No I/O here: whether a file lies in a given store is decided from the store's own
URIs (:func:`key_in`), so the engine's steps and the maintenance tools share it.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from lancetx.commit.errors import BasePathError
from lancetx.commit.format import naming
from lancetx.protos import table_pb2

#: Schemes whose bases lancetx follows (Lance's aliases of S3 and of local files).
S3_SCHEMES = frozenset({"s3", "s3a", "s3n", "s3+ddb"})
FILE_SCHEMES = frozenset({"file", "file-object-store"})


class UriNames(Protocol):
    """A store as far as this module needs it: the URI of a key (no I/O)."""

    def uri(self, key: str) -> str: ...


@dataclass(frozen=True)
class BaseRoot:
    """A base path as a location: ``scheme`` (``s3`` or ``file`` for the bases
    lancetx follows, else the scheme as written), ``container`` (the bucket; ``""``
    for local files), ``key`` (the base's key inside it, no slash at either end)."""

    id: int
    path: str
    scheme: str
    container: str
    key: str
    is_dataset_root: bool
    name: str | None = None

    @property
    def followable(self) -> bool:
        """Whether lancetx can address objects under this base (S3 or local files)."""
        return self.scheme in ("s3", "file")

    def object_uri(self, key: str) -> str:
        """The canonical URI of the object ``key`` of this base's container."""
        if self.scheme == "s3":
            return f"s3://{self.container}/{key}"
        if self.scheme == "file":
            return f"file:///{key}"
        return f"{self.scheme}://{self.container}/{key}"

    def describe(self) -> str:
        named = f" ({self.name!r})" if self.name else ""
        return f"base path id {self.id}{named} {self.path!r}"


def _checked_key(path: str, raw: str) -> str:
    key = raw.strip("/")
    for segment in key.split("/") if key else []:
        decoded = urllib.parse.unquote(segment)
        if decoded in ("", ".", "..") or "\\" in decoded or "\x00" in decoded:
            raise BasePathError(path, f"it has a path segment {segment!r}")
    return key


def parse_base(base: table_pb2.BasePath) -> BaseRoot:
    """``base`` as a :class:`BaseRoot`. A local path is made absolute against the
    current directory, as pylance does. Raises BasePathError for a path that could
    walk up the tree, an S3 URI without a bucket, or a file URI naming another host."""
    path = base.path
    name = base.name if base.HasField("name") else None

    def root(scheme: str, container: str, key: str) -> BaseRoot:
        return BaseRoot(base.id, path, scheme, container, key, base.is_dataset_root, name)

    if not path:
        raise BasePathError(path, "it is empty")
    if "\x00" in path or "\\" in path:
        raise BasePathError(path, "it holds a NUL or a backslash")
    if "://" not in path:
        if any(segment == ".." for segment in path.split("/")):
            raise BasePathError(path, "it has a '..' segment")
        absolute = os.path.abspath(path).replace(os.sep, "/")
        return root("file", "", _checked_key(path, absolute))
    parts = urllib.parse.urlsplit(path)
    scheme = parts.scheme.lower()
    if scheme in S3_SCHEMES:
        if not parts.netloc:
            raise BasePathError(path, "the S3 URI names no bucket")
        return root("s3", parts.netloc, _checked_key(path, urllib.parse.unquote(parts.path)))
    if scheme in FILE_SCHEMES:
        if parts.netloc not in ("", "localhost"):
            raise BasePathError(path, f"the file URI names host {parts.netloc!r}")
        return root("file", "", _checked_key(path, urllib.parse.unquote(parts.path)))
    return root(scheme, parts.netloc, parts.path.strip("/"))


def base_roots(manifest: table_pb2.Manifest) -> dict[int, BaseRoot]:
    """The manifest's base paths by id (BasePathError for one that cannot be followed)."""
    return {base.id: parse_base(base) for base in manifest.base_paths}


def data_file_key(root: BaseRoot, path: str) -> str:
    """The key (in the base's container) of a data file named ``path`` under ``root``."""
    prefix = naming.join(root.key, naming.DATA_DIR) if root.is_dataset_root else root.key
    return naming.join(prefix, path) if prefix else path


def deletion_dir_key(root: BaseRoot) -> str:
    """The table folder whose ``_deletions/`` holds a deletion file stored under ``root``.
    Lance keeps deletion files only under dataset roots (BasePathError otherwise)."""
    if not root.is_dataset_root:
        raise BasePathError(
            root.path, "a deletion file is stored under it, but it is not a dataset root"
        )
    return root.key


def index_dir_key(root: BaseRoot, uuid: str) -> str:
    """The folder (key, with a trailing slash) holding index ``uuid`` stored under ``root``."""
    prefix = naming.join(root.key, naming.INDICES_DIR) if root.is_dataset_root else root.key
    return (naming.join(prefix, uuid) if prefix else uuid) + "/"


def key_in(names: UriNames, root: BaseRoot, key: str) -> str | None:
    """``key`` of ``root``'s container as a key of the store ``names``, or None when
    that object is not in this store (another bucket, another kind of store)."""
    if not root.followable or not key:
        return None
    return key if names.uri(key) == root.object_uri(key) else None


def lookup(bases: Mapping[int, BaseRoot], base_id: int, what: str, table: str) -> BaseRoot:
    """The base a file names, or BasePathError saying it is not registered."""
    found = bases.get(base_id)
    if found is None:
        registered = ", ".join(str(i) for i in sorted(bases)) or "none"
        raise BasePathError(
            table,
            f"{what} is stored under base path id {base_id}, which the manifest does not "
            f"register (registered ids: {registered})",
        )
    return found


def referenced_base_ids(
    fragments: Iterable[table_pb2.DataFragment],
    indices: Iterable[table_pb2.IndexMetadata] = (),
) -> dict[int, str]:
    """Every base id the fragments' data and deletion files and the indices use,
    with the first thing found using it (for messages)."""
    out: dict[int, str] = {}
    for fragment in fragments:
        for data_file in fragment.files:
            if data_file.HasField("base_id"):
                out.setdefault(data_file.base_id, f"data file {data_file.path!r}")
        if fragment.HasField("deletion_file") and fragment.deletion_file.HasField("base_id"):
            out.setdefault(
                fragment.deletion_file.base_id, f"the deletion file of fragment {fragment.id}"
            )
    for index in indices:
        if index.HasField("base_id"):
            out.setdefault(index.base_id, f"index {index.name!r}")
    return out


__all__ = [
    "FILE_SCHEMES",
    "S3_SCHEMES",
    "BaseRoot",
    "UriNames",
    "base_roots",
    "data_file_key",
    "deletion_dir_key",
    "index_dir_key",
    "key_in",
    "lookup",
    "parse_base",
    "referenced_base_ids",
]
