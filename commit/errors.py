"""Exception hierarchy for lancetx: the errors of the commit layer.

Every error a user can see derives from :class:`LancetxError`. Subclasses carry
the facts needed to act on them (the file, the version, the operation) as
attributes, their messages say what happened and what to do next, and
:attr:`LancetxError.retryable` says whether the same call may simply be made
again. :mod:`lancetx.errors` re-exports every error (this layer's, the external
store's, the front door's, the maintenance tools' and the Spark data source's)
and draws the whole tree.

The errors raised by the commit layer (``lancetx.commit``: this module, the
format readers, the conditional-PUT probe and the manifest builder); ``*``
marks ``retryable``::

    LancetxError
    ├── FormatError                      a file is not a valid Lance artifact
    │   ├── ManifestFormatError
    │   ├── TransactionFileError
    │   ├── DeletionFileError
    │   ├── ObjectTooLargeError          larger than the cap on its kind (manifest, transaction, tag)
    │   │   ├── ManifestTooLargeError    (also a ManifestFormatError)
    │   │   └── TransactionTooLargeError (also a TransactionFileError)
    │   ├── FragmentFormatError          fragment metadata (format.fragments)
    │   ├── MixedNamingSchemesError      V1 and V2 manifest names in one _versions/ (format.listing)
    │   ├── RowIdFormatError             a row-id sequence (format.rowids)
    │   ├── TagFileError                 a tag file that names no version (format.retention)
    │   └── BasePathError                a base path (or a file's base id) lancetx cannot follow (format.bases)
    ├── SchemaConversionError            an Arrow schema or field list we cannot convert
    ├── UnsupportedFeatureError          a feature flag we do not implement
    │   └── UnsupportedTransactionError  an operation we do not build (engine.builder.errors)
    ├── ObjectStoreError                 an object-store request failed
    │   ├── ObjectNotFoundError
    │   ├── ObjectExistsError            a conditional create lost to an existing object
    │   ├── UnsupportedOperationError    the store lacks the capability asked for
    │   │   └── ConditionalPutIgnoredError  the store ignores If-None-Match (handlers.probe)
    │   └── TransientObjectStoreError *  5xx / throttling / connection
    ├── InvalidUriError                  a table URI we cannot open (also a ValueError)
    ├── StorageOptionError               a storage option we cannot use (also a ValueError)
    ├── MissingExtraError                an optional feature's packages are absent (also an ImportError)
    ├── DatasetNotFoundError
    ├── VersionNotFoundError
    └── CommitError                      committing a transaction failed
        ├── CommitConflictError          a transaction committed since ours conflicts with it
        │   ├── RetryableConflictError * re-planned on the new version, the result is the same
        │   └── IncompatibleConflictError
        ├── RetriesExhaustedError *      every attempt lost the race until the budget ran out
        ├── ExpectedVersionMismatchError a strict commit found another version
        ├── UnfinishedParentError *      the parent version is committed but not finished yet
        ├── InvalidCommitError           a request that cannot be valid for this table
        ├── InvalidTransactionError      a transaction that does not fit its parent (engine.builder.errors)
        ├── IdempotencyKeyCollisionError two keys' hashes met: use another key
        ├── CommitStateUnknownError *    the claim may have landed: retry with the same key
        ├── VersionAlreadyExistsError    another writer claimed the version (the loop rebases)
        └── KeyAlreadyCommittedError     the idempotency key is committed already
"""

from __future__ import annotations

from typing import Any, ClassVar


class LancetxError(Exception):
    """Base class of every error raised by lancetx.

    ``except lancetx.LancetxError`` catches them all; every public subclass is
    exported by :mod:`lancetx.errors` and ``lancetx`` (the whole tree is drawn in
    :mod:`lancetx.errors`).

    :attr:`retryable` says whether making the same call again is both *safe* and
    *may succeed* without changing anything first. The rule, per class:

    * True when nothing was committed and the cause is transient (throttling, an
      endpoint that could not be reached, 5xx or a dropped connection, losing the
      race for a version until the retry budget ran out, a parent version not yet
      finished, a conflict whose operation re-planned on the new version gives the
      same result), or when the outcome is unknown and a retry that carries the
      *same idempotency key* finds the first commit instead of committing twice
      (:class:`CommitStateUnknownError`; without a key, look the transaction up
      first, as its message says).
    * False otherwise: bad input, configuration, permissions, a missing or damaged
      table or file, an incompatible conflict, a strict commit whose expected
      version moved, and the lost-race signals the commit loop handles itself
      (:class:`VersionAlreadyExistsError` and the like, which a caller never sees).

    A retry should wait (back off) first; lancetx already retried transient
    failures within its own budget before raising.
    """

    #: Whether the same call, made again (after a pause), is safe and may succeed.
    retryable: ClassVar[bool] = False


# --------------------------------------------------------------------------- format


class FormatError(LancetxError):
    """A file is not a valid Lance artifact. Nothing was written because of it.

    ``path`` names the file (as a full URI where known); ``problem`` is the
    specific defect.
    """

    kind = "file"

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"invalid Lance {self.kind} {path!r}: {problem}")


class ManifestFormatError(FormatError):
    """A manifest file is truncated, has the wrong magic, or does not decode."""

    kind = "manifest"


class TransactionFileError(FormatError):
    """A ``_transactions/*.txn`` file does not decode as a Transaction message."""

    kind = "transaction file"


class DeletionFileError(FormatError):
    """A ``_deletions/*`` file is of the wrong type or does not decode."""

    kind = "deletion file"


class BasePathError(FormatError):
    """A manifest's base path that cannot be followed safely (a path that walks up
    with ``..``, an S3 URI without a bucket), or a file stored under a base id the
    manifest does not register. Nothing is read, committed or deleted through it."""

    kind = "base path"


class ObjectTooLargeError(FormatError):
    """An object read whole (a manifest, a transaction file, a tag) is larger than the
    cap on its kind: refused before its body is read, so a hostile or stray object
    at such a name cannot exhaust memory. ``size`` is what the store reported."""

    def __init__(self, path: str, kind: str, size: int, cap: int, setting: str) -> None:
        self.kind = kind
        self.size = size
        self.cap = cap
        self.setting = setting
        super().__init__(
            path,
            f"it is {size:,} bytes, more than the {cap:,}-byte limit on {kind}s; nothing of it "
            f"was read. A real {kind} is far smaller: check what wrote this object, or raise "
            f"the limit ({setting})",
        )


class ManifestTooLargeError(ObjectTooLargeError, ManifestFormatError):
    """A manifest larger than ``lancetx_max_manifest_bytes``; also a ManifestFormatError."""


class TransactionTooLargeError(ObjectTooLargeError, TransactionFileError):
    """A transaction file larger than ``lancetx_max_transaction_bytes``; also a
    TransactionFileError."""


class SchemaConversionError(LancetxError):
    """An Arrow schema or Lance field list cannot be converted."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"cannot convert field {field!r}: {problem}")


class UnsupportedFeatureError(LancetxError):
    """A table requires a feature flag this version of lancetx does not implement.

    Opening or writing such a table could silently misread or corrupt it, so we
    refuse. ``flags`` are the unknown bits; ``role`` is ``"reader"`` or ``"writer"``.
    """

    def __init__(self, path: str, role: str, flags: int, names: list[str] | None = None) -> None:
        self.path = path
        self.role = role
        self.flags = flags
        described = ", ".join(names) if names else f"bits 0x{flags:x}"
        super().__init__(
            f"{path!r} requires {role} feature flag(s) lancetx does not support "
            f"({described}); upgrade lancetx or use a newer Lance to access this table"
        )


# ---------------------------------------------------------------------- object store


class ObjectStoreError(LancetxError):
    """An object-store request failed. ``operation`` is the request (e.g. ``PutObject``)."""

    def __init__(self, operation: str, uri: str, message: str) -> None:
        self.operation = operation
        self.uri = uri
        super().__init__(f"{operation} {uri}: {message}")


class ObjectNotFoundError(ObjectStoreError):
    """The object does not exist."""

    def __init__(self, operation: str, uri: str, message: str = "object not found") -> None:
        super().__init__(operation, uri, message)


class ObjectExistsError(ObjectStoreError):
    """A create-if-absent write found an existing object (the race was lost)."""

    def __init__(self, operation: str, uri: str, message: str = "object already exists") -> None:
        super().__init__(operation, uri, message)


class UnsupportedOperationError(ObjectStoreError):
    """The store lacks the capability a caller asked for (e.g. conditional PUT on a legacy store)."""


class TransientObjectStoreError(ObjectStoreError):
    """A failure that may succeed if retried (5xx, throttling, connection reset)."""

    retryable = True


# ---------------------------------------------------------------- URIs and options


class InvalidUriError(LancetxError, ValueError):
    """A table URI or path that cannot be opened. Also a ValueError, as it is bad input."""

    def __init__(self, uri: str, problem: str) -> None:
        self.uri = uri
        self.problem = problem
        super().__init__(f"invalid table URI {uri!r}: {problem}")


class StorageOptionError(LancetxError, ValueError):
    """An object-store storage option (or S3Config field) has a value we cannot use."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(f"invalid S3 storage options: {problem}")


class MissingExtraError(LancetxError, ImportError):
    """An optional feature needs packages that are not installed.

    Also an ImportError, so ``except ImportError`` around an optional import still works.
    """

    def __init__(self, feature: str, extra: str, missing: str | None) -> None:
        self.feature = feature
        self.extra = extra
        self.missing = missing
        super().__init__(
            f"{feature} needs {missing or 'packages'} that are not installed: "
            f"pip install 'lancetx[{extra}]'",
            name=missing,
        )


# ------------------------------------------------------------------------ datasets


class DatasetNotFoundError(LancetxError):
    """No Lance table exists at the location (no manifests under ``_versions/``)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        super().__init__(f"no Lance table at {uri!r}: no manifest found under _versions/")


class VersionNotFoundError(LancetxError):
    """The requested version of a table does not exist."""

    def __init__(self, uri: str, version: int, detail: str = "") -> None:
        self.uri = uri
        self.version = version
        extra = f" ({detail})" if detail else ""
        super().__init__(f"version {version} of table {uri!r} does not exist{extra}")


class CommitError(LancetxError):
    """Base class of errors raised while committing a transaction."""


class CommitConflictError(CommitError):
    """A transaction conflicts with one committed since its read version.

    ``version`` is the version ours tried to build on top of; ``conflicts``
    lists ``(committed_version, operation_name, reason)`` for each blocking
    transaction; ``transaction_uuid`` identifies ours.
    """

    retryable = False

    def __init__(
        self,
        uri: str,
        transaction_uuid: str,
        operation: str,
        read_version: int,
        conflicts: list[tuple[int | None, str, str]],
    ) -> None:
        self.uri = uri
        self.transaction_uuid = transaction_uuid
        self.operation = operation
        self.read_version = read_version
        self.conflicts = conflicts
        what = "; ".join(reason for _, _, reason in conflicts)
        kind = "retryable conflict" if self.retryable else "incompatible conflict"
        super().__init__(f"{kind} committing {operation} (read v{read_version}) to {uri!r}: {what}")


class RetryableConflictError(CommitConflictError):
    """Ours cannot be rebased, but re-reading the table and redoing the operation
    yields an equivalent result (e.g. a delete racing a compaction of its fragment).
    Nothing was written for ours."""

    retryable = True


class IncompatibleConflictError(CommitConflictError):
    """Ours no longer makes sense on top of what was committed (e.g. an append
    racing an overwrite). Retrying unchanged may produce a different result than
    intended. Nothing was written for ours."""


class RetriesExhaustedError(CommitError):
    """Every attempt lost the race to claim the next version, until the retry
    budget (time, or the count cap) ran out. Nothing of this transaction was committed."""

    retryable = True

    def __init__(
        self,
        uri: str,
        transaction_uuid: str,
        attempts: int,
        last_version: int,
        elapsed: float | None = None,
    ) -> None:
        self.uri = uri
        self.transaction_uuid = transaction_uuid
        self.attempts = attempts
        self.last_version = last_version
        self.elapsed = elapsed
        spent = f" in {elapsed:.1f} s" if elapsed is not None else ""
        super().__init__(
            f"could not commit transaction {transaction_uuid} to {uri!r} after {attempts} attempts"
            f"{spent} (last tried version {last_version}); contention is high: retry later or "
            "raise CommitOptions.retry.max_elapsed (or max_attempts)"
        )


class ExpectedVersionMismatchError(CommitError):
    """A strict commit found the table at another version than expected. Nothing was written."""

    def __init__(self, uri: str, expected: int, actual: int) -> None:
        self.uri = uri
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"strict commit to {uri!r} expected the table at version {expected}, but it is at "
            f"version {actual}; re-read the table and rebuild the transaction"
        )


class UnfinishedParentError(CommitError):
    """The version a commit would build on is committed but still staged, and
    finishing it (copying its manifest to the final name, pointing its entry
    there) failed or could not be settled. Nothing of this transaction was claimed."""

    retryable = True

    def __init__(self, uri: str, version: int, transaction_uuid: str, key: str) -> None:
        self.uri = uri
        self.version = version
        self.transaction_uuid = transaction_uuid
        self.key = key
        super().__init__(
            f"version {version} of {uri!r} is committed but could not be finished (its staged "
            f"manifest {key!r} copied to its final name and its entry pointed there; the log says "
            f"why), so transaction {transaction_uuid} was not claimed on top of it: the object "
            "store would lag two versions behind. Nothing of it was committed; retry once the "
            "store answers again (any reader or writer finishes the version)"
        )


class InvalidCommitError(CommitError):
    """A commit request that cannot be valid for this table (nothing was written)."""

    def __init__(self, uri: str, problem: str) -> None:
        self.uri = uri
        self.problem = problem
        super().__init__(f"cannot commit to {uri!r}: {problem}")


class IdempotencyKeyCollisionError(CommitError):
    """Two idempotency keys share one key item's place (``slot``: 63 bits of their
    SHA-256; a chance of about one in 10**18 per pair). The key item found belongs to
    ``other_key`` (committed as ``other_version``), so it says nothing about ``key``:
    it is never taken as a match. Nothing was committed for ``key``."""

    def __init__(self, uri: str, key: str, other_key: str, other_version: int, slot: int) -> None:
        self.uri = uri
        self.key = key
        self.other_key = other_key
        self.other_version = other_version
        self.slot = slot
        super().__init__(
            f"idempotency key {key!r} of {uri!r} shares its key item (slot {slot}) with key "
            f"{other_key!r}, committed as version {other_version}; nothing was committed for "
            f"{key!r}: commit with another idempotency key (e.g. add a suffix)"
        )


# -------------------------------------------------------------------- claims


class VersionAlreadyExistsError(CommitError):
    """Another writer claimed ``version`` first (the commit loop's signal to rebase).

    ``winner`` is the location the winner committed, when the handler learned it
    without extra requests (for example from a DynamoDB condition failure), so
    the loser can load the winner's transaction at once.
    """

    #: A :class:`~lancetx.commit.format.location.ManifestLocation` (this module sits
    #: below the format layer, so the type is not named here).
    winner: Any

    def __init__(self, uri: str, version: int, winner: Any = None) -> None:
        self.uri = uri
        self.version = version
        self.winner = winner
        super().__init__(f"version {version} of {uri!r} was committed by another writer")


class KeyAlreadyCommittedError(CommitError):
    """The claim was refused because a commit with the same idempotency ``key``
    already landed, as ``version`` (by transaction ``transaction_uuid``): nothing of
    this claim was written, and its staged manifest was deleted.

    The commit loop answers it with that version, ``deduplicated``. It reaches the
    caller of ``commit_transaction`` only when that version's manifest cannot be read
    any more (``cleanup`` removed it): the key is committed all the same, as
    ``version``; whether that version referred to the caller's data files cannot be
    read, so keep them (an unreferenced file is harmless; ``gc`` removes it).
    """

    def __init__(
        self,
        uri: str,
        key: str,
        version: int,
        transaction_uuid: str | None,
        detail: str = "",
    ) -> None:
        self.uri = uri
        self.key = key
        self.version = version
        self.transaction_uuid = transaction_uuid
        self.detail = detail
        by = f" by transaction {transaction_uuid}" if transaction_uuid else ""
        extra = f" ({detail})" if detail else ""
        super().__init__(
            f"idempotency key {key!r} of {uri!r} was already committed as version {version}"
            f"{by}; nothing new was committed{extra}"
        )


class CommitStateUnknownError(CommitError):
    """The outcome of a commit request could not be determined (e.g. a timeout
    after the request may have landed). The version may or may not be ours: do
    not retry blindly; re-open the table and check whether the transaction with
    ``transaction_uuid`` is present.

    ``kept_files`` are the files the commit wrote and kept because the version may
    refer to them (see :mod:`lancetx.commit.engine.unreferenced`); ``kept_message``
    says which and how to settle the outcome, and is part of the message."""

    retryable = True

    #: Files the commit wrote and kept (full URIs), set as the error passes each layer.
    kept_files: tuple[str, ...] = ()
    #: Which files were kept and what settles the outcome (None: nothing was kept).
    kept_message: str | None = None

    def __init__(self, uri: str, version: int, transaction_uuid: str | None, detail: str) -> None:
        self.uri = uri
        self.version = version
        self.transaction_uuid = transaction_uuid
        super().__init__(
            f"outcome of committing version {version} of {uri!r} is unknown ({detail}); "
            f"re-open the table and look for transaction {transaction_uuid} before retrying"
        )

    def __str__(self) -> str:
        text = super().__str__()
        return f"{text}; {self.kept_message}" if self.kept_message else text
