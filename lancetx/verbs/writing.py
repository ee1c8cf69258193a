"""Append and overwrite: pylance writes fragments under the table's ``data/``; we commit.

A write plan consumes the user's data once. If the commit meets a retryable conflict
(Overwrite racing Overwrite), the same fragments are committed again on the new
version — data files do not depend on the version they were planned against.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from lancetx.commit.engine.operations import Append, Merge, Overwrite, Transaction
from lancetx.commit.errors import BasePathError, LancetxError, ObjectNotFoundError
from lancetx.commit.format.bases import data_file_key, key_in, parse_base
from lancetx.commit.format.manifest import FLAG_STABLE_ROW_IDS
from lancetx.commit.format.naming import DATA_DIR, join, unsafe_relative_path
from lancetx.commit.format.schema import arrow_schema_to_fields
from lancetx.commit.storage.objectstore import ObjectStore
from lancetx.commit.storage.stores import open_object_store
from lancetx.committing import CommitArgs, PlanContext, VerbFlags, discard
from lancetx.convert import to_fragment
from lancetx.data import StreamGuard, check_append_schema, to_reader, write_interruptibly
from lancetx.errors import (
    ForeignFragmentError,
    InvalidWriteParamError,
    SchemaMismatchError,
    UnsupportedInputError,
)
from lancetx.protos import table_pb2
from lancetx.verbs.field_ids import field_id_map, match_columns, merged_fields, remap_fragments

#: Parallel HEAD requests when checking fragments written elsewhere.
CHECK_PARALLELISM = 16


#: Parameters of ``write_fragments`` that lancetx sets itself, with what to use instead.
_OWN_WRITE_PARAMS = {
    "mode": "the verb decides it (append, overwrite, write_table(mode=...))",
    "storage_options": "they are the table's: lancetx.open(uri, storage_options=...)",
    "return_transaction": "lancetx commits what pylance writes",
    "data": "it is the verb's first argument",
    "dataset_uri": "it is the table's",
}
#: Sizes pylance needs positive (0 makes its writer panic, a negative one overflow).
_POSITIVE_WRITE_PARAMS = ("max_rows_per_file", "max_rows_per_group", "max_bytes_per_file")
#: The write parameter choosing stable row ids: a setting of the commit that creates a
#: table (pylance's data files do not depend on it), never handed to ``write_fragments``.
STABLE_ROW_IDS_PARAM = "enable_stable_row_ids"


def check_write_params(params: Mapping[str, Any]) -> None:
    """Raise InvalidWriteParamError, before anything is written, for a parameter that
    pylance's ``write_fragments`` does not take, that lancetx sets itself, or a size
    that is not a positive integer."""
    import difflib
    import inspect

    from lance.fragment import write_fragments

    known = set(inspect.signature(write_fragments).parameters) - set(_OWN_WRITE_PARAMS)
    for name, value in params.items():
        if name in _OWN_WRITE_PARAMS:
            raise InvalidWriteParamError(
                name, f"not a write parameter here: {_OWN_WRITE_PARAMS[name]}"
            )
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise InvalidWriteParamError(
                name,
                f"lance.fragment.write_fragments takes no such parameter; {hint}"
                f"it takes: {', '.join(sorted(known))}",
            )
        if (
            name in _POSITIVE_WRITE_PARAMS
            and value is not None
            and (isinstance(value, bool) or not isinstance(value, int) or value <= 0)
        ):
            raise InvalidWriteParamError(name, f"must be a positive integer, got {value!r}")
        if name == STABLE_ROW_IDS_PARAM and not isinstance(value, bool):
            raise InvalidWriteParamError(name, f"must be True or False, got {value!r}")


def take_stable_row_ids(params: dict[str, Any]) -> bool | None:
    """Remove ``enable_stable_row_ids`` from ``params`` (checked by
    :func:`check_write_params`); None when it was not given."""
    value = params.pop(STABLE_ROW_IDS_PARAM, None)
    return bool(value) if value is not None else None


def check_stable_row_ids(uri: str, requested: bool | None, manifest: table_pb2.Manifest) -> None:
    """Refuse ``enable_stable_row_ids`` that differs from what the table has: Lance
    fixes it when a table is created, and no later write changes it (pylance ignores
    the parameter then; lancetx says so rather than write something else than asked)."""
    if requested is None:
        return
    has = bool(manifest.reader_feature_flags & FLAG_STABLE_ROW_IDS)
    if has == requested:
        return
    if requested:
        problem = (
            f"the table {uri} (version {manifest.version}) was created without stable row "
            "ids, and they cannot be turned on later (Lance refuses it too): write a new "
            "table with write_table(..., enable_stable_row_ids=True) and copy the rows over"
        )
    else:
        problem = (
            f"the table {uri} (version {manifest.version}) has stable row ids, and they "
            "cannot be turned off; leave the parameter out to write to it"
        )
    raise InvalidWriteParamError(STABLE_ROW_IDS_PARAM, problem)


def _write_fragments(
    ctx: PlanContext,
    reader: pa.RecordBatchReader,
    guard: StreamGuard,
    *,
    append: bool,
    params: Mapping[str, Any],
) -> tuple[table_pb2.DataFragment, ...]:
    from lance.fragment import write_fragments

    target: Any = ctx.dataset_to_write if append else ctx.state.conn.data_uri

    def write() -> list[Any]:
        written: list[Any] = write_fragments(
            reader,
            target,
            mode="append" if append else "overwrite",
            storage_options=ctx.state.pylance_storage_options(),
            **params,
        )
        return written

    try:
        written = write_interruptibly(write, guard)
    except (ValueError, TypeError) as exc:
        guard.raise_if_failed()  # the user's iterator failed first: that is the cause
        if append:
            raise SchemaMismatchError(ctx.uri, f"pylance refused the data ({exc})") from exc
        raise
    except OSError:
        guard.raise_if_failed()
        raise
    fragments = tuple(to_fragment(ctx.uri, f) for f in written)
    if guard.error is not None:
        # The stream ended early because the user's iterator raised: pylance finished
        # the files it had started, so we know every one of them — remove them all.
        discard(ctx.store, fragment_files(ctx.state.conn.base, fragments))
        guard.raise_if_failed()
    return fragments


def fragment_files(base: str, fragments: Sequence[table_pb2.DataFragment]) -> list[str]:
    return [join(base, DATA_DIR, f.path) for frag in fragments for f in frag.files]


class WritePlan:
    """Append or overwrite ``data``; the data is written on the first call only."""

    def __init__(
        self, data: Any, *, overwrite: bool, schema: pa.Schema | None, params: Mapping[str, Any]
    ) -> None:
        check_write_params(params)
        self.data = data
        self.overwrite = overwrite
        self.schema = schema
        self.params = dict(params)
        #: ``enable_stable_row_ids`` as given (None: not given): a new table gets them
        #: through the commit (:attr:`CommitArgs.stable_row_ids`), an existing one
        #: must already be what is asked for.
        self.stable_row_ids = take_stable_row_ids(self.params)
        self.fragments: tuple[table_pb2.DataFragment, ...] | None = None
        self.arrow_schema: pa.Schema | None = None

    def __call__(self, ctx: PlanContext) -> Transaction:
        if ctx.parent is not None:
            check_stable_row_ids(ctx.uri, self.stable_row_ids, ctx.manifest)
        if self.fragments is None:
            _check_creates(ctx, initial_bases(self.params.get("initial_bases")))
            reader, guard = to_reader(ctx.uri, self.data, self.schema)
            append = not self.overwrite and ctx.parent is not None
            if append:
                check_append_schema(ctx.uri, reader.schema, ctx.schema)
            self.arrow_schema = reader.schema
            self.fragments = _write_fragments(ctx, reader, guard, append=append, params=self.params)
        assert self.arrow_schema is not None
        if not self.overwrite and ctx.parent is not None:
            # Also when the table appeared while we wrote (a lost creation race).
            check_append_schema(ctx.uri, self.arrow_schema, ctx.schema)
            return Transaction(
                read_version=ctx.read_version, operation=Append(fragments=self.fragments)
            )
        bases = initial_bases(self.params.get("initial_bases"))
        _check_creates(ctx, bases)
        return overwrite_transaction(
            ctx.read_version, self.fragments, self.arrow_schema, initial_bases=bases
        )


def _check_creates(ctx: PlanContext, bases: Sequence[table_pb2.BasePath]) -> None:
    """``initial_bases`` register base paths only when the write creates the table
    (Lance's rule): refused, before anything is written, on a table that exists."""
    if bases and ctx.parent is not None:
        raise InvalidWriteParamError(
            "initial_bases",
            f"registers base paths only when the write creates the table; {ctx.uri} "
            f"exists (version {ctx.parent.version}): register them with "
            "Table.commit(UpdateBases(new_bases=...))",
        )


def overwrite_transaction(
    read_version: int,
    fragments: Sequence[table_pb2.DataFragment],
    schema: pa.Schema,
    *,
    initial_bases: Sequence[table_pb2.BasePath] = (),
) -> Transaction:
    fields, metadata = arrow_schema_to_fields(schema)
    return Transaction(
        read_version=read_version,
        operation=Overwrite(
            fragments=tuple(fragments),
            schema=tuple(fields),
            schema_metadata=metadata,
            initial_bases=tuple(initial_bases),
        ),
    )


def initial_bases(given: Any) -> tuple[table_pb2.BasePath, ...]:
    """pylance's ``initial_bases`` (``lance.DatasetBasePath``) as the Overwrite registers
    them, with the ids pylance gave the files it wrote under them: an id of 0 takes the
    next one from 1, in order (Lance's rule when a write creates a table)."""
    out: list[table_pb2.BasePath] = []
    next_id = 1
    for base in given or ():
        entry = table_pb2.BasePath(
            id=int(base.id), path=str(base.path), is_dataset_root=bool(base.is_dataset_root)
        )
        if base.name is not None:
            entry.name = str(base.name)
        if entry.id == 0:
            entry.id = next_id
            next_id += 1
        out.append(entry)
    return tuple(out)


class FragmentsPlan:
    """Commit fragments written elsewhere (Spark executors, ``write_fragments``) as one
    Append — or Overwrite when the table is new or ``overwrite`` is set.

    With ``fresh_field_ids`` the data files were written as a new dataset of
    ``schema`` (fields numbered from 0): an append maps their ids onto the table's by
    column path (:mod:`lancetx.verbs.field_ids`), checking types and, with
    ``null_counts``, that no null lands in a non-nullable column; ``merge_schema``
    adds the columns the table lacks (nullable) in the same commit, as a Merge.
    """

    def __init__(
        self,
        uri: str,
        fragments: Sequence[object],
        schema: pa.Schema | None,
        *,
        overwrite: bool,
        fresh_field_ids: bool = False,
        merge_schema: bool = False,
        null_counts: Mapping[str, int] | None = None,
        stable_row_ids: bool | None = None,
    ) -> None:
        if schema is not None and not isinstance(schema, pa.Schema):
            raise UnsupportedInputError(uri, schema, "schema= must be a pyarrow.Schema")
        if (fresh_field_ids or merge_schema) and schema is None:
            raise SchemaMismatchError(
                uri, "fresh_field_ids / merge_schema need schema= (the files' Arrow schema)"
            )
        if merge_schema and not fresh_field_ids:
            raise SchemaMismatchError(
                uri, "merge_schema needs fresh_field_ids=True (files written as a new dataset)"
            )
        self.fragments = tuple(to_fragment(uri, f) for f in fragments)
        self.schema = schema
        self.overwrite = overwrite
        self.fresh_field_ids = fresh_field_ids
        self.merge_schema = merge_schema
        self.null_counts = dict(null_counts or {})
        self.stable_row_ids = stable_row_ids
        self.checked = False

    def __call__(self, ctx: PlanContext) -> Transaction:
        if ctx.parent is not None:
            check_stable_row_ids(ctx.uri, self.stable_row_ids, ctx.manifest)
        if not self.checked:
            check_in_data_dir(ctx, self.fragments)
            self.checked = True
        if ctx.parent is not None and not self.overwrite:
            if self.fresh_field_ids:
                return self._append_fresh(ctx)
            if self.schema is not None:
                check_append_schema(ctx.uri, self.schema, ctx.schema)
            fragments = tuple(_unassigned(f) for f in self.fragments)
            return Transaction(read_version=ctx.read_version, operation=Append(fragments=fragments))
        if self.schema is None:
            raise SchemaMismatchError(
                ctx.uri,
                "creating or overwriting a table from fragments needs schema= (their Arrow schema)",
            )
        return overwrite_transaction(
            ctx.read_version, tuple(_unassigned(f) for f in self.fragments), self.schema
        )

    def _append_fresh(self, ctx: PlanContext) -> Transaction:
        assert self.schema is not None
        ours = arrow_schema_to_fields(self.schema)[0]
        manifest = ctx.manifest
        table = list(manifest.fields)
        new = match_columns(
            ctx.uri, ours, table, merge_schema=self.merge_schema, null_counts=self.null_counts
        )
        if not new:
            fragments = remap_fragments(self.fragments, field_id_map(ours, table), 0)
            return Transaction(read_version=ctx.read_version, operation=Append(fragments=fragments))
        # A Merge lists every fragment, so ours get explicit ids after the table's.
        in_files = max(
            (i for f in manifest.fragments for d in f.files for i in d.fields), default=-1
        )
        target = merged_fields(ours, table, new, in_files)
        high = manifest.max_fragment_id if manifest.HasField("max_fragment_id") else -1
        high = max([high, *(f.id for f in manifest.fragments)])
        added = remap_fragments(self.fragments, field_id_map(ours, target), high + 1)
        return Transaction(
            read_version=ctx.read_version,
            operation=Merge(
                fragments=(*manifest.fragments, *added),
                schema=tuple(target),
                schema_metadata=dict(manifest.schema_metadata),
            ),
        )


def fragments_verb(
    uri: str,
    fragments: Iterable[object],
    *,
    schema: pa.Schema | None,
    mode: str,
    commit_message: str | None,
    properties: Mapping[str, str] | None,
    idempotency_key: str | None,
    expected_version: int | None,
    fresh_field_ids: bool,
    merge_schema: bool,
    null_counts: Mapping[str, int] | None,
    idempotency_since: int,
    commit_timeout: float | None,
    enable_stable_row_ids: bool | None = None,
) -> tuple[FragmentsPlan, CommitArgs, VerbFlags]:
    """The plan, arguments and flags of ``commit_fragments`` (sync and async alike)."""
    from lancetx.commit.engine.retry import RetryPolicy

    if mode not in ("append", "overwrite"):
        raise ValueError(f'mode must be "append" or "overwrite", not {mode!r}')
    if enable_stable_row_ids is not None:
        check_write_params({STABLE_ROW_IDS_PARAM: enable_stable_row_ids})
    plan = FragmentsPlan(
        uri,
        list(fragments),
        schema,
        overwrite=mode == "overwrite",
        fresh_field_ids=fresh_field_ids,
        merge_schema=merge_schema,
        null_counts=null_counts,
        stable_row_ids=enable_stable_row_ids,
    )
    args = CommitArgs(
        commit_message,
        properties,
        idempotency_key,
        expected_version,
        idempotency_since=idempotency_since,
        retry=RetryPolicy(max_elapsed=commit_timeout) if commit_timeout is not None else None,
        stable_row_ids=bool(enable_stable_row_ids),
    )
    flags = VerbFlags(
        # A Merge lists every fragment: a concurrent append forces a new plan.
        replannable=mode == "overwrite" or merge_schema,
        reusable=True,
        needs_table=False,
        owns_data=False,
    )
    return plan, args, flags


def _unassigned(fragment: table_pb2.DataFragment) -> table_pb2.DataFragment:
    # Ids are assigned at commit (0 = unassigned), whatever the writer put there.
    out = table_pb2.DataFragment()
    out.CopyFrom(fragment)
    out.id = 0
    return out


def check_in_data_dir(ctx: PlanContext, fragments: Sequence[table_pb2.DataFragment]) -> None:
    """Refuse fragments whose files are not objects in this table's ``data/`` directory,
    or (a file with a ``base_id``) under a base path the table registers: there, a
    dataset root's ``data/`` or the folder itself (as Lance reads them). Every file
    must exist. A base inside the table's own folder must keep its files in ``data/``."""
    base = ctx.state.conn.base
    data_dir = ctx.store.uri(join(base, DATA_DIR)) + "/"
    registered = {b.id: b for b in ctx.manifest.base_paths} if ctx.parent is not None else {}
    bad: list[str] = []
    reasons: dict[str, str] = {}
    keys: list[tuple[str, ObjectStore, str]] = []
    for frag in fragments:
        for f in frag.files:
            path = f.path
            if f.HasField("base_id"):
                found = _under_base(ctx, registered, f.base_id, path)
                if isinstance(found, str):
                    bad.append(path)
                    reasons[path] = found
                else:
                    keys.append((path, *found))
                continue
            normal = posixpath.normpath(path) if path else ""
            if not path or "://" in path or path.startswith("/") or normal.startswith(".."):
                bad.append(path or "<empty path>")
            else:
                keys.append((path, ctx.store, join(base, DATA_DIR, normal)))
    if not bad and keys:
        absent = _absent(keys)
        for path, store, key in absent:
            reasons[path] = f"no object {store.uri(key)}"
        bad = [path for path, _, _ in absent]
    if bad:
        raise ForeignFragmentError(
            ctx.uri, data_dir, bad, registered_bases(registered.values()), reasons
        )


_File = tuple[str, ObjectStore, str]


def _absent(files: Sequence[_File]) -> list[_File]:
    """The data files (path, store, key) that are not objects, in order.

    Listed, not asked one by one: the files of one directory are found with as many
    ListObjectsV2 requests as their keys need pages (one for a table of up to 1,000
    data files, however many fragments are committed: a HEAD per file made a commit
    of N fragments cost N requests). Only a file the listing lacks is asked for with
    a HEAD, so a listing that lags a write can never refuse a file that exists. A
    store whose listing is not lexical and complete (local disk, a legacy store that
    may list stale) and a listing refused (no ``s3:ListBucket`` under a registered
    base path) are asked one file at a time, as before.
    """
    groups: dict[tuple[int, str], list[_File]] = {}
    for item in files:
        directory = item[2].rsplit("/", 1)[0] + "/" if "/" in item[2] else ""
        groups.setdefault((id(item[1]), directory), []).append(item)
    unlisted: list[_File] = []
    for (_, directory), items in groups.items():
        store = items[0][1]
        listable = store.capabilities.lexically_ordered_list and store.capabilities.consistent_list
        try:
            listed = _listed(store, directory, [key for _, _, key in items]) if listable else set()
        except LancetxError:
            listed = set()  # not listable here: ask for each file
        unlisted += [item for item in items if item[2] not in listed]
    if not unlisted:
        return []

    def missing(item: _File) -> bool:
        try:
            item[1].head(item[2])
        except ObjectNotFoundError:
            return True
        return False

    with ThreadPoolExecutor(max_workers=min(CHECK_PARALLELISM, len(unlisted))) as pool:
        gone = list(pool.map(missing, unlisted))
    absent = {id(item) for item, lost in zip(unlisted, gone, strict=True) if lost}
    return [item for item in files if id(item) in absent]


def _listed(store: ObjectStore, directory: str, keys: Sequence[str]) -> set[str]:
    """Which of ``keys`` (all in ``directory``) the store lists: page by page from just
    before the smallest key not yet settled, so keys far apart in a large directory
    cost a request each at most, never a walk through everything between them."""
    wanted = sorted(set(keys))
    found: set[str] = set()
    i = 0
    while i < len(wanted):
        # Any key sorts after its own prefix: the listing starts at wanted[i] itself.
        page, more = store.list_page(directory, start_after=wanted[i][:-1])
        listed = {meta.key for meta in page}
        last = page[-1].key if page else None
        settled = i
        while settled < len(wanted) and (
            not more or (last is not None and wanted[settled] <= last)
        ):
            if wanted[settled] in listed:
                found.add(wanted[settled])
            settled += 1
        if settled == i:
            break  # an empty page that says more follows: leave the rest to HEADs
        i = settled
    return found


def registered_bases(bases: Iterable[table_pb2.BasePath]) -> list[str]:
    """The base paths a table registers, as an error message lists them."""
    return [
        f"id {b.id}" + (f" ({b.name!r})" if b.HasField("name") else "") + f" {b.path}"
        for b in bases
    ]


def _under_base(
    ctx: PlanContext, registered: Mapping[int, table_pb2.BasePath], base_id: int, path: str
) -> str | tuple[ObjectStore, str]:
    """Where the data file ``path`` of base ``base_id`` is (its store and key), or why
    it cannot be taken."""
    entry = registered.get(base_id)
    if entry is None:
        return f"base path id {base_id} is not registered in this table"
    problem = unsafe_relative_path(path)
    if problem is not None:
        return problem
    try:
        root = parse_base(entry)
    except BasePathError as exc:
        return f"base path id {base_id}: {exc.problem}"
    key = data_file_key(root, path)
    own = key_in(ctx.store, root, key)
    table = ctx.state.conn.base
    if own is not None:
        if (not table or own.startswith(table + "/")) and not own.startswith(
            join(table, DATA_DIR) + "/"
        ):
            return f"under base path id {base_id} it is {own!r}: inside this table, not in data/"
        return ctx.store, own
    if not root.followable:
        return f"base path id {base_id} {root.path!r}: lancetx cannot check objects there"
    other, other_key = open_object_store(root.object_uri(key), ctx.state.conn.storage_options)
    return other, other_key


__all__ = [
    "FragmentsPlan",
    "WritePlan",
    "check_in_data_dir",
    "check_stable_row_ids",
    "fragment_files",
    "fragments_verb",
    "overwrite_transaction",
    "take_stable_row_ids",
]
