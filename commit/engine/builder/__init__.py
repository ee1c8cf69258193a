"""Previous manifest + transaction → next manifest, with Lance's semantics.

:func:`build_manifest` is lancetx's ``Transaction::build_manifest`` (Lance
``rust/lance/src/dataset/transaction.rs``; in pylance 14 the code lives in
``rust/lance-table/src/transaction/manifest_build.rs``) together with
``Transaction::restore_old_manifest`` and the manifest checks of
``commit_transaction`` (``rust/lance/src/io/commit.rs``). It works on the
protobuf messages directly (``table_pb2.Manifest``, ``transaction_pb2.Transaction``)
and never mutates its inputs.

Where pylance 14.0.2 (our data plane) behaves differently from the Lance source
we read (9.0.0-beta.10), we follow what pylance 14 *writes*, measured on its own
manifests:

* Fragment ids of an Overwrite on an existing table continue after the
  high-water mark (Lance 9 restarted them at 0).
* Feature flags are computed from the finished manifest, so an UpdateConfig that
  adds the first config key sets writer flag 8 in the same version, and an
  UpdateBases sets flag 16 (Lance 9 computed them before applying those).
* A new table with no data files gets data storage version ``2.2``.

Rules that are ours, stricter than Lance (Lance silently ignores or panics):
a transaction naming fragment ids that are not in the previous version is an
:class:`InvalidTransactionError`; duplicate fragment ids, an UpdateBases base id
that already exists, Merge fragments that reuse a retired fragment id, and
fragments carrying proto fields we do not know are refused.

The result's ``indices`` is the full index list of the new version; Lance writes
an index section only when it is non-empty (``encode_manifest(...,
indices=built.indices or None)``).

Layout: :mod:`.driver` (``build_manifest``: the checks and the order of the
steps), :mod:`.ops` (one module per operation kind: its effect on the manifest),
the shared steps named as such (:mod:`.fragment_ids`, :mod:`.row_ids`,
:mod:`.indices` for index carry-forward, :mod:`.flags` for feature flags,
:mod:`.data_format`, :mod:`.schema`, :mod:`.config`), the working state
(:mod:`.state`), constants and helpers (:mod:`.common`) and the errors
(:mod:`.errors`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The names below are loaded on first use (PEP 562): the error tree imports
# ``.errors``, which runs this package first, and opening a table must not load the
# builder (``tests/test_import_cost.py``).
if TYPE_CHECKING:
    from lancetx.commit.engine.builder.common import (
        DEFAULT_DATA_STORAGE_VERSION,
        FLAG_BASE_PATHS,
        FLAG_DELETION_FILES,
        FLAG_DISABLE_TRANSACTION_FILE,
        FLAG_STABLE_ROW_IDS,
        FLAG_TABLE_CONFIG,
        FRAG_REUSE_INDEX_NAME,
        KNOWN_FEATURE_FLAGS,
        LANCE_FILE_FORMAT,
        MEM_WAL_INDEX_NAME,
        SYSTEM_INDEX_NAMES,
        BuiltManifest,
        fragment_bitmap,
        serialize_bitmap,
    )
    from lancetx.commit.engine.builder.driver import build_manifest
    from lancetx.commit.engine.builder.errors import (
        InvalidTransactionError,
        UnsupportedTransactionError,
    )

_WHERE = {
    **dict.fromkeys(
        (
            "DEFAULT_DATA_STORAGE_VERSION",
            "FLAG_BASE_PATHS",
            "FLAG_DELETION_FILES",
            "FLAG_DISABLE_TRANSACTION_FILE",
            "FLAG_STABLE_ROW_IDS",
            "FLAG_TABLE_CONFIG",
            "FRAG_REUSE_INDEX_NAME",
            "KNOWN_FEATURE_FLAGS",
            "LANCE_FILE_FORMAT",
            "MEM_WAL_INDEX_NAME",
            "SYSTEM_INDEX_NAMES",
            "BuiltManifest",
            "fragment_bitmap",
            "serialize_bitmap",
        ),
        "lancetx.commit.engine.builder.common",
    ),
    "build_manifest": "lancetx.commit.engine.builder.driver",
    "InvalidTransactionError": "lancetx.commit.engine.builder.errors",
    "UnsupportedTransactionError": "lancetx.commit.engine.builder.errors",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_DATA_STORAGE_VERSION",
    "FLAG_BASE_PATHS",
    "FLAG_DELETION_FILES",
    "FLAG_DISABLE_TRANSACTION_FILE",
    "FLAG_STABLE_ROW_IDS",
    "FLAG_TABLE_CONFIG",
    "FRAG_REUSE_INDEX_NAME",
    "KNOWN_FEATURE_FLAGS",
    "LANCE_FILE_FORMAT",
    "MEM_WAL_INDEX_NAME",
    "SYSTEM_INDEX_NAMES",
    "BuiltManifest",
    "InvalidTransactionError",
    "UnsupportedTransactionError",
    "build_manifest",
    "fragment_bitmap",
    "serialize_bitmap",
]
