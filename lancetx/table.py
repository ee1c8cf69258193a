"""The front door: ``lancetx.open`` / ``write_table`` / ``commit_fragments`` and :class:`Table`.

Every write verb is one transaction: pylance produces the data (uncommitted APIs),
lancetx commits it and returns the committed version. Reads go through pylance at
the version lancetx resolved (:attr:`Table.version`), so a Table reads exactly what
it last committed or opened, without pylance resolving "latest" on its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from lancetx.arguments import checked, checked_methods
from lancetx.commit.engine.parents import LATEST_READ_ATTEMPTS
from lancetx.commit.errors import DatasetNotFoundError
from lancetx.state import TableState

# Opening a table and reading its version loads none of the modules below (every
# CLI call and every Spark task pays its imports anew): each verb imports what it
# uses when it is called (``tests/test_import_cost.py``).
if TYPE_CHECKING:
    import pyarrow as pa
    from lance import LanceDataset

    from lancetx.changes import FragmentRows, VersionChange
    from lancetx.committing import CommitArgs, CommitResult, Plan, VerbFlags
    from lancetx.scanning import Scanner
    from lancetx.tags import Tags
    from lancetx.verbs.cloning import ClonePlan
    from lancetx.version_history import VersionInfo
    from lancetx.writer import TableWriter

R = TypeVar("R")

#: pylance verbs that only exist as "pylance commits itself", with what to use instead.
REFUSED_VERBS: Mapping[str, str] = {
    "insert": "Table.append(data)",
    "merge": "Table.add_columns(...) or Table.merge_insert(on=...)",
    "truncate_table": "Table.delete('true')",
    "optimize_indices": "Table.create_index(column, index_type, replace=True)",
    "delete_config_keys": "Table.update_config({key: None})",
    "update_field_metadata": "Table.commit(UpdateConfig(field_metadata_updates=...))",
    "create_branch": "a separate table (lancetx commits one linear history)",
}


def _args(
    commit_message: str | None,
    properties: Mapping[str, str] | None,
    idempotency_key: str | None,
    expected_version: int | None,
) -> CommitArgs:
    from lancetx.committing import CommitArgs

    return CommitArgs(commit_message, properties, idempotency_key, expected_version)


def _flags(
    *, replannable: bool = False, reusable: bool = False, owns_data: bool = True
) -> VerbFlags:
    from lancetx.committing import VerbFlags

    return VerbFlags(replannable=replannable, reusable=reusable, owns_data=owns_data)


@checked_methods
class TableVerbs(Generic[R]):
    """The write verbs, written once for :class:`Table` (``R`` = int) and
    :class:`lancetx.aio.AsyncTable` (``R`` = an awaitable int): each builds a plan
    and hands it to ``_run``, the driver of its flavour.

    Every write verb is one transaction and takes ``commit_message=``,
    ``properties=`` (stored in the transaction; pylance sees them too),
    ``idempotency_key=`` (a retried call with the same key returns the first
    commit's version instead of committing again) and ``expected_version=``
    (strict: commit only if the table is still at that version, else
    ExpectedVersionMismatchError, nothing written). Each returns the committed version.
    """

    @property
    def uri(self) -> str:
        raise NotImplementedError

    def __getattr__(self, name: str) -> Any:
        alternative = REFUSED_VERBS.get(name)
        if alternative is not None:
            from lancetx.errors import PylanceCommitsItselfError

            raise PylanceCommitsItselfError(self.uri, f"LanceDataset.{name}", alternative)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _run(self, plan: Plan, args: CommitArgs, flags: VerbFlags | None = None) -> R:
        raise NotImplementedError

    # -------------------------------------------------------------- write verbs

    def append(
        self,
        data: Any,
        *,
        schema: pa.Schema | None = None,
        commit_message: str | None = None,
        properties: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        expected_version: int | None = None,
        **write_params: Any,
    ) -> R:
        """Append ``data`` (anything pylance writes). ``write_params`` go to
        ``lance.fragment.write_fragments`` (max_rows_per_file, …)."""
        from lancetx.verbs.writing import WritePlan

        plan = WritePlan(data, overwrite=False, schema=schema, params=write_params)
        return self._run(
            plan,
            _args(commit_message, properties, idempotency_key, expected_version),
            _flags(reusable=True),
        )

    def overwrite(
        self,
        data: Any,
        *,
        schema: pa.Schema | None = None,
        commit_message: str | None = None,
        properties: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        expected_version: int | None = None,
        **write_params: Any,
    ) -> R:
        """Replace every row (and the schema) with ``data``; older versions stay readable."""
        from lancetx.verbs.writing import WritePlan

        plan = WritePlan(data, overwrite=True, schema=schema, params=write_params)
        return self._run(
            plan,
            _args(commit_message, properties, idempotency_key, expected_version),
            _flags(replannable=True, reusable=True),
        )

    def delete(
        self,
        predicate: str,
        *,
        commit_message: str | None = None,
        properties: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        expected_version: int | None = None,
    ) -> R:
        """Delete the rows matching the SQL ``predicate`` (re-planned after a retryable conflict)."""
        from lancetx.verbs.rows import plan_delete

        return self._run(
            plan_delete(predicate),
            _args(commit_message, properties, idempotency_key, expected_version),
            _flags(replannable=True),
        )

    def update(
        self,
        values: Mapping[str, Any],
        where: str | None = None,
        *,
        commit_message: str | None = None,
        properties: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        expected_version: int | None = None,
        **write_params: Any,
    ) -> R:
        """Set columns on the rows matching ``where`` (all rows when None). A string
        value is an SQL expression over the old row (``"price * 2"``); anything else
        is a literal."""
        from lancetx.verbs.rows import plan_update

        return self._run(
            plan_update(where, values, write_params),
            _args(commit_message, properties, idempotency_key, expected_version),
            _flags(replannable=True),
        )

    def merge_insert(self, on: str | Sequence[str]) -> MergeInsertBuilder[R]:
        """A builder like pylance's: ``table.merge_insert("id").when_matched_update_all()
        .when_not_matched_insert_all().execute(data)`` → the committed version.

        On the table's unenforced primary key (or with
        :meth:`MergeInsertBuilder.conflict_on_inserted_keys`), concurrent merges
        never insert one key twice: the later one plans again and updates."""
        from lancetx.verbs.merging import join_columns

        return MergeInsertBuilder(self, join_columns(on))

    def add_columns(
        self,
        transforms: Any,
        read_columns: list[str] | None = None,
        *,
        commit_message: str | None = None,
        properties: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        expected_version: int | None = None,
    ) -> R:
        """Add columns: ``{"name": "SQL expression"}``, a batch UDF, or Arrow fields
        (all-null, metadata only)."""
        from lancetx.verbs.columns import plan_add_columns

        return self._run(
            plan_add_columns(transforms, read_columns),
            _args(commit_message, properties, idempotency_key, expected_version),
        )

    def drop_columns(
        self,
        columns: Sequence[str],
        *,
        commit_message: str | None = None,
        properties: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        expected_version: int | None = None,
    ) -> R:
        """Drop top-level columns (metadata only; the data stays in older versions)."""
        from lancetx.verbs.columns import plan_drop_columns

        return self._run(
            plan_drop_columns(list(columns)),
            _args(commit_message, properties, idempotency_key, expected_version),
        )

    def alter_columns(
        self,
        *alterations: Mapping[str, Any],
        commit_message: str | None = None,
        properties: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        expected_version: int | None = None,
    ) -> R:
        """Rename columns or change nullability: ``{"path": "a", "name": "b"}``,
        ``{"path": "a", "nullable": True}``. A type change is refused (see the error)."""
        from lancetx.verbs.columns import plan_alter_columns

        return self._run(
            plan_alter_columns(list(alterations)),
            _args(commit_message, properties, idempotency_key, expected_version),
        )

    def compact(
        self,
        options: Mapping[str, Any] | None = None,
        *,
        commit_message: str | None = None,
        properties: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        expected_version: int | None = None,
    ) -> R:
        """Rewrite small fragments (and fragments with many deleted rows) into fewer
        ones: pylance's compaction plan and tasks (``options``: pylance's
        ``CompactionOptions``), one Rewrite committed by lancetx. Returns the current
        version unchanged when nothing needs compaction.

        Indices keep covering every row, as with pylance's ``compact_files``: vector
        indices over the rewritten fragments are remapped in the same Rewrite (their
        files rewritten by pylance so they point into the new fragments; the new
        fragments' ids are reserved first, which is a version of its own), scalar
        indices get a segment over the new fragments in a second version. With
        ``{"defer_index_remap": True}`` indices are left as they are and the Rewrite
        adds a version to the fragment reuse index, through which readers use them
        (remap later with ``create_index(..., replace=True)``). On a table with stable
        row ids nothing needs remapping."""
        from lancetx.verbs.maintenance import plan_compact

        return self._run(
            plan_compact(options or {}, strict=expected_version is not None),
            _args(commit_message, properties, idempotency_key, expected_version),
            _flags(replannable=True),
        )

    def create_index(
        self,
        column: str,
        index_type: str,
        *,
        name: str | None = None,
        replace: bool = False,
        commit_message: str | None = None,
        properties: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        expected_version: int | None = None,
        **index_params: Any,
    ) -> R:
        """Build an index (scalar: ``"BTREE"``, ``"BITMAP"``, …; vector: ``"IVF_PQ"``,
        ``"IVF_FLAT"``, … with ``num_partitions=`` etc.) over every fragment, via
        pylance's ``create_index_uncommitted``; lancetx commits it."""
        from lancetx.verbs.maintenance import plan_create_index

        return self._run(
            plan_create_index(column, index_type, name, replace, index_params),
            _args(commit_message, properties, idempotency_key, expected_version),
        )

    def drop_index(
        self,
        name: str,
        *,
        commit_message: str | None = None,
        properties: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        expected_version: int | None = None,
    ) -> R:
        """Remove the index ``name`` (every segment of it) from the table."""
        from lancetx.verbs.maintenance import plan_drop_index

        return self._run(
            plan_drop_index(name),
            _args(commit_message, properties, idempotency_key, expected_version),
        )

    def restore(
        self,
        version: int,
        *,
        commit_message: str | None = None,
        properties: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        expected_version: int | None = None,
    ) -> R:
        """Make ``version`` the latest again (as a new version; history is kept)."""
        from lancetx.verbs.maintenance import plan_restore

        return self._run(
            plan_restore(version),
            _args(commit_message, properties, idempotency_key, expected_version),
        )

    def update_config(
        self,
        values: Mapping[str, str | None],
        *,
        replace: bool = False,
        commit_message: str | None = None,
        properties: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        expected_version: int | None = None,
    ) -> R:
        """Set table config keys (``None`` removes a key; ``replace`` replaces all)."""
        from lancetx.verbs.maintenance import plan_update_config

        return self._run(
            plan_update_config(config=values, replace=replace),
            _args(commit_message, properties, idempotency_key, expected_version),
        )

    def update_metadata(
        self,
        values: Mapping[str, str | None],
        *,
        replace: bool = False,
        commit_message: str | None = None,
        properties: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        expected_version: int | None = None,
    ) -> R:
        """Set table metadata keys (``None`` removes a key)."""
        from lancetx.verbs.maintenance import plan_update_config

        return self._run(
            plan_update_config(table_metadata=values, replace=replace),
            _args(commit_message, properties, idempotency_key, expected_version),
        )

    def update_schema_metadata(
        self,
        values: Mapping[str, str | None],
        *,
        replace: bool = False,
        commit_message: str | None = None,
        properties: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        expected_version: int | None = None,
    ) -> R:
        """Set schema metadata keys (``None`` removes a key)."""
        from lancetx.verbs.maintenance import plan_update_config

        return self._run(
            plan_update_config(schema_metadata=values, replace=replace),
            _args(commit_message, properties, idempotency_key, expected_version),
        )

    def commit(
        self,
        transaction: Any,
        *,
        commit_message: str | None = None,
        properties: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        expected_version: int | None = None,
    ) -> R:
        """Commit a transaction planned elsewhere: a lancetx Transaction / operation, or a
        pylance ``Transaction`` / ``LanceOperation.*`` (converted; unsupported kinds are
        refused naming their type). Fragments must be in this table's data directory or
        under a base path it registers (ForeignFragmentError)."""
        from lancetx.convert import to_transaction
        from lancetx.verbs.writing import check_in_data_dir

        def plan(ctx: Any) -> Any:
            txn = to_transaction(self.uri, transaction, read_version=ctx.read_version)
            check_in_data_dir(ctx, list(txn.operation.added_fragments))
            return txn

        return self._run(
            plan,
            _args(commit_message, properties, idempotency_key, expected_version),
            _flags(owns_data=False),
        )


@checked_methods
class Table(TableVerbs[int]):
    """A Lance table committed through lancetx.

    Obtain one with :func:`open` or :func:`write_table`. :attr:`version` is the
    version this Table reads (the one it opened or last committed); write verbs
    plan against the newest version it knows and return the version they commit.
    Every write verb takes ``commit_message=``, ``properties=`` (stored in the
    transaction; pylance sees them too), ``idempotency_key=`` (a retried call with
    the same key returns the first commit's version instead of committing again) and
    ``expected_version=`` (strict: commit only if the table is still at that
    version, else ExpectedVersionMismatchError, nothing written).
    """

    def __init__(self, state: TableState, *, pinned: int | None = None) -> None:
        self._state = state
        self._pinned = pinned
        #: Details of the last commit made through this Table.
        self.last_commit: CommitResult | None = None

    # ----------------------------------------------------------------- identity

    @property
    def uri(self) -> str:
        """The table's URI as given (``s3+ddb://…``, ``s3://…`` or a path)."""
        return self._state.uri

    @property
    def data_uri(self) -> str:
        """Where data files go (pass it to ``lance.fragment.write_fragments``)."""
        return self._state.conn.data_uri

    @property
    def storage_options(self) -> dict[str, str]:
        return dict(self._state.conn.storage_options)

    @property
    def pylance_storage_options(self) -> dict[str, str]:
        """The storage options to hand pylance for this table's data (lancetx's own
        ``lancetx_*`` switches removed): with :attr:`data_uri` and :attr:`version`, what
        a reader elsewhere (a Spark executor) needs to open this version with pylance."""
        return dict(self._state.pylance_storage_options() or {})

    @property
    def exists(self) -> bool:
        """Whether the table has a version (as of opening or the last refresh/commit).
        False only for a Table opened with ``missing_ok=True`` where nothing is yet;
        :meth:`commit_fragments` creates it."""
        return self._pinned is not None or self._state.parent is not None

    @property
    def read_only(self) -> bool:
        """True for a :meth:`checkout` view."""
        return self._pinned is not None

    @property
    def version(self) -> int:
        """The version this Table reads: pinned by checkout, else the newest it knows."""
        if self._pinned is not None:
            return self._pinned
        return self._state.require_parent().version

    @property
    def latest_version(self) -> int:
        """The table's latest version, resolved now (one request to the version store)."""
        latest = self._state.refresh()
        if latest is None:
            raise DatasetNotFoundError(self.uri)
        return latest.version

    def refresh(self) -> Table:
        """Move this Table to the latest version (reads then see others' commits)."""
        self._state.refresh()
        return self

    def __repr__(self) -> str:
        pinned = ", read-only" if self._pinned is not None else ""
        known = self._state.parent.version if self._state.parent else None
        return f"Table({self.uri!r}, version={self._pinned or known}{pinned})"

    # ------------------------------------------------------------------- reads

    @property
    def dataset(self) -> LanceDataset:
        """pylance's dataset at :attr:`version`, for reading. Do not write through it:
        pylance would commit behind lancetx's back (use this Table's verbs)."""
        version = self.version
        with self._reading(version):
            return self._state.dataset(version)

    @contextmanager
    def _reading(self, version: int, *, scanner: bool = False) -> Iterator[None]:
        """Raise VersionNotFoundError (naming ``version`` and what to do) for a read
        that failed because a cleanup removed the version meanwhile, not pylance's
        "not found" of one of its files. A ``scanner``'s read: the advice is to make
        a new one (it reads the version it was made at, refreshed Table or not)."""
        try:
            yield
        except Exception as exc:
            if self._pinned is not None:
                advice = "check out a version that is still there"
                advice += " and make a scanner of it" if scanner else ""
            elif scanner:
                advice = (
                    "refresh() the Table (or open it again) and make a new scanner to "
                    "read the latest version (a scanner reads the version it was made at)"
                )
            else:
                advice = "refresh() the Table (or open it again) to read the latest version"
            failure = self._state.read_failure(version, exc, advice=advice)
            if failure is exc:
                raise
            raise failure from exc

    @property
    def schema(self) -> pa.Schema:
        """The Arrow schema at :attr:`version` (from the manifest; no pylance call)."""
        return self._state.schema_of(self._state.parent_at(self.version))

    def to_table(self, **kwargs: Any) -> pa.Table:
        """``LanceDataset.to_table`` at :attr:`version` (columns=, filter=, limit=, …).
        VersionNotFoundError if a cleanup removed the version since this Table loaded it."""
        version = self.version
        with self._reading(version):
            table: pa.Table = self._state.dataset(version).to_table(**kwargs)
        return table

    def scanner(self, **kwargs: Any) -> Scanner:
        """``LanceDataset.scanner`` at :attr:`version` (columns=, filter=, nearest=, …).
        Its reads, batch by batch too, raise VersionNotFoundError if a cleanup removed
        the version since this Table loaded it."""
        from lancetx.scanning import Scanner

        version = self.version
        with self._reading(version):
            scanner = self._state.dataset(version).scanner(**kwargs)
        return Scanner(scanner, lambda: self._reading(version, scanner=True))

    def count_rows(self, filter: str | None = None, **kwargs: Any) -> int:
        """Rows at :attr:`version` (matching ``filter``)."""
        version = self.version
        with self._reading(version):
            return int(self._state.dataset(version).count_rows(filter=filter, **kwargs))

    @property
    def tags(self) -> Tags:
        """The table's tags, stored as Lance stores them (pylance sees them and
        lancetx sees pylance's): ``table.tags.create("v1", 3)``, ``.update``,
        ``.delete``, ``.list()``. A tagged version stays readable by name and
        every cleanup keeps it."""
        from lancetx.tags import Tags

        return Tags(self._state)

    def checkout(self, version: int | str) -> Table:
        """A read-only view of ``version``: a number or a tag's name
        (VersionNotFoundError if it does not exist, TagNotFoundError naming the
        tags there are for an unknown tag)."""
        if isinstance(version, str):
            version = self.tags.resolve(version)
        self._state.parent_at(version)  # fail now, naming the version, if it does not exist
        return Table(self._state, pinned=version)

    def history(self) -> list[VersionInfo]:
        """Every version up to :attr:`version`, oldest first, with operation, commit
        message, properties, committer, rows, fragments and the data bytes it holds,
        added and removed (one GET per version, in parallel; each read once per
        process). Empty for a table that does not exist yet."""
        if not self.exists:
            return []
        return self._state.history(until=self.version)

    def walk_history(self, *, since: int = 0) -> Iterator[VersionInfo]:
        """The versions after ``since`` up to :attr:`version`, *newest first*, read in
        parallel batches as the iteration goes on: stop once you found what you look
        for (a job's newest commit, say) and older versions are never read. Versions a
        cleanup removed are left out; each version is read at most once per process."""
        if not self.exists:
            return iter(())
        return self._state.walk_history(since=since, until=self.version)

    def versions(self) -> list[VersionInfo]:
        """Same as :meth:`history`."""
        return self.history()

    def find_idempotency_key(self, key: str) -> int | None:
        """The version committed with idempotency key ``key``, or None: from its key
        item on an ``s3+ddb://`` table (also when cleanup has removed that version),
        else from the table's history, every version of it."""
        return self._state.find_idempotency_key(key)

    def changes(self, since: int, until: int | None = None) -> list[VersionChange]:
        """What each version ``since+1 .. until`` (default: :attr:`version`) did to the
        rows, oldest first: the fragments it appended (by id, with their rows: read them
        at that version), or that it changed no rows (compaction, an index, config), or
        that it deleted or changed rows (see :mod:`lancetx.changes`). One GET per
        version, in parallel. VersionsRemovedError names versions of the range a
        cleanup removed; VersionNotFoundError a version not committed yet."""
        from lancetx.changes import load_changes

        conn = self._state.conn
        last = self.version if until is None else until
        return load_changes(self.uri, conn.handler, conn.base, since, last)

    def fragment_rows(self) -> list[FragmentRows]:
        """The fragments of :attr:`version`, by id, with their live rows (from the
        manifest: no data is read)."""
        from lancetx.changes import fragment_rows

        manifest = self._state.parent_at(self.version).manifest.manifest
        return [fragment_rows(f) for f in sorted(manifest.fragments, key=lambda f: f.id)]

    @property
    def data_storage_version(self) -> str | None:
        """The Lance data storage version of :attr:`version`'s data files (``"2.0"``,
        ``"2.1"`` …; None if the manifest does not say): new data files must match it."""
        found = self._state.parent_at(self.version).manifest.manifest.data_format.version
        return found or None

    def check_fragment_schema(self, schema: pa.Schema, *, merge_schema: bool = False) -> None:
        """Check, before writing anything, that fragments written as a new dataset of
        ``schema`` (fresh field ids, as :meth:`commit_fragments` takes with
        ``fresh_field_ids=True``) can be appended to :attr:`version`: the columns are
        matched by path and their types must be the table's (new columns need
        ``merge_schema``). Raises SchemaConversionError for a column Lance cannot
        hold and ColumnMismatchError naming the first column that does not fit. Nulls
        in non-nullable columns are checked at the commit (only then are they counted).
        On a table with no version yet every column Lance can hold fits."""
        from lancetx.commit.format.schema import arrow_schema_to_fields
        from lancetx.verbs.field_ids import match_columns

        ours = arrow_schema_to_fields(schema)[0]
        if not self.exists:
            return
        fields = self._state.parent_at(self.version).manifest.manifest.fields
        match_columns(self.uri, ours, list(fields), merge_schema=merge_schema)

    def commit_fragments(
        self,
        fragments: Iterable[Any],
        *,
        schema: pa.Schema | None,
        mode: str = "append",
        commit_message: str | None = None,
        properties: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        expected_version: int | None = None,
        fresh_field_ids: bool = False,
        merge_schema: bool = False,
        null_counts: Mapping[str, int] | None = None,
        idempotency_since: int = 0,
        commit_timeout: float | None = None,
        enable_stable_row_ids: bool | None = None,
    ) -> CommitResult:
        """:func:`lancetx.commit_fragments` on this Table: the same commit, planned
        against the newest version this Table knows and through its connection (a
        caller committing several times, or looking keys and history up around the
        commit, opens the table once). Creates the table if it has no version yet
        (``lancetx.open(uri, missing_ok=True)``). Returns the CommitResult."""
        if self._pinned is not None:
            raise _read_only(self.uri, self._pinned)
        from lancetx.committing import run_verb
        from lancetx.verbs.writing import fragments_verb

        verb = fragments_verb(
            self.uri,
            fragments,
            schema=schema,
            mode=mode,
            commit_message=commit_message,
            properties=properties,
            idempotency_key=idempotency_key,
            expected_version=expected_version,
            fresh_field_ids=fresh_field_ids,
            merge_schema=merge_schema,
            null_counts=null_counts,
            idempotency_since=idempotency_since,
            commit_timeout=commit_timeout,
            enable_stable_row_ids=enable_stable_row_ids,
        )
        result = run_verb(self._state, *verb)
        self.last_commit = result
        return result

    def _run(self, plan: Plan, args: CommitArgs, flags: VerbFlags | None = None) -> int:
        return self._run_result(plan, args, flags).version

    def _run_result(
        self, plan: Plan, args: CommitArgs, flags: VerbFlags | None = None
    ) -> CommitResult:
        if self._pinned is not None:
            raise _read_only(self.uri, self._pinned)
        from lancetx.committing import run_verb

        result = run_verb(self._state, plan, args, flags or _flags())
        self.last_commit = result
        return result

    def writer(
        self,
        *,
        commit_message: str | None = None,
        properties: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        expected_version: int | None = None,
        **write_params: Any,
    ) -> TableWriter:
        """A streaming writer: ``with table.writer() as w: w.write(batch); w.commit()``."""
        if self._pinned is not None:
            raise _read_only(self.uri, self._pinned)
        from lancetx.writer import TableWriter

        return TableWriter(
            self,
            _args(commit_message, properties, idempotency_key, expected_version),
            write_params,
        )


@checked_methods
class MergeInsertBuilder(Generic[R]):
    """pylance's merge_insert builder, committed by lancetx (see :meth:`Table.merge_insert`)."""

    def __init__(self, table: TableVerbs[R], on: list[str]) -> None:
        from lancetx.verbs.merging import MergeSpec

        self._table = table
        self._spec = MergeSpec(on=on)

    def when_matched_update_all(self, condition: str | None = None) -> MergeInsertBuilder[R]:
        """Matched rows take the source's values (upsert), optionally only where
        ``condition`` (``source.``/``target.`` prefixed SQL) holds."""
        self._spec.matched_update = True
        self._spec.matched_condition = condition
        return self

    def when_not_matched_insert_all(self) -> MergeInsertBuilder[R]:
        """Source rows without a match are inserted (insert-if-not-exists)."""
        self._spec.not_matched_insert = True
        return self

    def when_not_matched_by_source_delete(self, expr: str | None = None) -> MergeInsertBuilder[R]:
        """Target rows without a match in the source are deleted (optionally only where ``expr``)."""
        self._spec.not_matched_by_source_delete = True
        self._spec.not_matched_by_source_condition = expr
        return self

    def conflict_on_inserted_keys(self) -> MergeInsertBuilder[R]:
        """Keep the ``on`` key unique under concurrency, as for a primary key.

        The commit records the keys this merge may insert (Lance's inserted-keys
        filter), so a concurrent merge that recorded one of them — or a concurrent
        append, or an update that recorded no keys — makes this commit a retryable
        conflict: it plans again on the new version, where the key now exists, and
        updates that row instead of inserting a second one. On the table's
        unenforced primary key (Arrow field metadata
        ``lance-schema:unenforced-primary-key: true``) this is always on, as in
        pylance. Rows with a null in the key are inserted by every merge and are
        not part of the unique set. The check is between merges that record their
        keys: an append or a merge without it, committed after this one, is not
        checked against it.
        """
        self._spec.conflict_on_inserted_keys = True
        return self

    def plan(self, data: Any, schema: pa.Schema | None = None) -> Plan:
        from lancetx.verbs.merging import materialize, plan_merge_insert

        return plan_merge_insert(self._spec, materialize(self._table.uri, data, schema))

    def execute(
        self,
        data: Any,
        *,
        schema: pa.Schema | None = None,
        commit_message: str | None = None,
        properties: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        expected_version: int | None = None,
    ) -> R:
        """Run the merge against ``data`` and commit it; returns the committed version."""
        return self._table._run(
            self.plan(data, schema),
            _args(commit_message, properties, idempotency_key, expected_version),
            _flags(replannable=True),
        )


# ---------------------------------------------------------------------- front door


def _read_only(uri: str, version: int) -> Exception:
    """The error a write through a read-only view raises (the front door's errors are
    imported when one is raised: opening a table loads none of the tree)."""
    from lancetx.errors import ReadOnlyTableError

    return ReadOnlyTableError(uri, version)


@checked
def open(
    uri: str,
    storage_options: Mapping[str, str] | None = None,
    *,
    version: int | str | None = None,
    missing_ok: bool = False,
) -> Table:
    """Open the table at ``uri`` (``s3+ddb://bucket/path?ddbTableName=T``, ``s3://…``,
    or a local path). Raises DatasetNotFoundError if it has no version, unless
    ``missing_ok``: then the Table of a table that does not exist yet
    (:attr:`Table.exists` False, :attr:`Table.data_uri` known) is returned, which
    :meth:`Table.commit_fragments` creates. With ``version`` (a number or a tag's
    name) returns a read-only view of that version: also while the latest version
    cannot be read (wedged, its manifest missing or corrupt), which is then logged
    once as a warning naming it and the ``lancetx-sync repair`` command."""
    state = TableState.connect(uri, storage_options)
    if version is not None:
        if not state.refresh_to_read_older():
            raise DatasetNotFoundError(uri)
        return Table(state).checkout(version)
    if state.refresh() is None and not missing_ok:
        raise DatasetNotFoundError(uri)
    return Table(state)


connect = open


@checked
def history(uri: str, storage_options: Mapping[str, str] | None = None) -> list[VersionInfo]:
    """Every version of the table at ``uri``, oldest first, as :meth:`Table.history`
    reports them; ``[]`` where nothing was ever committed. While the latest version
    cannot be read (wedged, its manifest missing or corrupt), the versions before it,
    the broken one logged once as a warning naming it and the ``lancetx-sync repair``
    command (as :func:`open` with ``version=`` does)."""
    state = TableState.connect(uri, storage_options)
    found: list[VersionInfo] = []
    read_until: int | None = None
    for _ in range(LATEST_READ_ATTEMPTS):
        if not state.refresh_to_read_older():
            return []
        if state.broken_head is not None:
            until = state.broken_head - 1
        else:
            until = state.require_parent().version
        if until == read_until:
            break  # no newer version: what was read stands
        found, read_until = state.history(until=until), until
        if found and found[-1].version == until:
            break
        # The latest was removed while its history was read (a commit landed and a
        # cleanup with no age floor ran): the newer latest's history is read instead
        # (versions already read are not read again).
    return found


@checked
def write_table(
    uri: str,
    data: Any,
    *,
    mode: str = "create",
    storage_options: Mapping[str, str] | None = None,
    schema: pa.Schema | None = None,
    commit_message: str | None = None,
    properties: Mapping[str, str] | None = None,
    idempotency_key: str | None = None,
    expected_version: int | None = None,
    **write_params: Any,
) -> Table:
    """Write ``data`` as a new table (``mode="create"``), or append to / overwrite the
    table at ``uri`` (creating it if absent). Returns the Table at the committed version.

    ``write_params`` go to ``lance.fragment.write_fragments`` (max_rows_per_file, …),
    except ``enable_stable_row_ids=True``, which creates the table with stable row ids
    as Lance does (row-id sequences per fragment, kept by every later verb; pylance's
    ``_rowid`` reads them). It is chosen when a table is created: given for an
    existing table, it must match what the table has (InvalidWriteParamError)."""
    if mode not in ("create", "append", "overwrite"):
        raise ValueError(f'mode must be "create", "append" or "overwrite", not {mode!r}')
    state = TableState.connect(uri, storage_options)
    latest = state.refresh()
    if mode == "create" and latest is not None:
        from lancetx.errors import TableExistsError

        raise TableExistsError(uri, latest.version)
    from lancetx.committing import VerbFlags, run_verb
    from lancetx.verbs.writing import WritePlan

    plan = WritePlan(data, overwrite=mode == "overwrite", schema=schema, params=write_params)
    # Stable row ids are chosen by the commit that creates the table.
    args = dataclasses.replace(
        _args(commit_message, properties, idempotency_key, expected_version),
        stable_row_ids=bool(plan.stable_row_ids),
    )
    result = run_verb(
        state,
        plan,
        args,
        VerbFlags(
            replannable=mode == "overwrite",
            reusable=True,
            needs_table=False,
            on_exists="fail" if mode == "create" else "append",
        ),
    )
    table = Table(state)
    table.last_commit = result
    return table


@checked
def clone(
    source: str,
    target: str,
    *,
    version: int | str | None = None,
    storage_options: Mapping[str, str] | None = None,
    target_storage_options: Mapping[str, str] | None = None,
    commit_message: str | None = None,
    properties: Mapping[str, str] | None = None,
) -> Table:
    """Shallow-clone ``version`` of the table at ``source`` (a number, a tag's name, or
    None for the latest) into a new table at ``target``: Lance's Clone operation. The
    clone's first version (version 1) has the source version's schema, rows, indices,
    config and metadata, and reads the source's files where they are (the source is
    registered as one of its base paths); nothing is copied. Writes to the clone go
    to the clone's folder and never touch the source. pylance and LanceDB read it.

    The source does not know about its clones: a cleanup of the source may remove
    files a clone still reads, once no version the source keeps references them. Tag
    the cloned version on the source (``table.tags.create("clone-base", version)``)
    for as long as a clone lives; every cleanup keeps a tagged version's files.

    ``target_storage_options`` default to ``storage_options`` (the clone reads the
    source's files with its own options, as pylance does). Raises TableExistsError if
    a table exists at ``target`` (also when another writer creates it meanwhile),
    VersionNotFoundError / TagNotFoundError for an unknown ``version``,
    InvalidUriError for a target inside the source's folder (or the reverse)."""
    from lancetx.committing import run_verb

    state, plan = prepare_clone(source, target, version, storage_options, target_storage_options)
    result = run_verb(state, plan, _args(commit_message, properties, None, None), clone_flags())
    table = Table(state)
    table.last_commit = result
    return table


def clone_flags() -> VerbFlags:
    """A clone creates its table (TableExistsError when it exists or appears meanwhile)
    and writes no data file."""
    from lancetx.committing import VerbFlags

    return VerbFlags(reusable=True, needs_table=False, on_exists="fail", owns_data=False)


def prepare_clone(
    source: str,
    target: str,
    version: int | str | None,
    storage_options: Mapping[str, str] | None,
    target_storage_options: Mapping[str, str] | None,
) -> tuple[TableState, ClonePlan]:
    """The target's state and the plan of :func:`clone` (sync and async alike): the
    source version is resolved and read now (blocking)."""
    from lancetx.verbs.cloning import ClonePlan, check_apart, source_path

    src = open(source, storage_options, version=version)
    cloned = src._state.parent_at(src.version)
    ref_path = source_path(src._state)
    options = storage_options if target_storage_options is None else target_storage_options
    state = TableState.connect(target, options)
    check_apart(src._state, ref_path, state)
    return state, ClonePlan(source, ref_path, cloned)


@checked
def commit_fragments(
    uri: str,
    fragments: Iterable[Any],
    *,
    schema: pa.Schema | None,
    mode: str = "append",
    storage_options: Mapping[str, str] | None = None,
    commit_message: str | None = None,
    properties: Mapping[str, str] | None = None,
    idempotency_key: str | None = None,
    expected_version: int | None = None,
    fresh_field_ids: bool = False,
    merge_schema: bool = False,
    null_counts: Mapping[str, int] | None = None,
    idempotency_since: int = 0,
    commit_timeout: float | None = None,
    enable_stable_row_ids: bool | None = None,
) -> CommitResult:
    """Commit fragments written elsewhere (pylance ``FragmentMetadata``, their JSON, or
    ``DataFragment`` messages) as ONE Append or Overwrite. A table with no version is
    created; a creator that loses the race to another one appends instead. Every data
    file must already be in the table's ``data/`` directory, or under a base path the
    table registers (``write_fragments(..., target_bases=[...])``); else
    ForeignFragmentError.

    Fragments written as a new dataset of ``schema`` (``write_fragments(uri,
    mode="overwrite")``, as writers that cannot open the table do) need
    ``fresh_field_ids=True``: an append then maps their field ids onto the table's by
    column path (any column order), refuses a column whose type differs
    (ColumnMismatchError naming it) and, given ``null_counts`` (nulls written per
    top-level column), nulls in a non-nullable column. ``merge_schema=True`` adds
    the columns the table lacks, nullable, in the same commit (a Merge).

    With ``idempotency_key`` an earlier commit carrying the key is returned
    (``deduplicated``) instead of committing again; ``idempotency_since`` skips the
    versions known not to hold it. ``commit_timeout`` bounds how long lost races are
    retried (default 300 s); an unknown outcome is raised (CommitStateUnknownError):
    call again with the same key to settle it. ``enable_stable_row_ids=True`` creates
    the table with stable row ids, as :func:`write_table` does (given for an existing
    table, it must match what the table has)."""
    from lancetx.committing import run_verb
    from lancetx.verbs.writing import fragments_verb

    verb = fragments_verb(
        uri,
        fragments,
        schema=schema,
        mode=mode,
        commit_message=commit_message,
        properties=properties,
        idempotency_key=idempotency_key,
        expected_version=expected_version,
        fresh_field_ids=fresh_field_ids,
        merge_schema=merge_schema,
        null_counts=null_counts,
        idempotency_since=idempotency_since,
        commit_timeout=commit_timeout,
        enable_stable_row_ids=enable_stable_row_ids,
    )
    return run_verb(TableState.connect(uri, storage_options), *verb)


__all__ = [
    "MergeInsertBuilder",
    "Table",
    "clone",
    "commit_fragments",
    "connect",
    "open",
    "write_table",
]
