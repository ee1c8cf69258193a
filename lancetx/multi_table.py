"""``lancetx.commit_many``: commit to several tables at once, all or nothing.

Example (two tables in the same bucket or not, one DynamoDB table)::

    import lancetx
    versions = lancetx.commit_many(
        {
            "s3+ddb://lake/orders.lance?ddbTableName=manifests": orders_txn,
            "s3+ddb://lake/order_lines.lance?ddbTableName=manifests": lines_txn,
        },
        expected_versions={"s3+ddb://lake/orders.lance?ddbTableName=manifests": 41},
        storage_options=options,
        commit_message="load batch 7",
    )
    # {"s3+ddb://lake/orders.lance?...": 42, "s3+ddb://lake/order_lines.lance?...": 17}

Every new version is claimed in one DynamoDB ``TransactWriteItems``, so a
reader resolving versions through DynamoDB (lancetx, pylance ``s3+ddb://``)
sees all of them or none, even if the writer dies right after the claim (a
reader finishes a claimed version). See
:mod:`lancetx.externalstore.multi_table` for the protocol.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any, TypeVar

from lancetx.commit.engine.committer import CommitOptions
from lancetx.commit.engine.operations import Transaction
from lancetx.commit.engine.retry import RetryPolicy
from lancetx.externalstore.connect import connect
from lancetx.externalstore.multi_table import DEFAULT_RETRY, TableCommit
from lancetx.externalstore.multi_table import commit_many as _commit_many

__all__ = ["commit_many"]

K = TypeVar("K", bound=Hashable)


def _uri_of(key: Any) -> str:
    if isinstance(key, str):
        return key
    uri = getattr(key, "uri", None)
    if isinstance(uri, str):
        return uri
    raise TypeError(
        f"commit_many keys must be table URIs or tables with a .uri, not {type(key).__name__}"
    )


def _options_of(key: Any, default: Mapping[str, str] | None) -> Mapping[str, str] | None:
    if default is not None:
        return default
    own = getattr(key, "storage_options", None)
    return own if isinstance(own, Mapping) else None


def commit_many(
    transactions: Mapping[K, Transaction],
    *,
    expected_versions: Mapping[K, int] | Mapping[str, int] | None = None,
    storage_options: Mapping[str, str] | None = None,
    commit_message: str | None = None,
    properties: Mapping[str, str] | None = None,
    retry: RetryPolicy = DEFAULT_RETRY,
) -> dict[K, int]:
    """Commit one transaction per table atomically; returns each table's new version.

    ``transactions`` maps a table (its URI, or a table object with ``.uri``
    and optionally ``.storage_options``) to the transaction planned against the
    version it read. ``expected_versions`` (keyed the same way, or by URI)
    makes those tables strict: commit only if each is still at that version.
    ``commit_message`` and ``properties`` are stored in every transaction.

    All tables must claim versions in one DynamoDB table (``s3+ddb://`` URIs
    with the same ``ddbTableName``, endpoint and region); otherwise
    TablesNotColocatedError, before anything is written. A table that moved
    past its expected version raises ExpectedVersionMismatchError naming the
    table, the expected and the actual version, and nothing is committed.
    Conflicts are checked (and deletion vectors rebased) per table as in a
    single commit; a lost claim is retried on the new versions within
    ``retry`` (a time budget), taking turns in the tables' commit queues beside
    other writers. CommitStateUnknownError means the claim may have landed:
    calling again with the same transactions returns the versions that landed
    instead of committing them twice.
    """
    expected: dict[str, int] = {}
    for key, version in (expected_versions or {}).items():
        expected[_uri_of(key)] = version
    options = CommitOptions(properties=dict(properties or {}), commit_message=commit_message)
    keys = list(transactions)
    uris = [_uri_of(key) for key in keys]
    unknown = sorted(set(expected) - set(uris))
    if unknown:
        raise ValueError(f"expected_versions names tables without a transaction: {unknown}")
    commits = [
        TableCommit(
            connection=connect(uri, _options_of(key, storage_options)),
            transaction=transactions[key],
            expected_version=expected.get(uri),
            options=options,
        )
        for key, uri in zip(keys, uris, strict=True)
    ]
    committed = _commit_many(commits, retry=retry)
    return {key: done.version for key, done in zip(keys, committed, strict=True)}
