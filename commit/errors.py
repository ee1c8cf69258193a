"""Exception hierarchy for lancetx.

Every error a user can see derives from :class:`LancetxError`. Subclasses carry
the facts needed to act on them (the file, the version, the operation) as
attributes, and their messages say what happened and what to do next.

The tree::

    LancetxError
    ├── FormatError                  a file is not a valid Lance artifact
    │   ├── ManifestFormatError
    │   ├── TransactionFileError
    │   ├── DeletionFileError
    │   └── SchemaConversionError
    ├── UnsupportedFeatureError      a feature flag we do not implement
    ├── ObjectStoreError             an object-store request failed
    │   ├── ObjectNotFoundError
    │   ├── ObjectExistsError        a conditional create lost to an existing object
    │   ├── UnsupportedOperationError  the store lacks the capability asked for
    │   └── TransientObjectStoreError  5xx / throttling / connection; safe to retry
    ├── DatasetNotFoundError
    ├── VersionNotFoundError
    └── CommitError                  (see lancetx.commit.errors for the engine's subclasses)
"""

from __future__ import annotations


class LancetxError(Exception):
    """Base class of every error raised by lancetx."""


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
