"""lancetx: safe concurrent commits to Lance tables on object stores without conditional PUT.

The front door::

    import lancetx
    table = lancetx.write_table(uri, data)          # create (or mode="append"/"overwrite")
    table = lancetx.open(uri, storage_options)      # an existing table
    table.append(more); table.delete("id < 3"); table.to_table()

Every write verb commits one version through lancetx (pylance writes the data, never
the commit). ``lancetx.aio`` has the same verbs for asyncio. The layers below are
importable on their own: ``lancetx.commit`` (format, storage, handlers, engine) and
``lancetx.externalstore``.
"""

from __future__ import annotations

from lancetx.commit.errors import (
    DatasetNotFoundError,
    ExpectedVersionMismatchError,
    IdempotencyKeyCollisionError,
    LancetxError,
    VersionNotFoundError,
)
from lancetx.commit.package_version import installed_version
from lancetx.committing import CommitResult
from lancetx.errors import (
    ArgumentTypeError,
    ForeignFragmentError,
    InvalidPredicateError,
    InvalidTagNameError,
    PylanceCommitsItselfError,
    ReadOnlyTableError,
    SchemaMismatchError,
    TableError,
    TableExistsError,
    TagError,
    TagExistsError,
    TagNotFoundError,
    TagOnBranchError,
    TagTargetRemovedError,
    UnknownColumnError,
    UnsupportedInputError,
    WriterClosedError,
)
from lancetx.history import VersionInfo
from lancetx.multi_table import commit_many
from lancetx.table import MergeInsertBuilder, Table, commit_fragments, connect, open, write_table
from lancetx.tags import TagInfo, Tags
from lancetx.writer import TableWriter

__version__: str = installed_version()  # "0.0.0+unknown" in a source tree never installed

__all__ = [
    "ArgumentTypeError",
    "CommitResult",
    "DatasetNotFoundError",
    "ExpectedVersionMismatchError",
    "ForeignFragmentError",
    "IdempotencyKeyCollisionError",
    "InvalidPredicateError",
    "InvalidTagNameError",
    "LancetxError",
    "MergeInsertBuilder",
    "PylanceCommitsItselfError",
    "ReadOnlyTableError",
    "SchemaMismatchError",
    "Table",
    "TableError",
    "TableExistsError",
    "TableWriter",
    "TagError",
    "TagExistsError",
    "TagInfo",
    "TagNotFoundError",
    "TagOnBranchError",
    "TagTargetRemovedError",
    "Tags",
    "UnknownColumnError",
    "UnsupportedInputError",
    "VersionInfo",
    "VersionNotFoundError",
    "WriterClosedError",
    "__version__",
    "commit_fragments",
    "commit_many",
    "connect",
    "open",
    "write_table",
]
