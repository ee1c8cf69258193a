"""Index remapping for a compaction, computed by pylance in a scratch table.

When a compaction rewrites fragments, every index that holds row *addresses*
(fragment id and offset: any table without stable row ids) points at rows that
moved. Lance remaps such indices while committing the Rewrite: new index files
whose addresses point into the new fragments, swapped in by the Rewrite's
``rewritten_indices``. With ``defer_index_remap`` it writes instead one more
version of the fragment reuse index (``__lance_frag_reuse``: per rewrite group,
the old and new fragments and the moved addresses), which readers apply to the
old indices at query time.

pylance does both only inside ``Compaction.commit``, which commits by itself.
lancetx commits every version of its tables, so it gives pylance a private
*scratch* table on local disk instead: a copy of the read version's manifest
whose indices are the ones to remap, with those indices' files copied in, and
whose fragment-id high-water mark stops just before the ids lancetx reserved in
the real table. pylance's ``Compaction.commit`` there reserves exactly those ids,
remaps, and commits its Rewrite into the scratch table; lancetx reads that
Rewrite back (groups, remapped indices, fragment reuse index), copies the new
index files into the real table's ``_indices/`` and commits the Rewrite itself.
Only index files travel (in and out, through the local disk); data files stay
where the compaction's tasks wrote them, and the scratch table is removed.

The row addresses a remap needs come from the compaction tasks' results
(pylance's ``RewriteResult``), which the scratch commit reads as they are.
"""

from __future__ import annotations

import logging
import os
import tempfile
import uuid as uuidlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lancetx.commit.engine.operations import (
    FRAG_REUSE_INDEX_NAME,
    IndexMetadata,
    RewriteGroup,
    RewrittenIndex,
)
from lancetx.commit.format.manifest import encode_manifest
from lancetx.commit.format.naming import INDICES_DIR, NamingScheme, join, manifest_key
from lancetx.commit.format.snapshot import load_version
from lancetx.commit.storage.localstore import LocalObjectStore
from lancetx.commit.storage.objectstore import ObjectStore
from lancetx.errors import IndexRemapError
from lancetx.protos import table_pb2, transaction_pb2

log = logging.getLogger(__name__)

#: Bytes read per request when an index file is copied to the scratch table.
CHUNK = 64 * 1024 * 1024
#: The scratch table's folder inside its temporary directory.
_SCRATCH = "scratch.lance"


@dataclass
class Remapped:
    """What the scratch commit produced, ready for the real table's Rewrite."""

    groups: tuple[RewriteGroup, ...]
    rewritten_indices: tuple[RewrittenIndex, ...]
    frag_reuse_index: IndexMetadata | None


@dataclass
class Uploads:
    """Keys written to the real table (so a failure can delete them, by the rule)."""

    keys: list[str] = field(default_factory=list)


def index_dir(base: str, index: IndexMetadata) -> str:
    """``{base}/_indices/{uuid}``: where an index's files live."""
    return join(base, INDICES_DIR, str(uuidlib.UUID(bytes=bytes(index.uuid.uuid))))


def remap_in_scratch(
    store: ObjectStore,
    base: str,
    manifest: table_pb2.Manifest,
    results: Sequence[Any],
    *,
    indices: Sequence[IndexMetadata],
    first_id: int,
    options: Mapping[str, Any],
    uploads: Uploads,
    storage_options: Mapping[str, str] | None = None,
) -> Remapped:
    """Run pylance's ``Compaction.commit`` of ``results`` (the tasks' RewriteResults,
    planned against ``manifest``) in a scratch table holding ``indices``, with new
    fragment ids from ``first_id``; copy the indices it wrote into the table at
    ``base`` (recorded in ``uploads`` as they land) and return the Rewrite's parts.

    Remapping reads the indices' files, so they are copied in; a deferred remap
    reads only the fragment reuse index (the others' metadata tells it which
    groups an index covers). An index under another base path (a shallow clone's,
    in its source) is read there by pylance, with ``storage_options``; its remapped
    files are the table's own, like every other's."""
    from lance import dataset as open_dataset
    from lance.optimize import Compaction

    remaps = not options.get("defer_index_remap")
    with tempfile.TemporaryDirectory(prefix="lancetx-remap-") as tmp:
        local = LocalObjectStore(tmp)
        scratch = table_pb2.Manifest()
        scratch.CopyFrom(manifest)
        # pylance's own ReserveFragments in the scratch table then takes exactly
        # the ids reserved in the real table.
        scratch.max_fragment_id = first_id - 1
        local.put(
            manifest_key(_SCRATCH, manifest.version, NamingScheme.V2),
            encode_manifest(scratch, indices=list(indices)),
        )
        for index in indices:
            if (remaps or index.name == FRAG_REUSE_INDEX_NAME) and not index.HasField("base_id"):
                _copy_in(store, base, local, index)
        settings: Any = dict(options)  # pylance's CompactionOptions (a TypedDict)
        scratch_ds = open_dataset(
            os.path.join(tmp, _SCRATCH), storage_options=dict(storage_options or {}) or None
        )
        Compaction.commit(scratch_ds, list(results), settings)
        done = load_version(local, _SCRATCH)
        txn = done.transaction()
        if txn is None or txn.WhichOneof("operation") != "rewrite":
            raise IndexRemapError(
                store.uri(base),
                f"pylance's scratch commit ended at version {done.version} without a Rewrite",
            )
        remapped = _read_back(store.uri(base), txn.rewrite, done.indices, results, first_id)
        had = {bytes(i.uuid.uuid) for i in indices}
        if (
            remapped.frag_reuse_index is not None
            and bytes(remapped.frag_reuse_index.uuid.uuid) in had
        ):
            # pylance added no version (no index covers a rewritten group): the
            # table's index stays as it is, and is not ours to copy (or delete).
            remapped.frag_reuse_index = None
        for item in remapped.rewritten_indices:
            if bytes(item.new_id.uuid) in had:
                raise IndexRemapError(
                    store.uri(base), "pylance's remapped index reuses the uuid of an existing one"
                )
            _copy_out(local, store, base, str(uuidlib.UUID(bytes=bytes(item.new_id.uuid))), uploads)
        reuse = remapped.frag_reuse_index
        if reuse is not None:
            _copy_out(local, store, base, str(uuidlib.UUID(bytes=bytes(reuse.uuid.uuid))), uploads)
        return remapped


def _read_back(
    uri: str,
    rewrite: transaction_pb2.Transaction.Rewrite,
    indices: Sequence[IndexMetadata],
    results: Sequence[Any],
    first_id: int,
) -> Remapped:
    """The scratch Rewrite's parts, checked against what was asked for."""
    count = sum(len(r.new_fragments) for r in results)
    got = sorted(f.id for g in rewrite.groups for f in g.new_fragments)
    wanted = list(range(first_id, first_id + count))
    if got != wanted:
        raise IndexRemapError(
            uri,
            f"pylance gave the compacted fragments ids {got}, but ids {wanted} were reserved "
            "for them; the remapped indices would point at the wrong fragments",
        )
    paths = sorted(f.path for r in results for frag in r.new_fragments for f in frag.files)
    written = sorted(f.path for g in rewrite.groups for frag in g.new_fragments for f in frag.files)
    if paths != written:
        raise IndexRemapError(
            uri, "pylance's scratch Rewrite names other data files than its tasks"
        )
    reuse = [i for i in indices if i.name == FRAG_REUSE_INDEX_NAME]
    return Remapped(
        groups=tuple(rewrite.groups),
        rewritten_indices=tuple(rewrite.rewritten_indices),
        frag_reuse_index=reuse[0] if reuse else None,
    )


def _copy_in(store: ObjectStore, base: str, local: LocalObjectStore, index: IndexMetadata) -> None:
    """The index's files, from the table to the scratch table (in bounded chunks)."""
    source = index_dir(base, index)
    target = os.path.join(local.root, index_dir(_SCRATCH, index))
    names = [f.path for f in index.files] or [
        meta.key[len(source) + 1 :] for meta in store.list(source + "/")
    ]
    for name in names:
        key = join(source, name)
        size = store.head(key).size
        path = os.path.join(target, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as out:
            for start in range(0, size, CHUNK):
                out.write(store.get_range(key, start, min(size, start + CHUNK)))


def _copy_out(
    local: LocalObjectStore, store: ObjectStore, base: str, name: str, uploads: Uploads
) -> None:
    """A directory under the scratch table's ``_indices/``, into the table's."""
    source = os.path.join(local.root, _SCRATCH, INDICES_DIR, name)
    for folder, _, files in os.walk(source):
        for file_name in sorted(files):
            path = os.path.join(folder, file_name)
            relative = os.path.relpath(path, source).replace(os.sep, "/")
            key = join(base, INDICES_DIR, name, relative)
            with open(path, "rb") as data:
                uploads.keys.append(key)  # before the PUT: a failed one may have landed
                store.put(key, data.read())


__all__ = ["CHUNK", "Remapped", "Uploads", "index_dir", "remap_in_scratch"]
