"""DynamoDB external manifest store, compatible with Lance's ``s3+ddb://`` tables.

Table layout (Lance's, ``rust/lance-table/src/io/commit/dynamodb.rs``): HASH key
``base_uri`` (S), RANGE key ``version`` (N); attributes ``path`` (S), ``size``
(N), ``committer`` (S), optional ``e_tag`` (S), plus lancetx's optional
``commit_token`` (S), ``bucket`` (S, the bucket of the manifests: Lance's key
omits it) and the transaction in brief — ``txn_operation``, ``txn_uuid``,
``txn_idempotency_key`` (S) — with ``claimed_at`` (N, epoch milliseconds) and, for a
claim made from the commit queue, its ``queue_ticket`` (N) and, while the item points
at the staged manifest, ``lancetx_manifest`` (B: that manifest, zlib-compressed, when
it packs into 8 KiB; the next writer in the queue builds on it without reading the
object, and the flip to the final manifest drops it); pylance ignores them all.

Key items (lancetx only; see :mod:`lancetx.externalstore.base`): ``base_uri`` (S) =
the table's ``base_uri`` + ``#lancetx-keys``, ``version`` (N) = the key's slot (63
bits of its SHA-256), ``idempotency_key`` (S, the key itself: a reader checks it,
two keys may share a slot), ``claimed_version`` (N), ``txn_uuid`` (S),
``commit_token`` (S) and ``committer`` (S). pylance queries only its table's own
``base_uri`` and never sees them. A commit with an idempotency key claims its
version item and its key item in one ``TransactWriteItems`` (two Puts, each with
Lance's ``attribute_not_exists`` condition; IAM: ``dynamodb:PutItem``, which a
writer has already): the same request count as the plain ``PutItem`` it replaces.

The package (everything here is used only by this store, by :mod:`lancetx.externalstore.connect`
and by the DynamoDB-specific operator tools; ``tests/test_layering.py`` keeps it so):

* :mod:`.plans` — every request as a sans-IO plan (building, parsing, paging, retrying,
  resolving an ambiguous write); :mod:`.drivers` performs them (sync and async);
* :mod:`.store` / :mod:`.store_async` — the manifest stores over those plans;
* :mod:`.config` — how to reach DynamoDB (independently of S3), clients;
* :mod:`.commit_queue` — the table's commit queue; :mod:`.store_schema` — the layout
  stamp; :mod:`.table_checks` — what a connection checks beside its first request;
* :mod:`.retry` — the retry policy; :mod:`.botocore_errors` — botocore's exceptions
  translated to :mod:`lancetx.externalstore.errors`;
* :mod:`.uri` — ``s3+ddb://`` URIs and the canonical ``base_uri``.

The asyncio store (:mod:`.store_async`, extra ``async``) is not imported here: the sync
API never needs aioboto3.

Differences from Lance, on purpose:

* DescribeTable also checks the key attribute *types* (Lance checks names only;
  a ``version`` of type S passes there and fails at the first write).
* ``put_if_not_exists`` asks for ``ReturnValuesOnConditionCheckFailure=ALL_OLD``
  and tells "the existing item is mine" (an earlier attempt landed) from
  "another writer's", via the commit token; Lance reports any error as a
  conflict.
* ``put_if_exists`` can require ``path = :expected``, so a pointer flip never
  overwrites a different commit.
* ``delete_all`` paginates.
* Our own bounded, jittered retries (see :mod:`.retry`).
* Endpoint, region and credentials of DynamoDB are configured separately from
  S3 (:class:`DynamoDBConfig`).
"""

from __future__ import annotations

from lancetx.externalstore.dynamodb.config import (
    DEFAULT_COMMITTER,
    DEFAULT_REGION,
    DynamoDBConfig,
    make_client,
)
from lancetx.externalstore.dynamodb.plans import MAX_TRANSACT_ITEMS, TableInfo, create_table_request
from lancetx.externalstore.dynamodb.store import (
    DynamoDBManifestStore,
    clear_validation_cache,
    create_table,
)
from lancetx.externalstore.dynamodb.store_schema import CURRENT_SCHEMA_VERSION, migrate
from lancetx.externalstore.dynamodb.uri import DynamoDBTableUri, parse_ddb_uri
from lancetx.externalstore.errors import StoreSchemaTooNewError

__all__ = [
    "CURRENT_SCHEMA_VERSION",
    "DEFAULT_COMMITTER",
    "DEFAULT_REGION",
    "MAX_TRANSACT_ITEMS",
    "DynamoDBConfig",
    "DynamoDBManifestStore",
    "DynamoDBTableUri",
    "StoreSchemaTooNewError",
    "TableInfo",
    "clear_validation_cache",
    "create_table",
    "create_table_request",
    "make_client",
    "migrate",
    "parse_ddb_uri",
]
