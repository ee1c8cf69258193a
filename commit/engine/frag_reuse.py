"""The fragment reuse index: reading, merging and writing its details.

A compaction that defers index remapping (Lance's ``defer_index_remap``)
records how row addresses moved in the singleton index ``__lance_frag_reuse``:
one *version* entry per such compaction (the table version it was made at, and
per rewrite group the old and new fragments and the changed row addresses).
Indices built before the compaction stay usable through it; a cleanup later
drops the versions every index has caught up with (a CreateIndex that replaces
the index with fewer versions).

Concurrent commits touching this index are rebased by merging version lists
(the spec's "Accumulates fragment reuse index updates when concurrent
Rewrites change fragment IDs"):

* against what the committed side *added* (a deferred compaction's new
  version), ours gains it;
* against what the committed side *removed* (a cleanup), ours loses it.

Details are stored inline in the index metadata, or (over 200 KiB, as Lance
does) as an ``InlineContent`` message in ``_indices/{uuid}/details.binpb``.
"""

from __future__ import annotations

import time
import uuid as uuidlib
from collections.abc import Iterable, Sequence

from pyroaring import BitMap

from lancetx.commit.engine.operations import FRAG_REUSE_INDEX_NAME, IndexMetadata
from lancetx.commit.errors import FormatError
from lancetx.commit.format.naming import join
from lancetx.commit.storage.objectstore import ObjectStore
from lancetx.protos import table_pb2

__all__ = [
    "DETAILS_FILE_NAME",
    "INLINE_LIMIT",
    "FragReuseVersion",
    "build_frag_reuse_index",
    "merge_versions",
    "read_versions",
]

FragReuseVersion = table_pb2.FragmentReuseIndexDetails.Version
_Details = table_pb2.FragmentReuseIndexDetails
_Inline = table_pb2.FragmentReuseIndexDetails.InlineContent

#: Lance keeps details inline up to this many encoded bytes, else in a file.
INLINE_LIMIT = 204_800
#: The details file under ``_indices/{uuid}/``.
DETAILS_FILE_NAME = "details.binpb"
_TYPE_URL = "/lance.table.FragmentReuseIndexDetails"


def _uuid_text(index: IndexMetadata) -> str:
    return str(uuidlib.UUID(bytes=bytes(index.uuid.uuid)))


def read_versions(store: ObjectStore, base: str, index: IndexMetadata) -> list[FragReuseVersion]:
    """The version entries of a fragment reuse index, oldest first.

    Raises FormatError when the details are not a fragment reuse index's."""
    where = f"{store.uri(base)} index {index.name!r} ({_uuid_text(index)})"
    if not index.index_details.type_url.endswith("FragmentReuseIndexDetails"):
        raise FormatError(
            where,
            f"details of type {index.index_details.type_url!r} are not a fragment reuse index's",
        )
    details = _Details()
    details.ParseFromString(index.index_details.value)
    kind = details.WhichOneof("content")
    if kind == "inline":
        return list(details.inline.versions)
    if kind == "external":
        key = join(base, "_indices", _uuid_text(index), details.external.path)
        data = store.get(key)
        start = details.external.offset
        content = _Inline()
        content.ParseFromString(data[start : start + details.external.size])
        return list(content.versions)
    raise FormatError(where, "the fragment reuse index details have no content")


def merge_versions(
    ours: Sequence[FragReuseVersion],
    read: Sequence[FragReuseVersion],
    theirs: Sequence[FragReuseVersion],
) -> list[FragReuseVersion]:
    """Ours' versions with the committed side's changes relative to ``read``
    (the index as ours read it) applied: versions it removed are dropped,
    versions it added are kept. Versions are told apart by their table version."""
    read_at = {v.dataset_version for v in read}
    theirs_at = {v.dataset_version for v in theirs}
    removed = read_at - theirs_at
    kept = [v for v in ours if v.dataset_version not in removed]
    have = {v.dataset_version for v in kept}
    added = [
        v for v in theirs if v.dataset_version not in read_at and v.dataset_version not in have
    ]
    return sorted([*kept, *added], key=lambda v: v.dataset_version)


def _new_fragment_ids(versions: Iterable[FragReuseVersion]) -> BitMap:
    return BitMap(int(f.id) for v in versions for group in v.groups for f in group.new_fragments)


def build_frag_reuse_index(
    store: ObjectStore,
    base: str,
    versions: Sequence[FragReuseVersion],
    *,
    dataset_version: int,
    template: IndexMetadata | None = None,
) -> IndexMetadata:
    """New metadata (a new uuid) for a fragment reuse index holding ``versions``.

    Large details are written to ``_indices/{uuid}/details.binpb`` first.
    ``template`` (the index being replaced) supplies the index format version."""
    index_id = uuidlib.uuid4()
    content = _Inline(versions=list(versions))
    details = _Details()
    encoded = content.SerializeToString()
    if len(encoded) > INLINE_LIMIT:
        store.put(join(base, "_indices", str(index_id), DETAILS_FILE_NAME), encoded)
        details.external.path = DETAILS_FILE_NAME
        details.external.offset = 0
        details.external.size = len(encoded)
    else:
        details.inline.CopyFrom(content)
    index = IndexMetadata(name=FRAG_REUSE_INDEX_NAME, dataset_version=dataset_version)
    index.uuid.uuid = index_id.bytes
    index.fragment_bitmap = _new_fragment_ids(versions).serialize()
    index.index_details.type_url = (
        template.index_details.type_url if template is not None else _TYPE_URL
    )
    index.index_details.value = details.SerializeToString()
    if template is not None and template.HasField("index_version"):
        index.index_version = template.index_version
    else:
        index.index_version = 0
    index.created_at = int(time.time() * 1000)
    return index
