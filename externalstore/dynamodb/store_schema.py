"""The lancetx schema version of a DynamoDB manifest table, kept in a reserved item.

The item's key is ``base_uri = "__lancetx_schema__"``, ``version = 0``: no
table path can be that string's table (pylance queries only the keys of the
tables it opens), so pylance never reads it. Its ``schema_version`` (N) says
which lancetx layout the items follow. ``lancetx-sync create-table`` stamps a
new table; opening a store checks the stamp once per process (one GetItem,
cached with the table's validation) and refuses a store stamped by a newer
lancetx, whose items this release may misread.

A table without a stamp (created by pylance, the AWS CLI or an older lancetx)
is layout 1 and works as is; :func:`migrate` stamps it. Migrations are
idempotent steps from one layout to the next, one ``match`` arm each.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lancetx.externalstore.dynamodb.config import target_of
from lancetx.externalstore.dynamodb.drivers import run_plan, run_plan_async
from lancetx.externalstore.dynamodb.plans import (
    ApiCall,
    RequestContext,
    Requests,
    _ConditionFailed,
    call_plan,
)
from lancetx.externalstore.errors import StoreSchemaTooNewError

#: The reserved item's hash key.
STAMP_BASE_URI = "__lancetx_schema__"
#: The reserved item's range key.
STAMP_VERSION = 0
#: The attribute holding the layout number.
SCHEMA_ATTRIBUTE = "schema_version"
#: The layout this release writes and reads.
CURRENT_SCHEMA_VERSION = 1

_CHECKED: dict[tuple[str | None, str | None, str], int | None] = {}
_LOCK = threading.Lock()


def stamp_key() -> dict[str, Any]:
    """The primary key of the stamp item."""
    return {"base_uri": {"S": STAMP_BASE_URI}, "version": {"N": str(STAMP_VERSION)}}


def stamp_of(item: Mapping[str, Any] | None) -> int | None:
    """The layout a stamp item records (None: no stamp)."""
    raw = (item or {}).get(SCHEMA_ATTRIBUTE, {}).get("N")
    return int(raw) if raw is not None else None


def read_stamp_plan(ctx: RequestContext) -> Requests[int | None]:
    """The stamped layout (consistent GetItem), as a plan for either driver; None if unstamped."""
    params = {"TableName": ctx.table, "Key": stamp_key(), "ConsistentRead": True}
    response = yield from call_plan(ctx, ApiCall("GetItem", params))
    return stamp_of(response.get("Item"))


def read_stamp(client: Any, table: str) -> int | None:
    """The stamped layout of ``table`` (consistent GetItem); None if unstamped."""
    return run_plan(client, read_stamp_plan(RequestContext(target_of(client, table))))


def write_stamp_plan(ctx: RequestContext, schema_version: int) -> Requests[None]:
    """Stamp the table with ``schema_version`` (one conditional PutItem, as a plan for
    either driver); never lowers an existing stamp."""
    params = {
        "TableName": ctx.table,
        "Item": {
            **stamp_key(),
            # pylance never reads this item, but a path keeps item parsers
            # (ours included) from calling it malformed.
            "path": {"S": STAMP_BASE_URI},
            SCHEMA_ATTRIBUTE: {"N": str(schema_version)},
        },
        "ConditionExpression": "attribute_not_exists(#s) OR #s <= :v",
        "ExpressionAttributeNames": {"#s": SCHEMA_ATTRIBUTE},
        "ExpressionAttributeValues": {":v": {"N": str(schema_version)}},
    }
    # Idempotent, so retried like a read; a failed condition means it was stamped
    # newer meanwhile: never lower it.
    with contextlib.suppress(_ConditionFailed):
        yield from call_plan(ctx, ApiCall("PutItem", params), write=True)
    return None


def write_stamp(client: Any, table: str, schema_version: int) -> None:
    """Stamp ``table`` with ``schema_version``; never lowers an existing stamp."""
    run_plan(client, write_stamp_plan(RequestContext(target_of(client, table)), schema_version))


def stamp_new_table_plan(ctx: RequestContext) -> Requests[int | None]:
    """What ``lancetx-sync create-table`` does to a table it made (or found): refuse a
    stamp newer than this release, and bring an unstamped table to the current
    layout (:func:`migrate_plan`). Returns the stamp found before (None: none).
    Raises StoreSchemaTooNewError."""
    found = yield from read_stamp_plan(ctx)
    _refuse_newer(ctx.table, found)
    if found is None:
        yield from migrate_plan(ctx, found)
    return found


def _cache_key(client: Any, table: str) -> tuple[str | None, str | None, str]:
    meta = getattr(client, "meta", None)
    return (getattr(meta, "endpoint_url", None), getattr(meta, "region_name", None), table)


def _refuse_newer(table: str, found: int | None) -> int | None:
    if found is not None and found > CURRENT_SCHEMA_VERSION:
        raise StoreSchemaTooNewError(table, found, CURRENT_SCHEMA_VERSION)
    return found


def stamp_checked(client: Any, table: str) -> bool:
    """Whether ``table``'s stamp was read in this process (through ``client``'s endpoint
    and region)."""
    with _LOCK:
        return _cache_key(client, table) in _CHECKED


def remember_stamp(client: Any, table: str, found: int | None) -> int | None:
    """Record the stamp ``found`` (read by the caller) for the process, as
    :func:`check_stamp` would, and refuse it if newer. Raises StoreSchemaTooNewError."""
    with _LOCK:
        _CHECKED[_cache_key(client, table)] = found
    return _refuse_newer(table, found)


def check_stamp(client: Any, table: str) -> int | None:
    """Refuse a store stamped by a newer lancetx (one read per table per process).

    Returns the stamped layout (None if unstamped). Raises StoreSchemaTooNewError.
    """
    return check_stamp_with(client, table, lambda plan: run_plan(client, plan))


def check_stamp_with(
    client: Any, table: str, run: Callable[[Requests[int | None]], int | None]
) -> int | None:
    """:func:`check_stamp`, the read performed by ``run`` (e.g. a store's driver, which
    explains a rejected request by the table's layout)."""
    key = _cache_key(client, table)
    with _LOCK:
        cached = key in _CHECKED
        found = _CHECKED.get(key)
    if not cached:
        found = run(read_stamp_plan(RequestContext(target_of(client, table))))
        with _LOCK:
            _CHECKED[key] = found
    return _refuse_newer(table, found)


async def check_stamp_async(client: Any, table: str) -> int | None:
    """:func:`check_stamp` with an aiobotocore client."""
    key = _cache_key(client, table)
    with _LOCK:
        cached = key in _CHECKED
        found = _CHECKED.get(key)
    if not cached:
        found = await run_plan_async(
            client, read_stamp_plan(RequestContext(target_of(client, table)))
        )
        with _LOCK:
            _CHECKED[key] = found
    return _refuse_newer(table, found)


def clear_stamp_cache() -> None:
    """Forget every checked stamp (tests; after a migration)."""
    with _LOCK:
        _CHECKED.clear()


@dataclass(frozen=True)
class MigrationStep:
    """One applied (or, in a dry run, planned) step from layout ``source`` to ``target``."""

    source: int
    target: int
    description: str


def migrate(
    client: Any, table: str, *, target: int = CURRENT_SCHEMA_VERSION, dry_run: bool = False
) -> list[MigrationStep]:
    """Bring ``table`` to layout ``target`` one step at a time; idempotent.

    Raises StoreSchemaTooNewError when the table is newer than this release.
    """
    ctx = RequestContext(target_of(client, table))
    current = run_plan(client, read_stamp_plan(ctx))
    try:
        return run_plan(client, migrate_plan(ctx, current, target=target, dry_run=dry_run))
    finally:
        clear_stamp_cache()


def migrate_plan(
    ctx: RequestContext,
    current: int | None,
    *,
    target: int = CURRENT_SCHEMA_VERSION,
    dry_run: bool = False,
) -> Requests[list[MigrationStep]]:
    """The steps of :func:`migrate` from layout ``current`` (None: unstamped), as a plan
    for either driver."""
    level = 0 if current is None else current
    if level > CURRENT_SCHEMA_VERSION:
        raise StoreSchemaTooNewError(ctx.table, level, CURRENT_SCHEMA_VERSION)
    steps: list[MigrationStep] = []
    while level < target:
        step = _step(level)
        if not dry_run:
            yield from _apply_plan(ctx, step)
        steps.append(step)
        level = step.target
    return steps


def _step(level: int) -> MigrationStep:
    match level:
        case 0:
            return MigrationStep(
                0, 1, "stamp layout 1 (Lance's items; lancetx adds commit_token and bucket)"
            )
        case _:
            raise ValueError(f"no migration from store layout {level}")


def _apply_plan(ctx: RequestContext, step: MigrationStep) -> Requests[None]:
    match step.source:
        case 0:
            # Layout 1 is Lance's own item layout: nothing to rewrite, only the stamp.
            yield from write_stamp_plan(ctx, step.target)
        case _:
            raise ValueError(f"no migration from store layout {step.source}")


__all__ = [
    "CURRENT_SCHEMA_VERSION",
    "SCHEMA_ATTRIBUTE",
    "STAMP_BASE_URI",
    "STAMP_VERSION",
    "MigrationStep",
    "StoreSchemaTooNewError",
    "check_stamp",
    "check_stamp_async",
    "check_stamp_with",
    "clear_stamp_cache",
    "migrate",
    "migrate_plan",
    "read_stamp",
    "read_stamp_plan",
    "remember_stamp",
    "stamp_checked",
    "stamp_new_table_plan",
    "stamp_of",
    "write_stamp",
    "write_stamp_plan",
]
