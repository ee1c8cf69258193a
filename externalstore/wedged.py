"""Wedged versions: a claimed version whose manifest is gone, and what may hold it.

pylance treats *any* error of its claiming PutItem as a lost race and deletes
its staged manifest — also when the claim landed and only the answer was lost
(a 5xx after the write, a reset connection). The item then points at a staged
manifest that no longer exists, there is no final manifest, and every later
commit would have to build on that version: the table is wedged.

The version's content is not lost: the writer wrote its transaction file
(``_transactions/{read_version}-{uuid}.txn``) before staging the manifest. The
staging UUID is a fresh uuid4 unrelated to the transaction, so which
transaction file it was cannot be known for certain; the *candidates* are the
transaction files with a read version below the wedged version that no
committed manifest references. ``lancetx-sync repair`` rebuilds the version
from its parent and the candidate the operator picks.

Everything here only reads, and is written as protocol steps
(:mod:`lancetx.externalstore.protocol`), so the sync and async handlers and the
CLI share it:

* :func:`candidate_steps` — the candidate transaction files of a version;
* :func:`explain_wedge` — runs other steps and turns the protocol's
  :class:`ManifestMissingError` into a :class:`WedgedVersionError` naming the
  candidates and the repair command;
* :func:`find_candidates` / :func:`find_candidates_async` — the same for callers
  holding a store pair (the CLI).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, TypeVar

from lancetx.commit.engine.effects import GetObject
from lancetx.commit.errors import LancetxError, ObjectNotFoundError
from lancetx.commit.format.manifest import decode_manifest
from lancetx.commit.format.naming import (
    TRANSACTIONS_DIR,
    NamingScheme,
    join,
    manifest_key,
    parse_manifest_name,
    parse_staged_name,
)
from lancetx.commit.storage.limits import MANIFEST
from lancetx.commit.storage.objectstore import ObjectMeta, ObjectStore
from lancetx.externalstore.base import (
    AsyncExternalManifestStore,
    ExternalManifestStore,
    ManifestEntry,
)
from lancetx.externalstore.errors import (
    EntryNotFoundError,
    ManifestMissingError,
    TableCollisionError,
    UntrustedManifestPathError,
    WedgedVersionError,
    repair_command,
)
from lancetx.externalstore.identity import holds_manifests
from lancetx.externalstore.protocol import (
    GetEntry,
    ListEntries,
    ListObjects,
    Steps,
    Table,
    run,
    run_async,
    validate_entry,
)

if TYPE_CHECKING:  # aioboto3 costs ~0.6 s to import; sync callers never need it
    from lancetx.commit.storage.s3store_async import AsyncObjectStore

__all__ = [
    "candidate_steps",
    "explain_wedge",
    "find_candidates",
    "find_candidates_async",
    "parse_transaction_name",
    "table_uri",
]

T = TypeVar("T")

_TXN_NAME = re.compile(r"^(?P<read_version>[0-9]+)-(?P<uuid>[^/]+)\.txn$")


def parse_transaction_name(name: str) -> tuple[int, str] | None:
    """``(read_version, uuid)`` of a transaction file name ``{read_version}-{uuid}.txn``."""
    match = _TXN_NAME.match(name)
    if match is None:
        return None
    return int(match.group("read_version")), match.group("uuid")


def candidate_steps(table: Table, version: int) -> Steps[list[str]]:
    """Keys of the transaction files that may hold wedged ``version``, sorted.

    A candidate has a read version below ``version`` and its transaction
    (by UUID, so a file rewritten after a rebase counts once) is in no
    committed manifest other than ``version``'s. Reads the ``_transactions/``
    listing, the entries after the lowest candidate read version, and those
    versions' manifests (only the ones that could have committed a candidate).
    """
    prefix = join(table.base_key, TRANSACTIONS_DIR) + "/"
    listed: list[ObjectMeta] = yield ListObjects(prefix)
    files: dict[str, tuple[int, str]] = {}
    for meta in listed:
        parsed = parse_transaction_name(meta.key[len(prefix) :])
        if parsed is not None and parsed[0] < version:
            files[meta.key] = parsed
    if not files:
        return []
    lowest = min(read_version for read_version, _ in files.values())
    committed = yield from _committed_transaction_uuids(table, lowest, version)
    return sorted(key for key, (_, uuid) in files.items() if uuid not in committed)


def _committed_transaction_uuids(table: Table, since: int, skip: int) -> Steps[set[str]]:
    """UUIDs of the transactions committed by versions after ``since`` (except ``skip``)."""
    entries: list[ManifestEntry] = yield ListEntries(table.base_uri, since)
    paths: dict[int, list[str]] = {}
    for entry in entries:
        if entry.version == skip:
            continue
        try:
            validate_entry(table, entry)
        except UntrustedManifestPathError:
            continue  # never followed (verify reports it); its manifest is not ours
        paths[entry.version] = [entry.path]
    # Versions committed before the table used the external store have no entry.
    versions_prefix = table.versions_prefix()
    listed: list[ObjectMeta] = yield ListObjects(versions_prefix)
    for meta in listed:
        parsed = parse_manifest_name(meta.key[len(versions_prefix) :])
        if parsed is not None and parsed[0] > since and parsed[0] != skip:
            paths.setdefault(parsed[0], []).append(meta.key)
    uuids: set[str] = set()
    for version, keys in sorted(paths.items()):
        final = manifest_key(table.base_key, version, _scheme_of(keys[0]))
        for key in dict.fromkeys([*keys, final]):  # a staged entry may be finalized meanwhile
            try:
                data: bytes = yield GetObject(key, MANIFEST)
            except ObjectNotFoundError:
                continue
            uuids |= _transaction_uuids(data, key)
            break
    return uuids


def _scheme_of(key: str) -> NamingScheme:
    name = key.rsplit("/", 1)[-1]
    staged = parse_staged_name(name)
    if staged is not None:
        return staged.scheme
    parsed = parse_manifest_name(name)
    return parsed[1] if parsed is not None else NamingScheme.V2


def _transaction_uuids(data: bytes, key: str) -> set[str]:
    """The transaction UUIDs a manifest names (its transaction file, its inline transaction)."""
    try:
        manifest = decode_manifest(data, path=key)
    except LancetxError:
        return set()  # an unreadable manifest references nothing we can see
    found: set[str] = set()
    parsed = parse_transaction_name(manifest.manifest.transaction_file)
    if parsed is not None:
        found.add(parsed[1])
    if manifest.transaction is not None and manifest.transaction.uuid:
        found.add(manifest.transaction.uuid)
    return found


def explain_wedge(
    steps: Steps[T],
    table: Table,
    uri: str,
    *,
    dynamodb_table: str | None = None,
    bucket: str | None = None,
) -> Steps[T]:
    """Run ``steps``; a version found with neither staged nor final manifest becomes a
    :class:`WedgedVersionError` with its candidates and the repair command for ``uri``.

    With ``bucket``: an item that does not record its bucket (pylance's), with no
    candidate, in a bucket holding no manifest of the table, belongs to another
    bucket's table at the same path: :class:`TableCollisionError`.
    """
    try:
        return (yield from steps)
    except (WedgedVersionError, TableCollisionError):
        raise
    except ManifestMissingError as missing:
        if missing.base_uri != table.base_uri:
            raise
        candidates = yield from candidate_steps(table, missing.version)
        if not candidates and bucket is not None:
            try:
                entry: ManifestEntry | None = yield GetEntry(table.base_uri, missing.version)
            except EntryNotFoundError:
                entry = None
            if entry is not None and entry.bucket is None:
                holds = yield from holds_manifests(table)
                if not holds:
                    raise TableCollisionError(
                        table.base_uri,
                        missing.version,
                        bucket,
                        None,
                        dynamodb_table,
                        path=entry.path,
                    ) from missing
        raise WedgedVersionError(
            missing.version,
            table.base_uri,
            missing.staged,
            candidates,
            repair_command(uri, missing.version),
            final=missing.final,
            table=dynamodb_table,
        ) from missing


def table_uri(store_uri: str, dynamodb_table: str | None) -> str:
    """The URI a user names the table by: ``s3+ddb://bucket/path?ddbTableName=T`` for
    an S3 table claimed in DynamoDB table ``T``, else the object store's URI."""
    if dynamodb_table and store_uri.startswith("s3://"):
        return f"s3+ddb://{store_uri[len('s3://') :]}?ddbTableName={dynamodb_table}"
    return store_uri


def find_candidates(
    store: ObjectStore, entries: ExternalManifestStore, base: str, version: int
) -> list[str]:
    """The candidate transaction files (keys) of wedged ``version`` of the table at ``base``."""
    return run(candidate_steps(Table(base, base), version), store, entries)


async def find_candidates_async(
    store: AsyncObjectStore, entries: AsyncExternalManifestStore, base: str, version: int
) -> list[str]:
    """The asyncio twin of :func:`find_candidates`."""
    return await run_async(candidate_steps(Table(base, base), version), store, entries)
