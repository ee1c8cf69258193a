"""Single-item DynamoDB requests the operator tools need and the commit path does not:
read an item as stored, and delete one item, or mark it removed, only while it is
what we looked at."""

from __future__ import annotations

import base64
import json
import os
import time
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from lancetx.externalstore.dynamodb.botocore_errors import error_code, translate_error
from lancetx.externalstore.dynamodb.config import target_of
from lancetx.externalstore.dynamodb.plans import PATH, REMOVED_AT, key_of
from lancetx.externalstore.dynamodb.store import DynamoDBManifestStore
from lancetx.externalstore.errors import CONDITION_FAILED_CODE


class ItemChangedError(Exception):
    """The item no longer holds the path we looked at (someone changed it meanwhile)."""


def raw_item(entries: DynamoDBManifestStore, base_uri: str, version: int) -> dict[str, Any] | None:
    """The item as stored (every attribute, also ones lancetx does not know)."""
    try:
        response = entries.client.get_item(
            TableName=entries.table_name, Key=key_of(base_uri, version), ConsistentRead=True
        )
    except (ClientError, BotoCoreError) as exc:
        raise translate_error(
            exc, target_of(entries.client, entries.table_name), "GetItem"
        ) from exc
    item = response.get("Item")
    return dict(item) if item else None


def delete_item_if_path(
    entries: DynamoDBManifestStore, base_uri: str, version: int, path: str
) -> None:
    """Delete the item of ``version`` only while it still points at ``path``.

    Raises ItemChangedError if it points elsewhere now (or is gone)."""
    try:
        entries.client.delete_item(
            TableName=entries.table_name,
            Key=key_of(base_uri, version),
            ConditionExpression="#p = :p",
            ExpressionAttributeNames={"#p": "path"},
            ExpressionAttributeValues={":p": {"S": path}},
        )
    except (ClientError, BotoCoreError) as exc:
        if error_code(exc) == CONDITION_FAILED_CODE:
            raise ItemChangedError(f"version {version} of {base_uri!r} changed") from exc
        raise translate_error(
            exc, target_of(entries.client, entries.table_name), "DeleteItem"
        ) from exc


def mark_item_removed(
    entries: DynamoDBManifestStore, base_uri: str, version: int, path: str, at_ms: int
) -> None:
    """Mark the item of ``version`` removed (attribute ``removed_at``, epoch ms), only
    while it still points at ``path``; an item already marked keeps its first date.
    One UpdateItem; the rest of the item is left as it is (pylance ignores the mark).

    Raises ItemChangedError if it points elsewhere now (or is gone)."""
    _update_if_path(
        entries,
        base_uri,
        version,
        path,
        "SET #r = if_not_exists(#r, :r)",
        {":r": {"N": str(at_ms)}},
    )


def unmark_item_removed(
    entries: DynamoDBManifestStore, base_uri: str, version: int, path: str
) -> None:
    """Take the removed mark off the item of ``version`` (its manifest is back), only
    while it still points at ``path``. Raises ItemChangedError otherwise."""
    _update_if_path(entries, base_uri, version, path, "REMOVE #r", {})


def _update_if_path(
    entries: DynamoDBManifestStore,
    base_uri: str,
    version: int,
    path: str,
    update: str,
    values: dict[str, Any],
) -> None:
    try:
        entries.client.update_item(
            TableName=entries.table_name,
            Key=key_of(base_uri, version),
            UpdateExpression=update,
            ConditionExpression="#p = :p",
            ExpressionAttributeNames={"#p": PATH, "#r": REMOVED_AT},
            ExpressionAttributeValues={":p": {"S": path}, **values},
        )
    except (ClientError, BotoCoreError) as exc:
        if error_code(exc) == CONDITION_FAILED_CODE:
            raise ItemChangedError(f"version {version} of {base_uri!r} changed") from exc
        raise translate_error(
            exc, target_of(entries.client, entries.table_name), "UpdateItem"
        ) from exc


def save_backup(item: dict[str, Any], directory: str, table: str, version: int) -> str:
    """Write ``item`` (DynamoDB JSON, as ``aws dynamodb put-item --item`` takes it)
    to a new file in ``directory``; return its path."""
    # Encoded whole before the file is opened: a value that cannot be written leaves
    # no half-written backup behind.
    text = json.dumps(
        {"TableName": table, "Item": item}, indent=2, sort_keys=True, default=_binary_json
    )
    os.makedirs(directory, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = os.path.join(directory, f"lancetx-item-{table}-v{version}-{stamp}.json")
    with open(path, "x", encoding="utf-8") as handle:
        handle.write(text)
    return path


def _binary_json(value: object) -> str:
    # A binary attribute (B, or a member of BS: the handover a queued claim carries
    # in ``lancetx_manifest``) as DynamoDB JSON writes it: base64 text.
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode("ascii")
    raise TypeError(f"an item attribute of type {type(value).__name__} cannot be saved as JSON")
