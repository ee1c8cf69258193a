"""Shallow clone: a new table whose first version is a version of another one.

The clone's first version is committed through lancetx like any creation (version 1,
claimed as every new table's is, so a clone racing another creator of the same
target loses cleanly with TableExistsError). Its manifest is the source version's,
with the source registered as a base path: the clone reads the source's data,
deletion and index files where they are and copies nothing (Lance's Clone
operation, ``is_shallow``). What the clone writes afterwards goes to its own folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from lancetx.commit.engine.committer import Parent
from lancetx.commit.engine.operations import Clone, Transaction
from lancetx.commit.errors import InvalidUriError
from lancetx.commit.format.bases import key_in, parse_base
from lancetx.committing import PlanContext
from lancetx.errors import TableExistsError
from lancetx.protos import table_pb2
from lancetx.state import TableState


def source_path(state: TableState) -> str:
    """How the clone's manifest names the source: the URI of its data (``s3://…`` for an
    ``s3+ddb://`` table: the files are read from S3, the source's version store is not
    the clone's business), a local path made absolute (a relative one would depend on
    the reader's working directory)."""
    uri = state.conn.data_uri.rstrip("/")
    return uri if "://" in uri else os.path.abspath(uri)


def check_apart(source: TableState, ref_path: str, target: TableState) -> None:
    """Refuse a target inside the source's folder, or a source inside the target's:
    maintenance of the outer table would take the inner table's files for garbage."""
    root = parse_base(table_pb2.BasePath(id=0, is_dataset_root=True, path=ref_path))
    store, base = target.conn.handler.store, target.conn.base
    source_key = key_in(store, root, root.key) if root.key else None
    if source_key is None:
        return  # another bucket or store: apart
    inside = base == source_key or base.startswith(source_key + "/")
    outside = source_key.startswith(base + "/") or not base
    if inside or outside:
        where = "is the source" if base == source_key else "and the source are nested"
        raise InvalidUriError(
            target.uri,
            f"the clone {where} ({source.uri}): one table's folder inside the other's "
            "would have its files taken for garbage by the other's cleanup and gc; "
            "clone to a folder outside the source",
        )


@dataclass
class ClonePlan:
    """The Clone transaction of ``source_version`` (a Parent of the source table)."""

    source_uri: str
    ref_path: str
    source_version: Parent

    def __call__(self, ctx: PlanContext) -> Transaction:
        if ctx.parent is not None:
            raise TableExistsError(ctx.uri, ctx.parent.version)
        manifest = self.source_version.manifest
        return Transaction(
            read_version=0,
            operation=Clone(
                is_shallow=True,
                ref_version=self.source_version.version,
                ref_path=self.ref_path,
                source=(manifest.manifest, tuple(manifest.indices or ())),
            ),
        )


__all__ = ["ClonePlan", "check_apart", "source_path"]
