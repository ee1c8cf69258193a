"""Candidate transactions for a wedged version, and whether each can rebuild it.

A version is wedged when its item points at a staged manifest that is gone and
no final manifest exists. pylance names its staged manifest with a fresh
uuid4 unrelated to its transaction, so the lost transaction cannot be
identified with certainty: the candidates are the ``_transactions/*.txn``
files with a read version below the wedged one that no committed manifest
references. Each is checked by building the version from its parent; the
operator picks.
"""

from __future__ import annotations

from dataclasses import dataclass

from lancetx.commit.engine.builder import build_manifest
from lancetx.commit.errors import LancetxError
from lancetx.commit.format.fragments import unsafe_file_paths
from lancetx.commit.format.manifest import ManifestFile, read_manifest
from lancetx.commit.format.transaction_file import decode_transaction
from lancetx.commit.storage.limits import TRANSACTION, read_capped
from lancetx.externalstore.wedged import find_candidates, parse_transaction_name
from lancetx.ops.table import OpsTable


@dataclass(frozen=True)
class Candidate:
    """A transaction file that may be the lost commit of a wedged version.

    ``usable`` is whether the version can be built from its parent with it;
    ``problem`` says why not."""

    name: str
    key: str
    read_version: int
    operation: str | None
    usable: bool
    problem: str | None = None


def wedged_candidates(table: OpsTable, version: int, scan: object) -> list[Candidate]:
    """The candidate transactions of wedged ``version`` (listed by
    :func:`lancetx.externalstore.wedged.find_candidates`), each checked by building
    the version from its parent. ``scan`` is verify's TableScan."""
    parent = _parent_manifest(table, scan, version)
    keys = find_candidates(table.store, table.require_entries("repair"), table.base, version)
    out: list[Candidate] = []
    for key in keys:
        name = key.rsplit("/", 1)[-1]
        parsed = parse_transaction_name(name)
        if parsed is None:
            continue
        out.append(_check(table, key, name, parsed[0], parent, version))
    out.sort(key=lambda c: (c.read_version, c.name))
    return out


def _parent_manifest(table: OpsTable, scan: object, version: int) -> ManifestFile | None:
    from lancetx.ops.verify import TableScan

    assert isinstance(scan, TableScan)
    for lv in scan.loaded:
        if lv.version == version - 1:
            return lv.manifest
    meta = scan.listing.finals.get(version - 1)
    if meta is None:
        return None
    try:
        return read_manifest(table.store, meta.key)
    except LancetxError:
        return None


def _check(
    table: OpsTable,
    key: str,
    name: str,
    read_version: int,
    parent: ManifestFile | None,
    version: int,
) -> Candidate:
    try:
        txn = decode_transaction(
            read_capped(table.store, key, TRANSACTION), path=table.store.uri(key)
        )
    except LancetxError as exc:
        return Candidate(name, key, read_version, None, False, str(exc))
    operation = txn.WhichOneof("operation")
    unsafe = unsafe_file_paths(txn)
    if unsafe:
        path, why = unsafe[0]
        return Candidate(
            name, key, read_version, operation, False, f"it names file {path!r} ({why})"
        )
    if parent is None:
        return Candidate(
            name, key, read_version, operation, False, "the parent version is unreadable"
        )
    try:
        build_manifest(
            parent.manifest, parent.indices or [], txn, version=version, transaction_file=name
        )
    except LancetxError as exc:
        return Candidate(name, key, read_version, operation, False, str(exc))
    return Candidate(name, key, read_version, operation, True)
