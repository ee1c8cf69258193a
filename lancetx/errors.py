"""Errors of the front door (the Table API).

Each one is a :class:`~lancetx.commit.errors.LancetxError` raised *before* anything
is committed: the message names the table, the thing at fault (column, predicate,
file, Python type) and what to do instead. Errors of the commit itself (conflicts,
strict-mode mismatches, unknown outcomes) come from :mod:`lancetx.commit.errors`
and :mod:`lancetx.commit.handlers.interface` unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lancetx.commit.errors import LancetxError, VersionNotFoundError


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
    """Fragments whose data files are not under this table's data directory.

    Committing them would publish rows whose files live elsewhere (another table,
    a typo'd URI) and can vanish with that place. Nothing was written.
    """

    def __init__(self, uri: str, data_dir: str, files: Sequence[str]) -> None:
        self.files = list(files)
        shown = ", ".join(files[:5]) + (" …" if len(files) > 5 else "")
        super().__init__(
            uri,
            f"data file(s) {shown} are not in this table's data directory {data_dir}; "
            "write fragments with lance.fragment.write_fragments(data, <this table's data "
            "URI>) (Table.data_uri) and commit those",
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


__all__ = [
    "ArgumentTypeError",
    "ColumnMismatchError",
    "ForeignFragmentError",
    "InvalidIdempotencyKeyError",
    "InvalidPredicateError",
    "InvalidTagNameError",
    "InvalidWriteParamError",
    "PylanceCommitsItselfError",
    "ReadOnlyTableError",
    "SchemaMismatchError",
    "TableError",
    "TableExistsError",
    "TagError",
    "TagExistsError",
    "TagNotFoundError",
    "TagOnBranchError",
    "TagTargetRemovedError",
    "UnknownColumnError",
    "UnsupportedInputError",
    "WriterClosedError",
]
