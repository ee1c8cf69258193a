"""``lancetx-sync create-table NAME``: a DynamoDB manifest table, stamped."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from lancetx.externalstore.dynamodb.botocore_errors import error_code, translate_error
from lancetx.externalstore.dynamodb.config import DynamoDBConfig, make_client, target_of
from lancetx.externalstore.dynamodb.plans import create_table_request
from lancetx.externalstore.dynamodb.store import create_table
from lancetx.externalstore.dynamodb.store_schema import CURRENT_SCHEMA_VERSION, migrate
from lancetx.externalstore.errors import InvalidConfigError

#: DynamoDB's rule for table names (3 to 255 of these characters); ``s3+ddb://`` URIs
#: accept no other name, so a table named otherwise could never be used.
_TABLE_NAME = re.compile(r"[A-Za-z0-9_.-]{3,255}")


@dataclass(frozen=True)
class CreateTableReport:
    table: str
    dry_run: bool
    created: bool
    status: str | None
    arn: str | None
    billing_mode: str
    point_in_time_recovery: bool
    tags: dict[str, str] = field(default_factory=dict)
    schema_version: int = CURRENT_SCHEMA_VERSION
    request: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return True


def manifest_table_client(storage_options: dict[str, str]) -> Any:
    """The DynamoDB client the storage options (pylance's names) and the environment
    configure, as a table opened with them would reach DynamoDB."""
    return make_client(DynamoDBConfig.from_options(storage_options))


def create_manifest_table(
    client: Any,
    name: str,
    *,
    read_capacity: int | None = None,
    write_capacity: int | None = None,
    tags: dict[str, str] | None = None,
    point_in_time_recovery: bool = False,
    timeout: float = 300.0,
    dry_run: bool = False,
) -> CreateTableReport:
    """Create ``name`` in Lance's layout (on-demand unless capacities are given),
    wait for ACTIVE, optionally enable PITR, and stamp the lancetx store layout.
    An existing table of the right layout is accepted (and stamped)."""
    if not _TABLE_NAME.fullmatch(name):
        raise InvalidConfigError(
            "table name",
            name,
            "DynamoDB table names are 3 to 255 letters, digits, '_', '-' or '.'",
        )
    request = create_table_request(name)
    if read_capacity is not None or write_capacity is not None:
        request["BillingMode"] = "PROVISIONED"
        request["ProvisionedThroughput"] = {
            "ReadCapacityUnits": read_capacity or 5,
            "WriteCapacityUnits": write_capacity or 5,
        }
    if tags:
        request["Tags"] = [{"Key": k, "Value": v} for k, v in sorted(tags.items())]
    billing = str(request["BillingMode"])
    if dry_run:
        return CreateTableReport(
            name,
            True,
            False,
            None,
            None,
            billing,
            point_in_time_recovery,
            tags or {},
            request=request,
        )
    target = target_of(client, name)
    created = True
    try:
        client.create_table(**request)
    except (ClientError, BotoCoreError) as exc:
        if error_code(exc) != "ResourceInUseException":
            raise translate_error(exc, target, "CreateTable") from exc
        created = False
    # Waits for ACTIVE and validates the key schema (its own CreateTable finds ours).
    info = create_table(client, name, wait=True, timeout=timeout)
    if point_in_time_recovery:
        try:
            client.update_continuous_backups(
                TableName=name,
                PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": True},
            )
        except (ClientError, BotoCoreError) as exc:
            raise translate_error(exc, target, "UpdateContinuousBackups") from exc
    migrate(client, name)
    return CreateTableReport(
        name,
        False,
        created,
        info.status,
        info.arn,
        billing,
        point_in_time_recovery,
        tags or {},
        request=request,
    )
