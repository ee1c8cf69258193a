"""What a table holds: its DynamoDB items, its manifests, and the files they reference.

Shared by every operator command. Listing is paginated (the store lists
lazily) and the table's folders are listed in parallel; manifests are read in
parallel. A ``progress`` callback hears about every listed object and every
read manifest, so a caller can draw a bar without knowing the details.

Trust: a DynamoDB item's path and a manifest's file names come from whoever
could write them. An item is followed only when the read path would follow it
(:func:`untrusted_entries`: its path is a manifest of its version inside this
table's ``_versions/``, and it was written for this bucket), and a file name only
when it stays inside its folder of the table (:func:`unsafe_references`). The
key helpers here never build a key from a refused name; the tools report what
was refused and delete nothing while anything is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from google.protobuf.message import Message

from lancetx.commit.errors import BasePathError, LancetxError, ObjectNotFoundError
from lancetx.commit.format import naming
from lancetx.commit.format.bases import (
    BaseRoot,
    UriNames,
    data_file_key,
    index_dir_key,
    key_in,
    parse_base,
    referenced_base_ids,
)
from lancetx.commit.format.deletion import deletion_file_key
from lancetx.commit.format.fragments import unsafe_file_paths
from lancetx.commit.format.listing import versions_prefix
from lancetx.commit.format.manifest import ManifestFile, read_manifest
from lancetx.commit.format.naming import NamingScheme
from lancetx.commit.storage.objectstore import ObjectMeta
from lancetx.externalstore.base import ManifestEntry
from lancetx.externalstore.errors import UntrustedManifestPathError
from lancetx.externalstore.protocol import validate_entry
from lancetx.ops.table import OpsTable
from lancetx.protos import table_pb2, transaction_pb2

#: Parallel requests for listing folders and reading manifests.
PARALLELISM = 8

#: ``progress(kind, advance)``: ``kind`` is "list" (objects listed) or "read" (manifests read).
Progress = Callable[[str, int], None]


def no_progress(kind: str, advance: int) -> None:
    del kind, advance


@dataclass(frozen=True)
class StagedObject:
    """A ``_versions/{final}-{uuid}`` object."""

    key: str
    version: int
    scheme: NamingScheme
    token: str
    meta: ObjectMeta


@dataclass
class VersionsListing:
    """``_versions/`` of a table: final manifests by version, staged objects, the rest."""

    finals: dict[int, ObjectMeta] = field(default_factory=dict)
    schemes: dict[int, NamingScheme] = field(default_factory=dict)
    staged: list[StagedObject] = field(default_factory=list)

    def staged_of(self, version: int) -> list[StagedObject]:
        return [s for s in self.staged if s.version == version]

    @property
    def scheme(self) -> NamingScheme | None:
        return next(iter(self.schemes.values()), None)


def list_versions_folder(table: OpsTable, progress: Progress = no_progress) -> VersionsListing:
    """List ``_versions/`` once (paginated)."""
    prefix = versions_prefix(table.base)
    out = VersionsListing()
    for meta in table.store.list(prefix):
        progress("list", 1)
        name = meta.key[len(prefix) :]
        if "/" in name:
            continue
        parsed = naming.parse_manifest_name(name)
        if parsed is not None:
            out.finals[parsed[0]] = meta
            out.schemes[parsed[0]] = parsed[1]
            continue
        staged = naming.parse_staged_name(name)
        if staged is not None:
            out.staged.append(
                StagedObject(meta.key, staged.version, staged.scheme, staged.uuid, meta)
            )
    return out


def list_prefixes(
    table: OpsTable, folders: Sequence[str], progress: Progress = no_progress
) -> dict[str, list[ObjectMeta]]:
    """Every object under each of ``folders`` (relative to the table), listed in parallel."""

    def one(folder: str) -> list[ObjectMeta]:
        found: list[ObjectMeta] = []
        for meta in table.store.list(naming.join(table.base, folder) + "/"):
            found.append(meta)
            progress("list", 1)
        return found

    with ThreadPoolExecutor(max_workers=min(PARALLELISM, max(1, len(folders)))) as pool:
        return dict(zip(folders, pool.map(one, folders), strict=True))


@dataclass(frozen=True)
class LoadedVersion:
    """A committed version's manifest as read from ``key``."""

    version: int
    key: str
    manifest: ManifestFile


#: How :func:`read_manifests` ends the reason of a manifest that is not there (every
#: other reason is a read that failed: what the manifest references is unknown).
MISSING = "is missing"


def read_manifests(
    table: OpsTable, keys: Iterable[tuple[int, str]], progress: Progress = no_progress
) -> tuple[list[LoadedVersion], dict[int, str]]:
    """Read the manifests at ``keys`` (version, key) in parallel.

    Returns the loaded versions (ascending) and, per version that could not be
    read, why (missing, undecodable).
    """

    def one(item: tuple[int, str]) -> LoadedVersion | tuple[int, str]:
        version, key = item
        try:
            for attempt in _with_final(key):
                try:
                    return LoadedVersion(version, attempt, read_manifest(table.store, attempt))
                except ObjectNotFoundError:
                    continue
            return version, f"manifest {table.store.uri(key)} {MISSING}"
        except LancetxError as exc:
            return version, str(exc)
        finally:
            progress("read", 1)

    loaded: list[LoadedVersion] = []
    failed: dict[int, str] = {}
    with ThreadPoolExecutor(max_workers=PARALLELISM) as pool:
        for result in pool.map(one, list(keys)):
            if isinstance(result, LoadedVersion):
                loaded.append(result)
            else:
                failed[result[0]] = result[1]
    loaded.sort(key=lambda lv: lv.version)
    return loaded, failed


def _with_final(key: str) -> list[str]:
    """``key``, then for a staged manifest its final name: a finalizer running
    beside us may copy it and delete the staged object between our listing and our read."""
    folder, _, name = key.rpartition("/")
    staged = naming.parse_staged_name(name)
    if staged is None:
        return [key]
    return [key, f"{folder}/{staged.final_name}" if folder else staged.final_name]


def untrusted_entries(table: OpsTable, entries: Sequence[ManifestEntry]) -> dict[int, str]:
    """Items the read path would refuse to follow, by version, with why: a path that is
    not a manifest of the item's version inside this table's ``_versions/``
    (``UntrustedManifestPathError``), or an item written for another bucket's table
    at the same path (Lance's key omits the bucket)."""
    out: dict[int, str] = {}
    ptable = table.protocol_table
    for entry in entries:
        if entry.bucket is not None and table.bucket is not None and entry.bucket != table.bucket:
            out[entry.version] = (
                f"the item of version {entry.version} was written for bucket {entry.bucket!r}, "
                f"not {table.bucket!r} (another table at the same path shares the DynamoDB table)"
            )
            continue
        try:
            validate_entry(ptable, entry)
        except UntrustedManifestPathError as exc:
            out[entry.version] = str(exc)
    return out


def committed_manifest_keys(
    table: OpsTable, entries: Sequence[ManifestEntry], listing: VersionsListing
) -> dict[int, str]:
    """Where each committed version's manifest should be read from: the item's
    path (staged or final) where there is a trusted item, else the listed final
    manifest. An item :func:`untrusted_entries` refuses is never followed."""
    keys = {version: meta.key for version, meta in listing.finals.items()}
    refused = untrusted_entries(table, entries)
    for entry in entries:
        if entry.version in refused:
            continue
        if entry.is_staged and entry.version in listing.finals:
            continue  # finalized copy exists: same bytes, and the staged one may vanish
        keys[entry.version] = entry.path
    return keys


def unsafe_references(
    manifest: ManifestFile, *, store: UriNames, base: str
) -> list[tuple[str, str]]:
    """``(name, why)`` of every file name in ``manifest`` that could name an object
    outside its folder of the table: data files (``..``, absolute, a URI), the
    transaction file, and files under a base path that cannot be followed or that
    lands inside this table where it must not (see :func:`base_files`)."""
    out = unsafe_file_paths(manifest.manifest)
    name = manifest.manifest.transaction_file
    if name:
        problem = naming.unsafe_transaction_file_name(name)
        if problem is not None:
            out.append((name, problem))
    out += base_files(store, base, manifest, checked=True).unsafe
    return out


@dataclass
class BaseFiles:
    """The files a manifest stores under its base paths that lie inside this table
    (a base registered inside the table's own folders, or the table's own root):
    they are the table's, so kept while referenced and collected like its own.
    Files under a base elsewhere (a clone's source, another bucket) are never the
    table's: no key here, so maintenance never deletes them. ``unsafe``: what
    cannot be followed (an unregistered base id, a base path that walks up) or
    lands inside the table outside the folder its kind belongs in (or is another
    table nested in this one's folders): maintenance refuses to run on it."""

    data: dict[str, int | None] = field(default_factory=dict)
    deletions: set[str] = field(default_factory=set)
    index_dirs: set[str] = field(default_factory=set)
    unsafe: list[tuple[str, str]] = field(default_factory=list)


def _inside(base: str, key: str) -> bool:
    return not base or key.startswith(base + "/")


def _own_key(
    store: UriNames, base: str, root: BaseRoot, key: str, folder: str, out: BaseFiles, name: str
) -> str | None:
    """``key`` (of ``root``'s container) when it is an object inside this table, which
    must then be inside its ``folder``; None when it is elsewhere."""
    own = key_in(store, root, key)
    if own is None or not _inside(base, own):
        return None
    if not own.startswith(naming.join(base, folder) + "/"):
        out.unsafe.append(
            (name, f"under {root.describe()} it is {own!r}, inside this table but not in {folder}/")
        )
        return None
    return own


def base_files(
    store: UriNames, base: str, manifest: ManifestFile, *, checked: bool = False
) -> BaseFiles:
    """The data and deletion files and index folders ``manifest`` keeps under its base
    paths that lie inside the table at ``base`` of ``store`` (see :class:`BaseFiles`).
    ``checked``: also look for files naming a base id the manifest does not register
    (a pass over every file, which a manifest without base paths otherwise skips)."""
    import uuid as uuidlib

    out = BaseFiles()
    if not manifest.manifest.base_paths and not checked:
        return out  # the common case: no file can lie under a base
    used = referenced_base_ids(manifest.manifest.fragments, manifest.indices or [])
    if not used:
        return out
    roots: dict[int, BaseRoot] = {}
    for entry in manifest.manifest.base_paths:
        try:
            root = parse_base(entry)
        except BasePathError as exc:
            if entry.id in used:
                out.unsafe.append((entry.path, exc.problem))
            continue
        roots[root.id] = root
        own = key_in(store, root, root.key)
        if root.is_dataset_root and own is not None and own != base and _inside(base, own):
            out.unsafe.append(
                (
                    entry.path,
                    f"{root.describe()} is a table folder inside this table's: maintenance "
                    "would take that table's files for garbage",
                )
            )
    registered = {e.id for e in manifest.manifest.base_paths}
    for base_id, what in sorted(used.items()):
        if base_id not in registered:
            out.unsafe.append((what, f"its base path id {base_id} is not registered"))
    for fragment in manifest.manifest.fragments:
        for data_file in fragment.files:
            root_or_none = roots.get(data_file.base_id) if data_file.HasField("base_id") else None
            if root_or_none is None or naming.unsafe_relative_path(data_file.path) is not None:
                continue
            key = _own_key(
                store,
                base,
                root_or_none,
                data_file_key(root_or_none, data_file.path),
                naming.DATA_DIR,
                out,
                data_file.path,
            )
            if key is not None:
                out.data[key] = data_file.file_size_bytes or None
        deletion = fragment.deletion_file
        if fragment.HasField("deletion_file") and deletion.HasField("base_id"):
            root_or_none = roots.get(deletion.base_id)
            if root_or_none is None or not root_or_none.is_dataset_root:
                continue
            with contextlib.suppress(LancetxError):
                key = _own_key(
                    store,
                    base,
                    root_or_none,
                    deletion_file_key(root_or_none.key, fragment.id, deletion),
                    naming.DELETIONS_DIR,
                    out,
                    f"deletion file of fragment {fragment.id}",
                )
                if key is not None:
                    out.deletions.add(key)
    for index in manifest.indices or []:
        root_or_none = roots.get(index.base_id) if index.HasField("base_id") else None
        if root_or_none is None or not index.uuid.uuid:
            continue
        folder = index_dir_key(root_or_none, str(uuidlib.UUID(bytes=bytes(index.uuid.uuid))))
        key = _own_key(
            store, base, root_or_none, folder.rstrip("/"), naming.INDICES_DIR, out, index.name
        )
        if key is not None:
            out.index_dirs.add(key + "/")
    return out


@dataclass(frozen=True)
class ForeignFile:
    """A file ``manifest`` reads from a base path outside the table (a clone's source,
    another bucket): ``kind`` "data" or "deletion", ``uri`` in full, ``key`` in the
    table's own store when it is there (same bucket), and the size it records."""

    kind: str
    uri: str
    root: BaseRoot
    key: str
    own_store_key: str | None
    size: int | None


def foreign_files(store: UriNames, base: str, manifest: ManifestFile) -> list[ForeignFile]:
    """The data and deletion files ``manifest`` reads from base paths outside the table
    at ``base`` of ``store`` (never the table's to delete; ``verify --deep`` checks they
    are there). Bases lancetx cannot follow are left out (``unsafe_references``)."""
    out: list[ForeignFile] = []
    roots: dict[int, BaseRoot] = {}
    for entry in manifest.manifest.base_paths:
        with contextlib.suppress(BasePathError):
            roots[entry.id] = parse_base(entry)

    def add(kind: str, root: BaseRoot | None, key: str, size: int | None) -> None:
        if root is None or not root.followable:
            return
        own = key_in(store, root, key)
        if own is not None and _inside(base, own):
            return  # the table's own (see base_files)
        uri = store.uri(own) if own is not None else root.object_uri(key)
        out.append(ForeignFile(kind, uri, root, key, own, size))

    for fragment in manifest.manifest.fragments:
        for data_file in fragment.files:
            if (
                data_file.HasField("base_id")
                and naming.unsafe_relative_path(data_file.path) is None
            ):
                root = roots.get(data_file.base_id)
                if root is not None:
                    add(
                        "data",
                        root,
                        data_file_key(root, data_file.path),
                        data_file.file_size_bytes or None,
                    )
        deletion = fragment.deletion_file
        if fragment.HasField("deletion_file") and deletion.HasField("base_id"):
            root = roots.get(deletion.base_id)
            if root is not None and root.is_dataset_root:
                with contextlib.suppress(LancetxError):
                    add("deletion", root, deletion_file_key(root.key, fragment.id, deletion), None)
    return out


def data_file_keys(base: str, manifest: ManifestFile, *, store: UriNames) -> dict[str, int | None]:
    """Data files of ``manifest`` in this table (files in a base elsewhere are not
    ours; see :func:`base_files`), with their recorded sizes where the manifest has
    them. A path that could leave ``data/`` (see :func:`unsafe_references`) yields no key."""
    out: dict[str, int | None] = {}
    for fragment in manifest.manifest.fragments:
        for data_file in fragment.files:
            if data_file.HasField("base_id"):
                continue
            if naming.unsafe_relative_path(data_file.path) is not None:
                continue
            size = data_file.file_size_bytes or None
            out[naming.join(base, naming.DATA_DIR, data_file.path)] = size
    out.update(base_files(store, base, manifest).data)
    return out


def deletion_keys(base: str, manifest: ManifestFile, *, store: UriNames) -> set[str]:
    out: set[str] = set()
    for fragment in manifest.manifest.fragments:
        if fragment.HasField("deletion_file") and not fragment.deletion_file.HasField("base_id"):
            out.add(deletion_file_key(base, fragment.id, fragment.deletion_file))
    return out | base_files(store, base, manifest).deletions


def transaction_key_of(base: str, manifest: ManifestFile) -> str | None:
    """The key of ``manifest``'s transaction file (None without one, or for a name
    that could leave ``_transactions/``)."""
    name = manifest.manifest.transaction_file
    if not name or naming.unsafe_transaction_file_name(name) is not None:
        return None
    return naming.transaction_key(base, name)


def index_prefixes(base: str, manifest: ManifestFile, *, store: UriNames) -> set[str]:
    """``_indices/{uuid}/`` of each index of ``manifest`` (an index under a base path:
    its folder when that lies inside this table, see :func:`base_files`)."""
    import uuid as uuidlib

    out: set[str] = set(base_files(store, base, manifest).index_dirs)
    for index in manifest.indices or []:
        if index.HasField("base_id"):
            continue
        if index.uuid.uuid:
            name = str(uuidlib.UUID(bytes=bytes(index.uuid.uuid)))
            out.add(naming.join(base, naming.INDICES_DIR, name) + "/")
    return out


def transaction_keys(
    base: str,
    txn: Message,
    *,
    store: UriNames | None = None,
    bases: Mapping[int, BaseRoot] | None = None,
) -> set[str]:
    """Data and deletion files a transaction names (every DataFragment in it, at any depth):
    what its writer will reference once it commits. A file under a base path (one of
    ``bases``, the table's, or one the transaction registers itself) counts when it
    lies in this table's ``data/`` or ``_deletions/`` of ``store``."""
    known = dict(bases or {})
    if isinstance(txn, transaction_pb2.Transaction):
        registered = [*txn.overwrite.initial_bases, *txn.update_bases.new_bases]
        for entry in registered:
            with contextlib.suppress(BasePathError):
                known.setdefault(entry.id, parse_base(entry))
    return _fragment_keys(base, txn, store, known)


def _fragment_keys(
    base: str, msg: Message, store: UriNames | None, bases: Mapping[int, BaseRoot]
) -> set[str]:
    out: set[str] = set()
    if isinstance(msg, table_pb2.DataFragment):
        for data_file in msg.files:
            if naming.unsafe_relative_path(data_file.path) is not None:
                continue
            if not data_file.HasField("base_id"):
                out.add(naming.join(base, naming.DATA_DIR, data_file.path))
                continue
            root = bases.get(data_file.base_id)
            own = (
                key_in(store, root, data_file_key(root, data_file.path))
                if root is not None and store is not None
                else None
            )
            if own is not None and own.startswith(naming.join(base, naming.DATA_DIR) + "/"):
                out.add(own)
        deletion = msg.deletion_file
        if msg.HasField("deletion_file") and not deletion.HasField("base_id"):
            with contextlib.suppress(LancetxError):
                out.add(deletion_file_key(base, msg.id, deletion))
        elif msg.HasField("deletion_file") and store is not None:
            root = bases.get(deletion.base_id)
            if root is not None and root.is_dataset_root:
                with contextlib.suppress(LancetxError):
                    own = key_in(store, root, deletion_file_key(root.key, msg.id, deletion))
                    if own is not None and own.startswith(
                        naming.join(base, naming.DELETIONS_DIR) + "/"
                    ):
                        out.add(own)
        return out
    for field_descriptor, value in msg.ListFields():
        if field_descriptor.message_type is None:
            continue
        if field_descriptor.message_type.GetOptions().map_entry:
            continue
        values = value if field_descriptor.is_repeated else [value]
        for item in values:
            out |= _fragment_keys(base, item, store, bases)
    return out


def known_bases(loaded: Iterable[LoadedVersion]) -> dict[int, BaseRoot]:
    """The base paths the loaded versions register (a base is never unregistered:
    the newest registration of an id wins), those that can be followed."""
    out: dict[int, BaseRoot] = {}
    for lv in loaded:
        for entry in lv.manifest.manifest.base_paths:
            with contextlib.suppress(BasePathError):
                out[entry.id] = parse_base(entry)
    return out


def referenced_keys(base: str, manifest: ManifestFile, *, store: UriNames) -> set[str]:
    """Every object of the table ``manifest`` needs (data, deletion and transaction files)."""
    keys = set(data_file_keys(base, manifest, store=store)) | deletion_keys(
        base, manifest, store=store
    )
    txn = transaction_key_of(base, manifest)
    if txn is not None:
        keys.add(txn)
    return keys
