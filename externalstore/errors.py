"""Errors of the external manifest stores.

Every :class:`ExternalStoreError` names the AWS action (``dynamodb:PutItem``,
the IAM action name), the resource (the table's ARN, or an ARN with ``*`` for
the account while DescribeTable has not told us the account) and what to do.
"Table" in a name here means a Lance table, except in the ``DynamoDBTable…``
names. The errors of this layer (``*`` marks ``retryable``; the whole tree is
drawn in :mod:`lancetx.errors`)::

    LancetxError
    ├── ExternalStoreError                 action + resource + message
    │   ├── DynamoDBTableNotFoundError     the DynamoDB table does not exist where we looked
    │   ├── DynamoDBTableSchemaError       its key names or key types are not Lance's
    │   ├── AccessDeniedError              IAM denies the action, or bad credentials
    │   ├── ThrottledError *               still throttled after our retries
    │   ├── EndpointUnreachableError *     could not connect (nothing was sent)
    │   ├── ServiceUnavailableError *      5xx / dropped connection after retries (reads, idempotent writes)
    │   ├── InvalidRequestError            DynamoDB rejected the request (ValidationException…)
    │   │   └── OperationNotImplementedError  the endpoint does not implement the operation (dynalite: transactions)
    │   ├── EntryExistsError               put_if_not_exists lost: another writer holds the version
    │   ├── BatchEntryExistsError              put_all_if_not_exists lost: some version is held
    │   ├── KeyExistsError                 put_with_key_if_not_exists refused: the key is taken
    │   ├── EntryNotFoundError             no entry for (base_uri, version)
    │   ├── EntryMismatchError             put_if_exists refused: the entry points elsewhere
    │   ├── MalformedEntryError            an item's attributes cannot be a manifest entry
    │   └── AmbiguousWriteError *          a write may or may not have landed (same commit token: safe)
    ├── ManifestPointerError               an entry cannot be followed to a manifest
    │   ├── UntrustedManifestPathError     it points outside _versions/ or at another version's name
    │   ├── ManifestMissingError           staged and final manifest are both gone
    │   │   └── WedgedVersionError         ... after a claim that landed: repair from the transaction
    │   ├── ManifestCopyMismatchError *    the final manifest does not hold the staged bytes
    │   ├── TableCollisionError            another bucket's Lance table at the same path shares the items
    │   └── BadEntryError                  what the item points at cannot be trusted
    │       ├── DanglingEntryError         a final manifest that does not exist
    │       ├── CorruptManifestError       not a readable manifest
    │       ├── ManifestVersionMismatchError  a manifest of another version
    │       └── ManifestSizeMismatchError  the item's size differs from the manifest's
    ├── CommitError
    │   ├── TablesNotColocatedError        a multi-table commit over several DynamoDB tables (also a ValueError)
    │   └── MultiTableClaimLostError       a multi-table claim lost one version, so none was claimed
    ├── StoreSchemaTooNewError             the DynamoDB table was stamped by a newer lancetx
    ├── TableMovedError                    the Lance table was migrated to conditional PUT (s3://)
    ├── InvalidUriError (also ValueError)  a malformed s3+ddb:// URI or table path
    └── InvalidConfigError                 a malformed DynamoDB option (also a ValueError)

:func:`lancetx.externalstore.dynamodb.botocore_errors.translate_error` is the
single mapping from botocore exceptions to this tree; the sync and async DynamoDB
stores both use it (aiobotocore raises botocore's exception classes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lancetx.commit.errors import CommitError, InvalidUriError, LancetxError
from lancetx.externalstore.base import KeyRecord, ManifestEntry

__all__ = [
    "ACCESS_CODES",
    "AccessDeniedError",
    "AmbiguousWriteError",
    "BadEntryError",
    "BatchEntryExistsError",
    "CorruptManifestError",
    "DanglingEntryError",
    "DynamoDBTableNotFoundError",
    "DynamoDBTableSchemaError",
    "DynamoDBTarget",
    "EndpointUnreachableError",
    "EntryExistsError",
    "EntryMismatchError",
    "EntryNotFoundError",
    "ExternalStoreError",
    "InvalidConfigError",
    "InvalidRequestError",
    "InvalidUriError",
    "KeyExistsError",
    "MalformedEntryError",
    "ManifestCopyMismatchError",
    "ManifestMissingError",
    "ManifestPointerError",
    "ManifestSizeMismatchError",
    "ManifestVersionMismatchError",
    "MultiTableClaimLostError",
    "OperationNotImplementedError",
    "ServiceUnavailableError",
    "StoreSchemaTooNewError",
    "TableCollisionError",
    "TableMovedError",
    "TablesNotColocatedError",
    "ThrottledError",
    "UntrustedManifestPathError",
    "WedgedVersionError",
    "create_table_hint",
    "repair_command",
]

#: Error codes meaning the caller is not allowed (IAM) or not authenticated.
ACCESS_CODES = frozenset(
    {
        "AccessDeniedException",
        "UnrecognizedClientException",
        "InvalidSignatureException",
        "MissingAuthenticationTokenException",
        "ExpiredTokenException",
        "IncompleteSignatureException",
        "InvalidClientTokenId",
    }
)

_CREDENTIAL_CODES = ACCESS_CODES - {"AccessDeniedException"}

CONDITION_FAILED_CODE = "ConditionalCheckFailedException"


# --------------------------------------------------------------------------- target


@dataclass(frozen=True)
class DynamoDBTarget:
    """Where requests go, for messages: table, region, endpoint and (once
    DescribeTable told us) the table's ARN."""

    table: str
    region: str | None = None
    endpoint: str | None = None
    arn: str | None = None
    #: Said after the region when nobody configured it (the client fell back to a default).
    region_note: str | None = field(default=None, compare=False)

    @property
    def resource(self) -> str:
        """The table's ARN; with ``*`` for the account until it is known, which
        is still a valid IAM ``Resource``."""
        if self.arn:
            return self.arn
        return f"arn:aws:dynamodb:{self.region or '*'}:*:table/{self.table}"

    @property
    def location(self) -> str:
        """``region us-east-1, endpoint http://…`` (endpoint "AWS default" if unset)."""
        note = f" ({self.region_note})" if self.region_note else ""
        return (
            f"region {self.region or '(default)'}{note}, endpoint {self.endpoint or 'AWS default'}"
        )


def create_table_hint(table: str, region: str | None = None, endpoint: str | None = None) -> str:
    """How to create a correctly shaped table, for messages."""
    where = (f" --region {region}" if region else "") + (
        f" --endpoint-url {endpoint}" if endpoint else ""
    )
    options = (f" -o dynamodb_region={region}" if region else "") + (
        f" -o dynamodb_endpoint={endpoint}" if endpoint else ""
    )
    return (
        f"create it with `lancetx-sync create-table {table}{options}` (then `lancetx-sync doctor` "
        f"checks the setup), lancetx.externalstore.dynamodb.create_table(client, {table!r}) or "
        f"`aws dynamodb create-table --table-name {table} "
        "--attribute-definitions AttributeName=base_uri,AttributeType=S "
        "AttributeName=version,AttributeType=N "
        "--key-schema AttributeName=base_uri,KeyType=HASH AttributeName=version,KeyType=RANGE "
        f"--billing-mode PAY_PER_REQUEST{where}`"
    )


# --------------------------------------------------------------------------- errors


class ExternalStoreError(LancetxError):
    """A request to the external manifest store failed.

    ``action`` is the IAM action (``dynamodb:PutItem``), ``resource`` the table
    ARN (or store name); the message says what happened and what to do.
    ``code`` is the service error code when there was one.
    """

    def __init__(
        self, action: str, resource: str, message: str, *, code: str | None = None
    ) -> None:
        self.action = action
        self.resource = resource
        self.detail = message
        self.code = code
        super().__init__(f"{action} on {resource}: {message}")


class DynamoDBTableNotFoundError(ExternalStoreError):
    """The DynamoDB table does not exist in the region/endpoint we used."""

    def __init__(self, action: str, resource: str, target: DynamoDBTarget) -> None:
        self.table = target.table
        hint = create_table_hint(target.table, target.region, target.endpoint)
        super().__init__(
            action,
            resource,
            f"DynamoDB table {target.table!r} does not exist ({target.location}); {hint}; "
            "or, if it exists elsewhere, fix ddbTableName, dynamodb_region or dynamodb_endpoint",
            code="ResourceNotFoundException",
        )


class DynamoDBTableSchemaError(ExternalStoreError):
    """The table's key schema or key types are not HASH base_uri (S) + RANGE version (N)."""

    def __init__(self, action: str, resource: str, table: str, found: str, problem: str) -> None:
        self.table = table
        self.found = found
        self.problem = problem
        super().__init__(
            action,
            resource,
            f"DynamoDB table {table!r} cannot hold Lance manifest entries: {problem}. Found {found}; "
            "required HASH key base_uri (type S) and RANGE key version (type N). Key schemas "
            f"cannot be changed in place: use another table name and {create_table_hint('NEW_TABLE')}",
        )


#: API operations without an IAM action of their own: each part of a transaction is
#: authorized as the item action it performs (a Put as dynamodb:PutItem, ...).
_ITEM_BY_ITEM = {"TransactWriteItems": "dynamodb:PutItem"}


def iam_action_of(operation: str) -> str:
    """The IAM action that authorizes DynamoDB ``operation`` (``PutItem`` →
    ``dynamodb:PutItem``; a ``TransactWriteItems`` of Puts → ``dynamodb:PutItem``)."""
    return _ITEM_BY_ITEM.get(operation, f"dynamodb:{operation}")


class AccessDeniedError(ExternalStoreError):
    """IAM denied the action, or the credentials were not accepted (or not configured)."""

    def __init__(
        self,
        action: str,
        resource: str,
        code: str,
        detail: str,
        operation: str | None = None,
        target: DynamoDBTarget | None = None,
    ) -> None:
        where = f" ({target.location})" if target is not None else ""
        if code == "NoCredentialsError":
            todo = (
                "no AWS credentials are configured for DynamoDB: none in the storage options "
                "(aws_access_key_id_dynamodb / aws_secret_access_key_dynamodb, or the S3 pair "
                "aws_access_key_id / aws_secret_access_key they default to), the environment "
                "(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY), an AWS profile or an instance "
                f"role; configure one of them{where}"
            )
        elif code in _CREDENTIAL_CODES or code == "PartialCredentialsError":
            todo = (
                "the credentials were not accepted or are incomplete: check "
                "aws_access_key_id_dynamodb / aws_secret_access_key_dynamodb (or the S3 "
                "credentials they default to), the session token's expiry, and that region and "
                f"endpoint belong to the account{where}"
            )
        elif operation in _ITEM_BY_ITEM:
            todo = (
                f"grant IAM action {action} on {resource} for the partition key of every item "
                f"of the request (each table's base path, for a commit of several tables): a "
                f"{operation} has no IAM action of its own, each of its parts is authorized "
                "item by item (lancetx-sync iam-policy --role writer, for each table)"
            )
        else:
            todo = f"grant IAM action {action} on {resource} to the caller"
        super().__init__(action, resource, f"{code}: {detail}; {todo}", code=code)


class ThrottledError(ExternalStoreError):
    """Still throttled after every retry our policy allows. Nothing was written."""

    retryable = True

    def __init__(self, action: str, resource: str, code: str, attempts: int) -> None:
        self.attempts = attempts
        super().__init__(
            action,
            resource,
            f"{code} on each of {attempts} attempts; the request was not applied. Retry later, raise "
            "dynamodb_max_attempts, or give the table more capacity (PAY_PER_REQUEST billing, or "
            "higher provisioned read/write capacity)",
            code=code,
        )


class EndpointUnreachableError(ExternalStoreError):
    """No connection to the endpoint could be made; nothing was sent."""

    retryable = True

    def __init__(
        self, action: str, resource: str, endpoint: str | None, detail: str, attempts: int
    ) -> None:
        self.endpoint = endpoint
        self.attempts = attempts
        super().__init__(
            action,
            resource,
            f"cannot connect to DynamoDB endpoint {endpoint or '(AWS default for the region)'} "
            f"after {attempts} attempt(s): {detail}. Set the storage option dynamodb_endpoint "
            "(or env DYNAMODB_ENDPOINT / AWS_ENDPOINT_URL_DYNAMODB) and dynamodb_region to where "
            "the table lives, and check the network path",
        )


class ServiceUnavailableError(ExternalStoreError):
    """5xx or a dropped connection persisted through our retries (a read or an
    idempotent write, so the outcome is not in doubt)."""

    retryable = True

    def __init__(
        self, action: str, resource: str, detail: str, attempts: int, code: str | None = None
    ) -> None:
        self.attempts = attempts
        super().__init__(
            action,
            resource,
            f"DynamoDB did not answer successfully in {attempts} attempt(s): {detail}; retry later",
            code=code,
        )


class InvalidRequestError(ExternalStoreError):
    """DynamoDB rejected the request itself (ValidationException and the like)."""

    def __init__(self, action: str, resource: str, code: str, detail: str) -> None:
        super().__init__(
            action,
            resource,
            f"{code}: {detail}; the request was not applied. If a key type is wrong the table "
            "does not have the Lance layout (HASH base_uri S, RANGE version N)",
            code=code,
        )


#: What needs each operation an endpoint might not implement, for the error's message.
_NEEDED_FOR = {
    "TransactWriteItems": (
        "commits that carry an idempotency key, a Spark job id or a stream batch (the "
        "version and the key are claimed in one transaction) and multi-table commits"
    ),
}


class OperationNotImplementedError(InvalidRequestError):
    """The DynamoDB endpoint does not implement an operation lancetx sends
    (``UnknownOperationException``): some DynamoDB emulators (dynalite) lack
    transactions. Nothing was applied."""

    def __init__(self, action: str, resource: str, operation: str, endpoint: str | None) -> None:
        where = f"the DynamoDB endpoint {endpoint}" if endpoint else "this DynamoDB endpoint"
        needed = _NEEDED_FOR.get(operation, "this request")
        ExternalStoreError.__init__(
            self,
            action,
            resource,
            f"{where} does not implement {operation} (UnknownOperationException); the "
            f"request was not applied. lancetx needs {operation} for {needed}. Amazon "
            "DynamoDB, DynamoDB Local and LocalStack's DynamoDB implement it; point the "
            "table at one of them, or commit without a key",
            code="UnknownOperationException",
        )
        self.operation = operation
        self.endpoint = endpoint


class EntryExistsError(ExternalStoreError):
    """``put_if_not_exists`` lost: another writer holds the version.

    ``existing`` is the winner's entry when the store returned it (DynamoDB's
    ``ReturnValuesOnConditionCheckFailure=ALL_OLD``), else None.
    """

    def __init__(
        self,
        action: str,
        resource: str,
        base_uri: str,
        version: int,
        existing: ManifestEntry | None,
    ) -> None:
        self.base_uri = base_uri
        self.version = version
        self.existing = existing
        holder = (
            f" (path {existing.path!r}, committer {existing.committer!r})"
            if existing is not None
            else ""
        )
        super().__init__(
            action,
            resource,
            f"version {version} of {base_uri!r} is already claimed by another writer{holder}; "
            "load the newer version and retry the transaction on top of it",
            code=CONDITION_FAILED_CODE,
        )


class BatchEntryExistsError(ExternalStoreError):
    """``put_all_if_not_exists`` wrote nothing: at least one of the versions is
    already claimed (DynamoDB cancelled the TransactWriteItems).

    ``failed`` are the indices (in the order given) whose condition failed;
    ``existing[i]`` is the item found there when the store returned it, else
    None. ``ambiguous``: an earlier attempt of this request may have landed, so
    the existing items may be ours (compare their commit tokens).
    """

    def __init__(
        self,
        action: str,
        resource: str,
        entries: list[ManifestEntry],
        failed: list[int],
        existing: list[ManifestEntry | None],
        *,
        ambiguous: bool = False,
    ) -> None:
        self.entries = entries
        self.failed = failed
        self.existing = existing
        self.ambiguous = ambiguous
        taken = ", ".join(
            f"version {entries[i].version} of {entries[i].base_uri!r}" for i in failed
        )
        super().__init__(
            action,
            resource,
            f"none of the {len(entries)} versions was claimed: {taken} "
            f"{'is' if len(failed) == 1 else 'are'} already claimed by another writer; load the "
            "newer versions and retry the transactions on top of them",
            code="TransactionCanceledException",
        )


class KeyExistsError(ExternalStoreError):
    """``put_with_key_if_not_exists`` wrote nothing: the idempotency key's item
    exists, another commit's (a retried request of our own is not an error).

    ``attempted`` is the key item we tried to write; ``existing`` the one found
    (None if it could not be read back), which names the version the key was
    committed as — or, if its ``key`` differs from ours, belongs to another key
    sharing the slot. ``ambiguous``: an earlier attempt of this request may have
    landed (it did not if ``existing`` names another commit token).
    """

    def __init__(
        self,
        action: str,
        resource: str,
        attempted: KeyRecord,
        existing: KeyRecord | None,
        *,
        ambiguous: bool = False,
    ) -> None:
        self.attempted = attempted
        self.existing = existing
        self.ambiguous = ambiguous
        holder = (
            f"version {existing.version} (transaction {existing.transaction_uuid})"
            if existing is not None
            else "another commit"
        )
        super().__init__(
            action,
            resource,
            f"idempotency key {attempted.key!r} of {attempted.base_uri!r} is already committed "
            f"as {holder}; version {attempted.version} was not claimed",
            code="TransactionCanceledException",
        )


class TablesNotColocatedError(CommitError, ValueError):
    """A multi-table commit needs every table's versions in one DynamoDB table
    (one TransactWriteItems is the commit point). ``stores`` maps each table
    URI to where its versions are claimed. Nothing was written."""

    def __init__(self, stores: dict[str, str]) -> None:
        self.stores = stores
        listed = "; ".join(f"{uri!r} -> {where}" for uri, where in stores.items())
        super().__init__(
            "cannot commit these tables atomically: their versions are not claimed in one "
            f"DynamoDB table ({listed}); use s3+ddb:// URIs naming the same ddbTableName, with "
            "the same DynamoDB endpoint and region, or commit the tables one by one"
        )


class MultiTableClaimLostError(CommitError):
    """A multi-table claim lost: another writer holds at least one of the
    versions, so none was claimed (all or nothing). ``taken`` maps each such
    table's ``base_uri`` to ``(version, winner's manifest path or None)``."""

    def __init__(self, taken: dict[str, tuple[int, str | None]]) -> None:
        self.taken = taken
        listed = ", ".join(f"version {v} of {uri!r}" for uri, (v, _) in sorted(taken.items()))
        super().__init__(
            f"none of the tables was committed: {listed} "
            f"{'was' if len(taken) == 1 else 'were'} claimed by another writer first; load the "
            "newer versions and commit again on top of them"
        )


class EntryNotFoundError(ExternalStoreError):
    """There is no entry for ``(base_uri, version)``."""

    def __init__(self, action: str, resource: str, base_uri: str, version: int) -> None:
        self.base_uri = base_uri
        self.version = version
        super().__init__(
            action,
            resource,
            f"no entry for version {version} of {base_uri!r}; the version was never committed "
            "through this table (or the table was written without it: open it from the object "
            "store to onboard it)",
        )


class EntryMismatchError(ExternalStoreError):
    """``put_if_exists`` refused: the entry no longer points at ``expected_path``."""

    def __init__(
        self,
        action: str,
        resource: str,
        entry: ManifestEntry,
        expected_path: str | None,
        existing: ManifestEntry | None,
    ) -> None:
        self.entry = entry
        self.expected_path = expected_path
        self.existing = existing
        found = existing.path if existing is not None else "(unknown)"
        super().__init__(
            action,
            resource,
            f"refused to point version {entry.version} of {entry.base_uri!r} at {entry.path!r}: "
            f"it points at {found!r}, not the expected {expected_path!r}, so it belongs to another "
            "commit; re-read the entry and finalize what it points at instead",
            code=CONDITION_FAILED_CODE,
        )


class AmbiguousWriteError(ExternalStoreError):
    """A write whose outcome is unknown: it may have landed (a timeout or
    dropped connection after sending, a 5xx) and retries could not settle it.

    ``entry`` is what we tried to write; ``existing`` what a later attempt found
    at the key, if anything. The staged manifest must be kept: it may be the
    committed version.
    """

    retryable = True

    def __init__(
        self,
        action: str,
        resource: str,
        entry: ManifestEntry,
        detail: str,
        existing: ManifestEntry | None = None,
    ) -> None:
        self.entry = entry
        self.existing = existing
        found = (
            f"; the key now holds path {existing.path!r} without a commit token" if existing else ""
        )
        super().__init__(
            action,
            resource,
            f"outcome of writing version {entry.version} of {entry.base_uri!r} (path {entry.path!r}, "
            f"commit_token {entry.commit_token}) is unknown: {detail}{found}. Do not delete the "
            "staged manifest; re-read the entry and, if it does not carry this commit token, "
            "compare the committed manifest's transaction with ours before retrying",
        )


class InvalidConfigError(LancetxError, ValueError):
    """A DynamoDB option has a value we cannot use."""

    def __init__(self, key: str, value: object, problem: str) -> None:
        self.key = key
        self.value = value
        super().__init__(f"invalid DynamoDB option {key}={value!r}: {problem}")


# ----------------------------------------------------- following an entry to a manifest


class ManifestPointerError(LancetxError):
    """An external-store entry cannot be followed to a manifest."""


class UntrustedManifestPathError(ManifestPointerError):
    """An entry points outside the table's ``_versions/`` or at another version's name."""

    def __init__(self, base_uri: str, version: int, path: str, expected_prefix: str) -> None:
        self.base_uri = base_uri
        self.version = version
        self.path = path
        super().__init__(
            f"refusing to follow the external-store entry for version {version} of {base_uri!r}: "
            f"its path {path!r} is not a manifest of version {version} under {expected_prefix!r}. "
            "The entry was written by something other than Lance/lancetx or for another table; "
            "`lancetx-sync verify 's3+ddb://<bucket>/"
            f"{base_uri}?ddbTableName=<table>'` reports it, and `lancetx-sync repair "
            f"'s3+ddb://<bucket>/{base_uri}?ddbTableName=<table>' --version {version} --force` "
            "removes the item (newest version only; it is saved to a file first)"
        )


class ManifestMissingError(ManifestPointerError):
    """Both the staged and the final manifest of a committed version are gone."""

    def __init__(self, base_uri: str, version: int, staged: str, final: str) -> None:
        self.base_uri = base_uri
        self.version = version
        self.staged = staged
        self.final = final
        super().__init__(
            f"version {version} of {base_uri!r} is committed in the external store but neither its "
            f"staged manifest {staged!r} nor its final manifest {final!r} exists; refusing to load. "
            "Restore the object from a backup or bucket versioning (copy it to the final name), "
            "or run `lancetx-sync repair "
            f"'s3+ddb://<bucket>/{base_uri}?ddbTableName=<table>' --version {version}`: it "
            "rebuilds the version from its transaction file, or with --force removes the item "
            "of the newest version after saving it to a file"
        )


class ManifestCopyMismatchError(ManifestPointerError):
    """The final manifest does not hold the staged bytes after a copy."""

    retryable = True

    def __init__(self, base_uri: str, version: int, final: str, detail: str) -> None:
        self.base_uri = base_uri
        self.version = version
        self.final = final
        super().__init__(
            f"the final manifest {final!r} of version {version} of {base_uri!r} does not match the "
            f"committed staged manifest ({detail}); the pointer was not flipped. Retry the read; "
            "if it persists, another process is writing that key"
        )


class WedgedVersionError(ManifestMissingError):
    """A claimed version whose staged manifest is gone and which has no final manifest.

    pylance deletes its staged manifest when its claim's answer was lost even
    though the claim landed, leaving the item pointing at nothing; every later
    commit would build on that version, so readers and writers stop here. The
    version's content is recoverable from its transaction file: ``candidates``
    are the transaction files that may hold it (read version below
    ``version``, referenced by no committed manifest), as bucket-relative keys.
    Older versions stay readable. ``repair_command`` re-materializes the
    version from the transaction the operator picks.
    """

    def __init__(
        self,
        version: int,
        base_uri: str,
        item_path: str,
        candidates: list[str],
        repair_command: str,
        *,
        final: str | None = None,
        table: str | None = None,
    ) -> None:
        self.version = version
        self.base_uri = base_uri
        self.item_path = item_path
        self.staged = item_path
        self.final = final or item_path
        self.candidates = list(candidates)
        self.repair_command = repair_command
        self.table = table
        where = f" in DynamoDB table {table!r}" if table else ""
        if not candidates:
            found = (
                "no transaction file could hold it (none with a read version below "
                f"{version} is unreferenced); restore the manifest from a backup or bucket "
                "versioning, or, after checking that no data depends on it, remove the item "
                f"with `{repair_command} --force` (newest version only; it is saved to a file "
                "first)"
            )
        elif len(candidates) == 1:
            found = f"its transaction is probably {candidates[0]!r}"
        else:
            shown = ", ".join(repr(c) for c in candidates[:10])
            more = f" and {len(candidates) - 10} more" if len(candidates) > 10 else ""
            found = f"its transaction is one of {len(candidates)} candidates: {shown}{more}"
        ManifestPointerError.__init__(
            self,
            f"version {version} of {base_uri!r} is wedged: its item{where} (base_uri "
            f"{base_uri!r}, version {version}) points at staged manifest {item_path!r}, which "
            f"is gone, and there is no final manifest {self.final!r} (a writer deleted its "
            f"staged manifest after a claim that landed). Every commit after it is blocked; "
            f"versions before {version} are still readable. {found[0].upper()}{found[1:]}. "
            f"Repair it with: {repair_command}",
        )


def repair_command(table_uri: str, version: int) -> str:
    """The CLI command that repairs wedged ``version`` of the table at ``table_uri``."""
    quoted = table_uri.replace("'", "'\"'\"'")
    return f"lancetx-sync repair '{quoted}' --version {version}"


class TableCollisionError(ManifestPointerError):
    """Another bucket's table has the same path and shares the DynamoDB table.

    Lance's DynamoDB key (``base_uri``) is the table's path *inside* the bucket,
    without the bucket, so tables at the same path in two buckets share their
    items and would overwrite each other's versions. ``other_bucket`` is None
    when the item does not record its bucket (pylance writes none) and the
    manifest it points at is not in ours.
    """

    def __init__(
        self,
        base_uri: str,
        version: int,
        bucket: str,
        other_bucket: str | None,
        dynamodb_table: str | None,
        *,
        path: str | None = None,
    ) -> None:
        self.base_uri = base_uri
        self.version = version
        self.bucket = bucket
        self.other_bucket = other_bucket
        self.dynamodb_table = dynamodb_table
        self.path = path
        table = f"DynamoDB table {dynamodb_table!r}" if dynamodb_table else "the external store"
        if other_bucket is not None:
            whose = f"was written for bucket {other_bucket!r}, not for bucket {bucket!r}"
        else:
            whose = (
                f"points at {path!r}, which does not exist in bucket {bucket!r}, and bucket "
                f"{bucket!r} holds no manifest of this table: it was written (by pylance, which "
                "does not record the bucket) for the same path in another bucket"
            )
        super().__init__(
            f"table collision: the item of version {version} of {base_uri!r} in {table} {whose}. "
            f"Lance's DynamoDB key is the path inside the bucket without the bucket, so two "
            f"buckets' tables at path {base_uri!r} would overwrite each other's versions; nothing "
            f"was written. Use another DynamoDB table for bucket {bucket!r} (ddbTableName=...) "
            "or another path for this table"
        )


class BadEntryError(ManifestPointerError):
    """An item cannot be trusted: what it points at is missing, unreadable or another
    version's. Nothing was followed, changed or deleted."""

    def __init__(
        self,
        base_uri: str,
        version: int,
        path: str,
        problem: str,
        *,
        dynamodb_table: str | None = None,
    ) -> None:
        self.base_uri = base_uri
        self.version = version
        self.path = path
        self.problem = problem
        self.dynamodb_table = dynamodb_table
        table = f"DynamoDB table {dynamodb_table!r}" if dynamodb_table else "the external store"
        uri = f"s3+ddb://<bucket>/{base_uri}?ddbTableName={dynamodb_table or '<table>'}"
        super().__init__(
            f"refusing the item of version {version} of {base_uri!r} in {table} (path "
            f"{path!r}): {problem}. Nothing was changed. `lancetx-sync verify '{uri}'` reports "
            "every such item; restore the manifest from a backup or bucket versioning, or run "
            f"`lancetx-sync repair '{uri}' --version {version}`: it restores a final manifest "
            "from a staged copy, or with --force removes the item of the newest version after "
            "saving it to a file"
        )


class DanglingEntryError(BadEntryError):
    """The item points at a final manifest that does not exist (in our bucket)."""


class CorruptManifestError(BadEntryError):
    """The manifest the item points at is not a readable manifest (truncated, corrupted)."""


class ManifestVersionMismatchError(BadEntryError):
    """The manifest the item points at encodes another version."""


class ManifestSizeMismatchError(BadEntryError):
    """The item's ``size`` is missing or differs from the manifest's."""


class MalformedEntryError(ExternalStoreError):
    """An item's attributes cannot be a Lance manifest entry (a version that is not a
    whole number in 0..2**64-1, a size that is not one, a missing path)."""


# ---------------------------------------------------------- the store layout


class StoreSchemaTooNewError(LancetxError):
    """The DynamoDB table was stamped by a newer lancetx than this one."""

    def __init__(self, table: str, found: int, supported: int) -> None:
        self.table = table
        self.found = found
        self.supported = supported
        super().__init__(
            f"DynamoDB table {table!r} uses lancetx store layout {found}, but this lancetx "
            f"understands layouts up to {supported}; upgrade lancetx (pip install -U lancetx) "
            "on this machine before reading or writing tables in it"
        )


class TableMovedError(LancetxError):
    """The table was migrated to ``s3://`` (conditional PUT); ``s3+ddb://`` commits are refused."""

    def __init__(self, base_uri: str, table: str, new_uri: str) -> None:
        self.base_uri = base_uri
        self.new_uri = new_uri
        super().__init__(
            f"table {base_uri!r} was migrated off DynamoDB table {table!r} to S3's conditional "
            f"PUT; open it as {new_uri!r} (drop ?ddbTableName= and the dynamodb_* options). "
            "Committing through s3+ddb:// now would claim versions that s3:// writers never see"
        )
