"""Every lancetx error, in one place: the one catch list.

Each error is a :class:`LancetxError`; the front door's, the maintenance tools'
and the Spark data source's are defined here, and every other layer's is
re-exported, so ``from lancetx.errors import X`` (or ``lancetx.X``) reaches any of
them. A message names the table, version, file, key or AWS action and resource
at fault and says what to do. :attr:`LancetxError.retryable` (marked ``*`` below)
says whether the same call may simply be made again; its docstring gives the rule.

The tree (where each is defined in brackets: ``commit`` is
:mod:`lancetx.commit.errors`, ``store`` :mod:`lancetx.externalstore.errors`, no
bracket this module)::

    LancetxError
    ├── TableError                         front door: ``uri`` names the Lance table; nothing was written
    │   ├── TableExistsError               write_table(mode="create") found a table
    │   ├── InvalidPredicateError          pylance cannot use the filter
    │   ├── UnknownColumnError             a verb names columns the table lacks
    │   ├── SchemaMismatchError            data whose schema does not fit the table's
    │   │   └── ColumnMismatchError        ... one column of it (``column``)
    │   ├── UnsupportedInputError          an object this verb cannot take (also a TypeError)
    │   ├── ForeignFragmentError           fragments outside the table's data/ directory
    │   ├── PylanceCommitsItselfError      a verb only pylance's own commit could do
    │   ├── ReadOnlyTableError             a write on a checkout() view
    │   ├── WriterClosedError              a streaming writer used after commit()/abort()
    │   ├── IndexRemapError                compact() could not remap an index with pylance
    │   └── TagError                       Table.tags, or a version opened by tag (``tag``)
    │       ├── TagNotFoundError           no such tag (``existing`` lists them; also a LookupError)
    │       ├── TagExistsError             tags.create of a name already taken
    │       ├── InvalidTagNameError        a name Lance refuses (also a ValueError)
    │       └── TagOnBranchError           a pylance tag on another branch
    ├── ArgumentTypeError                  a public call's argument has the wrong type (also a TypeError)
    ├── InvalidIdempotencyKeyError         an empty, non-UTF-8 or too long idempotency key (also a ValueError)
    ├── InvalidWriteParamError             a write parameter pylance cannot take (also a TypeError, ValueError)
    ├── InvalidUriError                    [commit] a table URI we cannot open (also a ValueError)
    ├── StorageOptionError                 [commit] a storage option we cannot use (also a ValueError)
    ├── MissingExtraError                  [commit] an extra's packages are absent (also an ImportError)
    ├── DatasetNotFoundError               [commit] no Lance table at the URI
    ├── VersionNotFoundError               [commit] no such version
    │   ├── TagTargetRemovedError          a cleanup removed the version while it was being tagged
    │   └── VersionsRemovedError           a cleanup removed versions whose changes were still to be read
    ├── CommitError                        [commit] committing a transaction failed
    │   ├── CommitConflictError            a transaction committed since ours conflicts with it
    │   │   ├── RetryableConflictError *   re-planned on the new version, the result is the same
    │   │   └── IncompatibleConflictError  ours no longer makes sense on the new version
    │   ├── RetriesExhaustedError *        every attempt lost the race until the budget ran out
    │   ├── ExpectedVersionMismatchError   a strict commit found another version
    │   ├── UnfinishedParentError *        the parent version is committed but not finished yet
    │   ├── InvalidCommitError             a request that cannot be valid for this table
    │   ├── InvalidTransactionError        a transaction that does not fit its parent
    │   ├── IdempotencyKeyCollisionError   two keys' hashes met: use another key
    │   ├── CommitStateUnknownError *      the claim may have landed: retry with the same key
    │   │   └── JobCommitUnknownError *    ... a Spark job's, not settled within its budget
    │   ├── VersionAlreadyExistsError      another writer claimed the version (the loop rebases)
    │   ├── KeyAlreadyCommittedError       the idempotency key is committed already
    │   ├── TablesNotColocatedError        [store] commit_many over several DynamoDB tables (also a ValueError)
    │   ├── MultiTableClaimLostError       [store] a multi-table claim lost a version (commit_many retries)
    │   └── JobCommitTimeoutError *        a Spark job lost every race within its commit budget
    ├── FormatError                        [commit] a file is not a valid Lance artifact
    │   ├── ManifestFormatError
    │   ├── TransactionFileError
    │   ├── DeletionFileError
    │   ├── ObjectTooLargeError            larger than the cap on its kind (manifest, transaction, tag)
    │   │   ├── ManifestTooLargeError      (also a ManifestFormatError)
    │   │   └── TransactionTooLargeError   (also a TransactionFileError)
    │   ├── FragmentFormatError            fragment metadata we cannot take
    │   ├── MixedNamingSchemesError        V1 and V2 manifest names in one _versions/
    │   ├── RowIdFormatError               a row-id sequence that does not decode
    │   ├── TagFileError                   a tag file that names no version
    │   └── BasePathError                  a base path (or a file's base id) we cannot follow
    ├── SchemaConversionError              [commit] an Arrow schema or field list we cannot convert
    ├── UnsupportedFeatureError            [commit] a feature flag we do not implement
    │   └── UnsupportedTransactionError    an operation we do not build
    ├── ObjectStoreError                   [commit] an object-store request failed
    │   ├── ObjectNotFoundError
    │   ├── ObjectExistsError              a conditional create lost to an existing object
    │   ├── UnsupportedOperationError      the store lacks the capability asked for
    │   │   └── ConditionalPutIgnoredError the store ignores If-None-Match: commit through DynamoDB
    │   └── TransientObjectStoreError *    5xx / throttling / connection
    ├── ExternalStoreError                 [store] a DynamoDB request failed (action + resource)
    │   ├── DynamoDBTableNotFoundError     the DynamoDB table does not exist where we looked
    │   ├── DynamoDBTableSchemaError       its key names or key types are not Lance's
    │   ├── AccessDeniedError              IAM denies the action, or bad credentials
    │   ├── ThrottledError *               still throttled after our retries
    │   ├── EndpointUnreachableError *     could not connect (nothing was sent)
    │   ├── ServiceUnavailableError *      5xx / dropped connection after retries
    │   ├── InvalidRequestError            DynamoDB rejected the request
    │   │   └── OperationNotImplementedError  the endpoint lacks the operation (dynalite: transactions)
    │   ├── EntryExistsError               the version's item exists (a lost race)
    │   ├── BatchEntryExistsError              one of several versions' items exists
    │   ├── KeyExistsError                 the idempotency key's item exists
    │   ├── EntryNotFoundError             no item for (base_uri, version)
    │   ├── EntryMismatchError             the item points elsewhere
    │   ├── MalformedEntryError            an item that cannot be a manifest entry
    │   └── AmbiguousWriteError *          a write may or may not have landed
    ├── ManifestPointerError               [store] an item cannot be followed to a manifest
    │   ├── UntrustedManifestPathError     it points outside _versions/ or at another version
    │   ├── ManifestMissingError           staged and final manifest are both gone
    │   │   └── WedgedVersionError         ... after a claim that landed: repair it
    │   ├── ManifestCopyMismatchError *    the final manifest does not hold the staged bytes
    │   ├── TableCollisionError            another bucket's Lance table at the same path
    │   └── BadEntryError                  what the item points at cannot be trusted
    │       ├── DanglingEntryError
    │       ├── CorruptManifestError
    │       ├── ManifestVersionMismatchError
    │       └── ManifestSizeMismatchError
    ├── InvalidConfigError                 [store] a DynamoDB option we cannot use (also a ValueError)
    ├── StoreSchemaTooNewError             [store] the DynamoDB table was stamped by a newer lancetx
    ├── TableMovedError                    [store] the Lance table was migrated to s3:// (conditional PUT)
    ├── NotAnExternalStoreTableError       lancetx-sync: a DynamoDB command given a URI without one
    ├── WedgedTableError                   gc/cleanup: versions need repair first
    ├── UntrustedReferenceError            gc/cleanup: a reference points outside the table
    ├── MaintenanceRaceError               gc/cleanup: versions committed meanwhile unreadable
    ├── UnsafeThresholdError               gc: --older-than below the minimum (also a ValueError)
    ├── RepairVerificationError            repair: what it wrote did not read back
    ├── NoParentError                      repair: a wedged version's parent cannot be read
    ├── IamPolicyError                     iam-policy: cannot write the policy (also a ValueError)
    ├── SparkOptionError                   Spark: an option we cannot use (also a ValueError)
    │   └── UnknownSparkOptionError        an option name we do not know
    ├── SparkSchemaError                   Spark: a column that does not fit the table
    │   └── UnsupportedSparkTypeError      a Spark type Lance cannot hold
    ├── SparkSetupError                    Spark cannot be made to find the data source
    └── StreamSourceError                  Spark streaming read: the stream cannot go past a version
        ├── StreamChangeCommitError        the version deleted or changed rows (skipChangeCommits skips it)
        └── StreamSchemaChangedError       the version dropped a column the stream reads (restart the query)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta

from lancetx.commit.engine.builder.errors import (
    InvalidTransactionError,
    UnsupportedTransactionError,
)
from lancetx.commit.errors import (
    BasePathError,
    CommitConflictError,
    CommitError,
    CommitStateUnknownError,
    DatasetNotFoundError,
    DeletionFileError,
    ExpectedVersionMismatchError,
    FormatError,
    IdempotencyKeyCollisionError,
    IncompatibleConflictError,
    InvalidCommitError,
    InvalidUriError,
    KeyAlreadyCommittedError,
    LancetxError,
    ManifestFormatError,
    ManifestTooLargeError,
    MissingExtraError,
    ObjectExistsError,
    ObjectNotFoundError,
    ObjectStoreError,
    ObjectTooLargeError,
    RetriesExhaustedError,
    RetryableConflictError,
    SchemaConversionError,
    StorageOptionError,
    TransactionFileError,
    TransactionTooLargeError,
    TransientObjectStoreError,
    UnfinishedParentError,
    UnsupportedFeatureError,
    UnsupportedOperationError,
    VersionAlreadyExistsError,
    VersionNotFoundError,
)
from lancetx.commit.format.fragments import FragmentFormatError
from lancetx.commit.format.listing import MixedNamingSchemesError
from lancetx.commit.format.retention import TagFileError
from lancetx.commit.format.rowids import RowIdFormatError
from lancetx.commit.handlers.probe import ConditionalPutIgnoredError
from lancetx.externalstore.errors import (
    AccessDeniedError,
    AmbiguousWriteError,
    BadEntryError,
    BatchEntryExistsError,
    CorruptManifestError,
    DanglingEntryError,
    DynamoDBTableNotFoundError,
    DynamoDBTableSchemaError,
    EndpointUnreachableError,
    EntryExistsError,
    EntryMismatchError,
    EntryNotFoundError,
    ExternalStoreError,
    InvalidConfigError,
    InvalidRequestError,
    KeyExistsError,
    MalformedEntryError,
    ManifestCopyMismatchError,
    ManifestMissingError,
    ManifestPointerError,
    ManifestSizeMismatchError,
    ManifestVersionMismatchError,
    MultiTableClaimLostError,
    OperationNotImplementedError,
    ServiceUnavailableError,
    StoreSchemaTooNewError,
    TableCollisionError,
    TableMovedError,
    TablesNotColocatedError,
    ThrottledError,
    UntrustedManifestPathError,
    WedgedVersionError,
)

# ------------------------------------------------------------------ the front door


class ArgumentTypeError(LancetxError, TypeError):
    """An argument of a public call has the wrong type. Nothing was read or written."""

    def __init__(
        self, call: str, argument: str, expected: str, value: object, signature: str, hint: str
    ) -> None:
        self.call = call
        self.argument = argument
        self.expected = expected
        shown = repr(value)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        super().__init__(
            f"{call}(): argument {argument!r} must be {expected}, got "
            f"{type(value).__name__} {shown}{hint}. Signature: {signature}"
        )


class InvalidIdempotencyKeyError(LancetxError, ValueError):
    """An idempotency key that cannot name a commit: empty (it would be taken for "no
    key" and the commit would land again on every retry), not valid UTF-8, or longer
    than ``limit`` bytes. Nothing was read or written."""

    def __init__(self, key: str, problem: str, limit: int) -> None:
        self.key = key
        self.problem = problem
        self.limit = limit
        shown = repr(key)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        super().__init__(
            f"idempotency key {shown} {problem}: pass a non-empty text of at most {limit} "
            "UTF-8 bytes that names this commit (a job id, a batch id), or "
            "idempotency_key=None for a commit without one"
        )


class InvalidWriteParamError(LancetxError, TypeError, ValueError):
    """A write parameter (``**write_params`` of append, overwrite, write_table and the
    streaming writer, handed to ``lance.fragment.write_fragments``) that cannot be
    used: lancetx's own, unknown to pylance, or a bad value. Nothing was written."""

    def __init__(self, name: str, problem: str) -> None:
        self.name = name
        self.problem = problem
        super().__init__(f"write parameter {name!r}: {problem}")


class TableError(LancetxError):
    """Base class of front-door errors; ``uri`` names the table."""

    def __init__(self, uri: str, message: str) -> None:
        self.uri = uri
        super().__init__(f"{uri}: {message}")


class TableExistsError(TableError):
    """``write_table(mode="create")`` found a table that already has versions."""

    def __init__(self, uri: str, version: int) -> None:
        self.version = version
        super().__init__(
            uri,
            f"a table already exists here (latest version {version}); "
            'use mode="append" or mode="overwrite", or lancetx.open(uri)',
        )


class InvalidPredicateError(TableError):
    """pylance cannot parse or evaluate a filter predicate. Nothing was written."""

    def __init__(self, uri: str, predicate: str, detail: str) -> None:
        self.predicate = predicate
        super().__init__(
            uri,
            f"cannot use predicate {predicate!r}: {detail}; write it in Lance's SQL "
            "dialect over this table's columns (e.g. \"id > 3 AND name = 'x'\")",
        )


class UnknownColumnError(TableError):
    """A verb names columns the table does not have. Nothing was written."""

    def __init__(self, uri: str, columns: Sequence[str], existing: Sequence[str]) -> None:
        self.columns = list(columns)
        super().__init__(
            uri,
            f"no column(s) {', '.join(repr(c) for c in columns)} in this table "
            f"(columns: {', '.join(existing)})",
        )


class SchemaMismatchError(TableError):
    """Data whose schema does not fit the table's. Nothing was written."""

    def __init__(self, uri: str, problem: str) -> None:
        self.problem = problem
        super().__init__(
            uri,
            f"the data does not match the table's schema: {problem}; cast the data to the "
            'table\'s schema (Table.schema), or replace the table with mode="overwrite"',
        )


class ColumnMismatchError(SchemaMismatchError):
    """One column of the data does not fit the table; ``column`` is its dotted path
    (a list's items are ``[]``, a map's entries ``{}``) and ``problem`` says how."""

    def __init__(self, uri: str, column: str, problem: str) -> None:
        super().__init__(uri, f"column {column!r}: {problem}")
        self.column = column
        self.problem = problem


class UnsupportedInputError(TableError, TypeError):
    """An object of a kind this verb cannot take (e.g. a pylance operation that
    lancetx cannot convert). Also a TypeError. Nothing was written."""

    def __init__(self, uri: str, what: object, expected: str) -> None:
        kind = type(what)
        self.type_name = f"{kind.__module__}.{kind.__qualname__}"
        super().__init__(uri, f"cannot take a {self.type_name} here: {expected}")


class ForeignFragmentError(TableError):
    """Fragments whose data files are not under this table's data directory, nor under
    a base path the table registers (``bases``), or do not exist there.

    Committing them would publish rows whose files live elsewhere (another table,
    a typo'd URI) and can vanish with that place. Nothing was written.
    """

    def __init__(
        self,
        uri: str,
        data_dir: str,
        files: Sequence[str],
        bases: Sequence[str] = (),
        reasons: Mapping[str, str] | None = None,
    ) -> None:
        self.files = list(files)
        self.bases = list(bases)
        why = reasons or {}
        shown = ", ".join(f"{f} ({why[f]})" if f in why else f for f in files[:5]) + (
            " …" if len(files) > 5 else ""
        )
        registered = (
            f" nor under a base path it registers ({'; '.join(bases)})"
            if bases
            else " (it registers no other base path)"
        )
        super().__init__(
            uri,
            f"data file(s) {shown} are not in this table's data directory {data_dir}"
            f"{registered}; write fragments with lance.fragment.write_fragments(data, "
            "<this table's data URI>) (Table.data_uri), or with target_bases=[...] for a "
            "registered base, and commit those",
        )


class PylanceCommitsItselfError(TableError):
    """A verb pylance can only carry out by committing to the table itself.

    lancetx never lets pylance commit behind its back (on a store without
    conditional PUT that would race other writers), so such verbs are refused;
    the message names the alternative.
    """

    def __init__(self, uri: str, verb: str, alternative: str) -> None:
        self.verb = verb
        self.alternative = alternative
        super().__init__(
            uri,
            f"{verb} can only be done by pylance committing to the table itself, which "
            f"lancetx does not allow; instead: {alternative}",
        )


class ReadOnlyTableError(TableError):
    """A write verb called on a read-only view (``Table.checkout``)."""

    def __init__(self, uri: str, version: int) -> None:
        self.version = version
        super().__init__(
            uri,
            f"this Table is a read-only view of version {version}; write through "
            "lancetx.open(uri) (the latest version), or restore this version with "
            f"Table.restore({version})",
        )


class WriterClosedError(TableError):
    """A streaming writer used after commit() or abort()."""

    def __init__(self, uri: str, state: str) -> None:
        self.state = state
        super().__init__(uri, f"this writer is already {state}; open a new one with Table.writer()")


class IndexRemapError(TableError):
    """``compact()`` asked pylance to remap the table's indices (its
    ``Compaction.commit``, run on a scratch copy) and got back something else than
    it needs: fragment ids other than the ones reserved, or no Rewrite. Nothing was
    committed but the reservation of fragment ids; the compaction's files were
    removed. Compact with ``{"defer_index_remap": True}``, or rebuild the indices
    afterwards with ``create_index(..., replace=True)``."""

    def __init__(self, uri: str, problem: str) -> None:
        self.problem = problem
        super().__init__(
            uri,
            f"could not remap the indices for the compaction: {problem}; nothing but a "
            'reservation of fragment ids was committed: compact with {"defer_index_remap": '
            "True}, or rebuild the indices with create_index(..., replace=True)",
        )


class TagError(TableError):
    """Base class of the errors of ``Table.tags`` and of opening a version by tag.
    ``tag`` names the tag. Nothing was written."""

    def __init__(self, uri: str, tag: str, message: str) -> None:
        self.tag = tag
        super().__init__(uri, message)


def _listed(tags: Mapping[str, int]) -> str:
    if not tags:
        return "the table has no tags"
    shown = ", ".join(f"{name!r} (version {version})" for name, version in sorted(tags.items()))
    return f"its tags: {shown}"


class TagNotFoundError(TagError, LookupError):
    """No tag of that name; ``existing`` maps each tag there is to its version."""

    def __init__(self, uri: str, tag: str, existing: Mapping[str, int]) -> None:
        self.existing = dict(existing)
        super().__init__(
            uri,
            tag,
            f"no tag {tag!r} ({_listed(existing)}); create it with "
            "Table.tags.create(name, version)",
        )


class TagExistsError(TagError):
    """``tags.create`` of a name that is already a tag (of ``version``)."""

    def __init__(self, uri: str, tag: str, version: int | None) -> None:
        self.version = version
        at = f" (version {version})" if version is not None else ""
        super().__init__(
            uri,
            tag,
            f"tag {tag!r} already exists{at}; move it with Table.tags.update({tag!r}, version) "
            "or delete it first",
        )


class InvalidTagNameError(TagError, ValueError):
    """A tag name Lance does not accept (``problem`` says why). Also a ValueError."""

    def __init__(self, uri: str, tag: str, problem: str) -> None:
        self.problem = problem
        super().__init__(
            uri,
            tag,
            f"{tag!r} is not a valid tag name: {problem} (and it may not begin or end "
            "with '.', contain '..' or end with '.lock')",
        )


class TagOnBranchError(TagError):
    """A tag (written by pylance) that names a version of another branch: lancetx
    commits one linear history and cannot read it by that tag."""

    def __init__(self, uri: str, tag: str, branch: str, version: int) -> None:
        self.branch = branch
        self.version = version
        super().__init__(
            uri,
            tag,
            f"tag {tag!r} names version {version} of branch {branch!r}, not of the main "
            "branch lancetx reads and writes; open that branch with pylance",
        )


class TagTargetRemovedError(VersionNotFoundError):
    """``tags.create``/``update`` lost a race with a cleanup: the version existed when
    the tag was written, and was gone right after. The tag was deleted again (or put
    back as it was), so no tag names a removed version."""

    def __init__(self, uri: str, tag: str, version: int) -> None:
        self.tag = tag
        super().__init__(
            uri,
            version,
            f"a cleanup removed it while tag {tag!r} was being written; the tag was "
            "withdrawn. Tag a version that still exists (Table.history())",
        )


def pylance_gist(exc: BaseException) -> str:
    """The gist of a pylance error for a message of ours: its first line, without the
    Rust source locations pylance appends (at most 300 characters)."""
    text = str(exc).strip().splitlines()
    return text[0].split(", /")[0][:300] if text else type(exc).__name__


def says_not_found(exc: BaseException) -> bool:
    """Whether pylance's error says what it opened is not there (a version's manifest or
    a data file a cleanup removed), not that it could not tell (unreachable, denied) or
    that the request itself is wrong (a bad filter, an unknown column)."""
    return "not found" in str(exc).lower()


def version_ranges(versions: Sequence[int]) -> str:
    """``[3, 4, 5, 9]`` → ``"3-5, 9"``."""
    ordered = sorted(set(versions))
    parts: list[str] = []
    start = prev = None
    for v in [*ordered, None]:
        if v is not None and prev is not None and v == prev + 1:
            prev = v
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = v
    return ", ".join(parts)


class VersionsRemovedError(VersionNotFoundError):
    """Versions whose changes were still to be read (``Table.changes``, a Spark stream)
    were removed by a cleanup: the rows they appended or changed cannot be read any
    more. ``versions`` lists them; ``oldest`` is the oldest version after them that
    is still there (None if none is)."""

    def __init__(
        self, uri: str, versions: Sequence[int], oldest: int | None, advice: str = ""
    ) -> None:
        self.uri = uri
        self.versions = sorted(versions)
        self.version = self.versions[0]
        self.oldest = oldest
        after = f"; the oldest version after them is {oldest}" if oldest is not None else ""
        default = (
            f"read its changes from version {oldest} on (Table.changes(since={oldest - 1}))"
            if oldest is not None
            else "read the table as it is now"
        )
        LancetxError.__init__(
            self,
            f"version(s) {version_ranges(self.versions)} of table {uri!r} were removed by a "
            f"cleanup, so the rows they appended or changed cannot be read any more{after}. "
            f"{advice or default[0].upper() + default[1:]}",
        )


# ----------------------------------- maintenance (lancetx.ops, lancetx-sync)


class IamPolicyError(LancetxError, ValueError):
    """The policy cannot be written as asked (an unsafe path, a missing account or key)."""


class UnsafeThresholdError(LancetxError, ValueError):
    """gc was asked for a threshold below its minimum (``lancetx.ops.gc.MINIMUM_OLDER_THAN``)
    without being forced. ``older_than`` is what was asked, ``minimum`` the smallest
    threshold gc accepts; the message says why and what to pass instead."""

    def __init__(self, older_than: timedelta, minimum: timedelta, message: str) -> None:
        self.older_than = older_than
        self.minimum = minimum
        super().__init__(message)


class RepairVerificationError(LancetxError):
    """A manifest repair wrote did not read back as expected; the item was not changed."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        super().__init__(
            f"the manifest written to {path!r} does not read back as expected ({problem}); "
            "the DynamoDB item was not changed. Delete that object and run repair again"
        )


class NoParentError(LancetxError):
    """A wedged version's parent cannot be read, so it cannot be rebuilt."""


class WedgedTableError(LancetxError):
    """gc/cleanup refuse to run on a table with versions that need repair first."""

    def __init__(self, uri: str, versions: list[int], command: str) -> None:
        self.versions = versions
        super().__init__(
            f"{uri!r} has version(s) {versions} that cannot be read (wedged or missing "
            f"manifest); their repair may need files this would delete. Run {command} first"
        )


class UntrustedReferenceError(LancetxError):
    """An item or a manifest points outside the table: gc/cleanup delete nothing."""

    def __init__(self, uri: str, refused: list[str], command: str) -> None:
        self.refused = refused
        shown = "; ".join(refused[:3]) + (
            f"; … ({len(refused) - 3} more)" if len(refused) > 3 else ""
        )
        super().__init__(
            f"{uri!r}: refusing to follow {len(refused)} reference(s) that point outside the "
            f"table ({shown}); nothing was deleted. {command} reports each with its fix"
        )


class MaintenanceRaceError(LancetxError):
    """gc/cleanup could not learn what versions committed while they ran reference, so
    they deleted no file after that point (files kept are garbage a later run finds).
    ``unread`` maps each such version to why its manifest could not be read."""

    def __init__(self, uri: str, unread: dict[int, str], command: str) -> None:
        self.unread = unread
        shown = "; ".join(f"version {v}: {why}" for v, why in sorted(unread.items())[:3])
        super().__init__(
            f"{uri!r}: version(s) {sorted(unread)} were committed while this ran and their "
            f"manifests could not be read ({shown}), so what they reference is unknown and "
            f"no file was deleted after that point. Run it again ({command}); if it keeps "
            "failing, give cleanup an age floor (--older-than) so that versions committed "
            "meanwhile are not removed under it"
        )


class NotAnExternalStoreTableError(LancetxError, ValueError):
    """A command that works on the DynamoDB side was given a URI without one."""

    def __init__(self, uri: str, command: str) -> None:
        self.uri = uri
        super().__init__(
            f"`lancetx-sync {command}` needs an s3+ddb:// table URI "
            f"(s3+ddb://bucket/path?ddbTableName=T), got {uri!r}"
        )


# ----------------------------------- the Spark data source (pyspark_lancetx)


class SparkOptionError(LancetxError, ValueError):
    """A data-source option has a value that cannot be used."""

    def __init__(self, option: str, value: str | None, expected: str) -> None:
        self.option = option
        self.value = value
        super().__init__(f"option {option!r}={value!r} is invalid: expected {expected}")


class UnknownSparkOptionError(SparkOptionError):
    """An option name the data source does not know (a typo would otherwise be ignored)."""

    def __init__(self, option: str, where: str, suggestion: str) -> None:
        self.option = option
        self.value = None
        LancetxError.__init__(self, f"unknown option {option!r} {where}: {suggestion}")


class SparkSetupError(LancetxError):
    """Spark cannot be made to find the data source from here; the message says what to set."""


class SparkSchemaError(LancetxError):
    """The DataFrame's columns do not fit the table (or cannot be stored at all), or
    (``reading``) a schema given to a read names a column the table lacks or retypes one.

    ``column`` is the dotted path of the first offending column.
    """

    def __init__(self, uri: str, column: str, problem: str, *, reading: bool = False) -> None:
        self.uri = uri
        self.column = column
        self.problem = problem
        where = "read from" if reading else "written to"
        super().__init__(f"column {column!r} cannot be {where} {uri!r}: {problem}")


class UnsupportedSparkTypeError(SparkSchemaError):
    """A Spark type with no faithful Lance/Arrow representation (intervals, void, variant)."""


class StreamSourceError(LancetxError):
    """A streaming read (``spark.readStream.format("lancetx")``) cannot go past
    ``version`` of ``uri``; the rows of the versions before it were delivered."""

    def __init__(self, uri: str, version: int, message: str) -> None:
        self.uri = uri
        self.version = version
        super().__init__(message)


class StreamChangeCommitError(StreamSourceError):
    """A version the stream reached deleted or changed rows (a delete, an update, a
    merge that updates or deletes, an overwrite, a restore, new columns): a stream
    of appended rows cannot pass that on. ``operation`` names it, ``detail`` says
    what it did; the options that skip such versions are named in the message."""

    def __init__(
        self, uri: str, version: int, operation: str | None, detail: str, deletes_only: bool
    ) -> None:
        self.operation = operation
        self.detail = detail
        skip = "skipChangeCommits=true (skips every version that deletes or changes rows"
        if deletes_only:
            skip = "ignoreDeletes=true (skips versions that only delete rows) or " + skip
        super().__init__(
            uri,
            version,
            f"version {version} of {uri!r} is a {operation or 'commit'} that {detail}: a "
            "streaming read delivers appended rows and cannot pass deleted or changed rows "
            f"on. To go on, restart the query with option {skip}, together with any rows "
            f"they appended), or start a new query (new checkpointLocation) with "
            f"startingVersion={version + 1}",
        )


class StreamSchemaChangedError(StreamSourceError):
    """A version after the stream's schema was taken no longer has one of its columns
    (dropped or renamed): the stream cannot fill it. Restarting the query (same
    checkpoint) takes the table's schema anew."""

    def __init__(self, uri: str, version: int, operation: str | None, column: str) -> None:
        self.column = column
        self.operation = operation
        super().__init__(
            uri,
            version,
            f"version {version} of {uri!r} ({operation or 'a commit'}) has no column "
            f"{column!r}, which this stream reads: it was dropped or renamed after the query "
            "started. Restart the query (the same checkpointLocation): it reads on with the "
            "table's schema as it is then",
        )


class JobCommitUnknownError(CommitStateUnknownError):
    """The job's commit may or may not have landed, and it could not be settled in time.

    The job's data files are kept. Look the job up with
    ``pyspark_lancetx.last_commit(uri, job_id)`` once the store answers again:
    a version there means the job committed; none means it did not, and the job
    can be re-run with the same ``job_id`` (it will not commit twice).
    """

    def __init__(self, uri: str, job_id: str, version: int, detail: str) -> None:
        self.job_id = job_id
        super().__init__(uri, version, None, detail)
        self.args = (
            f"outcome of Spark job {job_id!r} committing to {uri!r} is unknown ({detail}); its "
            f"data files are kept. Call pyspark_lancetx.last_commit({uri!r}, {job_id!r}) when the "
            "store answers: a version means it committed; None means re-run the job with the "
            "same job_id option (it will not commit twice)",
        )

    def __str__(self) -> str:
        return str(self.args[0])


class JobCommitTimeoutError(CommitError):
    """The job lost the race for a version for longer than its commit budget.

    Nothing was committed for the job and its data files were removed.
    """

    retryable = True

    def __init__(self, uri: str, job_id: str, seconds: float, attempts: int) -> None:
        self.uri = uri
        self.job_id = job_id
        super().__init__(
            f"Spark job {job_id!r} could not commit to {uri!r} within {seconds:.0f}s "
            f"({attempts} attempts lost to concurrent writers); nothing was committed. Re-run the "
            "job, or raise the commit_timeout option"
        )


__all__ = [
    "AccessDeniedError",
    "AmbiguousWriteError",
    "ArgumentTypeError",
    "BadEntryError",
    "BasePathError",
    "BatchEntryExistsError",
    "ColumnMismatchError",
    "CommitConflictError",
    "CommitError",
    "CommitStateUnknownError",
    "ConditionalPutIgnoredError",
    "CorruptManifestError",
    "DanglingEntryError",
    "DatasetNotFoundError",
    "DeletionFileError",
    "DynamoDBTableNotFoundError",
    "DynamoDBTableSchemaError",
    "EndpointUnreachableError",
    "EntryExistsError",
    "EntryMismatchError",
    "EntryNotFoundError",
    "ExpectedVersionMismatchError",
    "ExternalStoreError",
    "ForeignFragmentError",
    "FormatError",
    "FragmentFormatError",
    "IamPolicyError",
    "IdempotencyKeyCollisionError",
    "IncompatibleConflictError",
    "IndexRemapError",
    "InvalidCommitError",
    "InvalidConfigError",
    "InvalidIdempotencyKeyError",
    "InvalidPredicateError",
    "InvalidRequestError",
    "InvalidTagNameError",
    "InvalidTransactionError",
    "InvalidUriError",
    "InvalidWriteParamError",
    "JobCommitTimeoutError",
    "JobCommitUnknownError",
    "KeyAlreadyCommittedError",
    "KeyExistsError",
    "LancetxError",
    "MaintenanceRaceError",
    "MalformedEntryError",
    "ManifestCopyMismatchError",
    "ManifestFormatError",
    "ManifestMissingError",
    "ManifestPointerError",
    "ManifestSizeMismatchError",
    "ManifestTooLargeError",
    "ManifestVersionMismatchError",
    "MissingExtraError",
    "MixedNamingSchemesError",
    "MultiTableClaimLostError",
    "NoParentError",
    "NotAnExternalStoreTableError",
    "ObjectExistsError",
    "ObjectNotFoundError",
    "ObjectStoreError",
    "ObjectTooLargeError",
    "OperationNotImplementedError",
    "PylanceCommitsItselfError",
    "ReadOnlyTableError",
    "RepairVerificationError",
    "RetriesExhaustedError",
    "RetryableConflictError",
    "RowIdFormatError",
    "SchemaConversionError",
    "SchemaMismatchError",
    "ServiceUnavailableError",
    "SparkOptionError",
    "SparkSchemaError",
    "SparkSetupError",
    "StorageOptionError",
    "StoreSchemaTooNewError",
    "StreamChangeCommitError",
    "StreamSchemaChangedError",
    "StreamSourceError",
    "TableCollisionError",
    "TableError",
    "TableExistsError",
    "TableMovedError",
    "TablesNotColocatedError",
    "TagError",
    "TagExistsError",
    "TagFileError",
    "TagNotFoundError",
    "TagOnBranchError",
    "TagTargetRemovedError",
    "ThrottledError",
    "TransactionFileError",
    "TransactionTooLargeError",
    "TransientObjectStoreError",
    "UnfinishedParentError",
    "UnknownColumnError",
    "UnknownSparkOptionError",
    "UnsafeThresholdError",
    "UnsupportedFeatureError",
    "UnsupportedInputError",
    "UnsupportedOperationError",
    "UnsupportedSparkTypeError",
    "UnsupportedTransactionError",
    "UntrustedManifestPathError",
    "UntrustedReferenceError",
    "VersionAlreadyExistsError",
    "VersionNotFoundError",
    "VersionsRemovedError",
    "WedgedTableError",
    "WedgedVersionError",
    "WriterClosedError",
]
