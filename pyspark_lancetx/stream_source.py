"""The streaming source: ``spark.readStream.format("lancetx").load(uri)``.

Each micro-batch delivers the rows that new versions appended: the fragments a
version added (by id, :meth:`lancetx.Table.changes`), read with pylance *at that
version*, so compacting, indexing or deleting later never shows a row twice or
hides one. A query started without a starting option first delivers the table as
it is (one batch, or several under a rate limit), then every later version.

**Offsets** are positions in the table's history, plain JSON:
``{"version": v}`` (everything up to version ``v`` delivered),
``{"version": v, "fragment": f}`` (of version ``v``'s new fragments, those with id
up to ``f``: a rate limit split the version), the same with ``"snapshot": true``
(reading the table as it was at ``v``), and the two starting markers
``{"start": "snapshot"}`` / ``{"start": "latest"}``. A batch is planned from its
two offsets alone, so Spark replaying a batch after a crash (its offsets are in
the checkpoint) reads exactly the same rows, whatever was committed since; the
``lancetx`` sink then finds the batch already committed. The snapshot's version
is chosen by the first batch's *end* offset, never by the starting marker, so a
query that dies before its first batch is recorded replays that batch exactly.

**Versions that delete or change rows** (a delete, an update, a merge that
updates or deletes, an overwrite, a restore, new columns) stop the stream with
:class:`~lancetx.errors.StreamChangeCommitError` naming the version, its
operation and the options that skip such versions (``skipChangeCommits``; for a
version that only deleted rows also ``ignoreDeletes``); the rows of the versions
before it are delivered first. Versions that change no row (compaction, an index,
config, a schema change) pass silently. Versions a cleanup removed before the
stream read them fail it with :class:`~lancetx.errors.VersionsRemovedError`.

**Rate limits**: ``maxVersionsPerTrigger`` (versions that append rows) and
``maxRowsPerTrigger`` (whole fragments; a batch holds at least one, so a fragment
larger than the limit is one batch). ``Trigger.AvailableNow`` reads up to the
latest version at its start, in as many batches as the limits make;
``Trigger.Once`` ignores the limits, as Spark asks.

Three processes take part: Spark's long-lived source worker plans (offsets and
partitions: one lancetx Table, a cache of version changes), executor workers
read (pylance only, from what the partition carries).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from lancetx.errors import (
    ManifestFormatError,
    StreamChangeCommitError,
    StreamSchemaChangedError,
    VersionNotFoundError,
    VersionsRemovedError,
    pylance_gist,
    says_not_found,
)
from pyspark_lancetx.errors import SparkOptionError
from pyspark_lancetx.options import LATEST, StreamReadOptions, parse_timestamp
from pyspark_lancetx.schema import conform_read_batch, spark_arrow_schema

if TYPE_CHECKING:
    import pyarrow as pa

    from lancetx import FragmentRows, Table, VersionChange

log = logging.getLogger(__name__)

#: Versions whose changes are loaded at once (one LIST, then their manifests in parallel).
CHANGES_CHUNK = 64
#: The starting markers (see the module docstring).
START_SNAPSHOT = "snapshot"
START_LATEST = "latest"


@dataclass(frozen=True)
class Position:
    """A stream offset (see the module docstring); ``start`` marks a starting offset."""

    version: int = 0
    fragment: int | None = None
    snapshot: bool = False
    start: str | None = None

    def to_offset(self) -> dict[str, Any]:
        """The JSON offset Spark keeps (keys in one order: Spark compares the text)."""
        if self.start is not None:
            return {"start": self.start}
        out: dict[str, Any] = {"version": self.version}
        if self.fragment is not None:
            out["fragment"] = self.fragment
        if self.snapshot:
            out["snapshot"] = True
        return out

    @classmethod
    def of(cls, offset: dict[str, Any]) -> Position:
        """An offset Spark hands back (from this source, possibly from the checkpoint)."""
        if "start" in offset:
            return cls(start=str(offset["start"]))
        fragment = offset.get("fragment")
        return cls(
            version=int(offset["version"]),
            fragment=int(fragment) if fragment is not None else None,
            snapshot=bool(offset.get("snapshot", False)),
        )


#: What one partition reads of one version: ``(version, fragment ids, columns the
#: version lacks)`` (those are filled with nulls: they were added after it).
Piece = tuple[int, tuple[int, ...], tuple[str, ...]]


class LanceTxStreamPartition(InputPartition):  # type: ignore[misc]
    """Fragments of one or more versions, read by one Spark task."""

    def __init__(self, pieces: Sequence[Piece]) -> None:
        super().__init__(tuple(pieces))
        self.pieces = tuple(pieces)


@dataclass(frozen=True)
class StreamPlan:
    """What every process of a streaming read needs (plain data).

    ``schema_version`` is the version whose schema the query took: a column of the
    stream missing at a later version was dropped (the stream fails), at an
    earlier one it was added later (it reads as null)."""

    options: StreamReadOptions
    schema_json: str
    schema_version: int
    data_uri: str
    #: The storage options pylance reads with. Not in the repr: it holds credentials.
    pylance_options: dict[str, str] = field(repr=False)

    @property
    def uri(self) -> str:
        return self.options.uri

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(StructType.fromJson(json.loads(self.schema_json)).names)


@dataclass
class _Limits:
    rows: int | None = None
    versions: int | None = None


class LanceTxStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    """Plans micro-batches over a table's versions and reads their new fragments."""

    def __init__(self, plan: StreamPlan) -> None:
        self.plan = plan
        self._table: Table | None = None
        self._changes: dict[int, VersionChange] = {}
        self._snapshots: dict[int, tuple[tuple[FragmentRows, ...], tuple[str, ...]]] = {}
        self._target: int | None = None
        self._latest: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Pickled for the executors: they only read, from what the partition carries.
        return {"plan": self.plan}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["plan"])  # type: ignore[misc]

    # ------------------------------------------------------------- the table

    def _open(self) -> Table:
        if self._table is None:
            import lancetx

            self._table = lancetx.open(self.plan.uri, self.plan.options.storage_options)
        return self._table

    def _latest_version(self) -> int:
        latest = self._open().latest_version
        self._latest = latest
        return latest if self._target is None else min(latest, self._target)

    def _change(self, version: int, until: int) -> VersionChange:
        found = self._changes.get(version)
        if found is None:
            last = max(version, min(until, version - 1 + CHANGES_CHUNK))
            try:
                loaded = self._open().changes(since=version - 1, until=last)
            except VersionsRemovedError as exc:
                raise self._removed(exc) from None
            self._changes.update((c.version, c) for c in loaded)
            found = self._changes[version]
        return found

    def _removed(self, exc: VersionsRemovedError) -> VersionsRemovedError:
        start = f"startingVersion={exc.oldest}" if exc.oldest is not None else "no starting option"
        return VersionsRemovedError(
            exc.uri,
            exc.versions,
            exc.oldest,
            "This stream had not read them yet, so their rows are lost to it. To go on, start "
            f"a new query (a new checkpointLocation) with {start}, or with no starting option "
            "to read the table as it is now; and keep versions for longer than a stream may "
            "lag behind (lancetx-sync cleanup --older-than)",
        )

    def _snapshot(self, version: int) -> tuple[tuple[FragmentRows, ...], tuple[str, ...]]:
        found = self._snapshots.get(version)
        if found is None:
            try:
                view = self._open().checkout(version)
                found = (tuple(view.fragment_rows()), tuple(view.schema.names))
            except VersionNotFoundError as exc:
                if isinstance(exc, VersionsRemovedError) or exc.version != version:
                    raise
                removed = VersionsRemovedError(self.plan.uri, [version], None)
                raise self._removed(removed) from exc
            self._snapshots[version] = found
        return found

    # ------------------------------------------------------------- offsets

    def initialOffset(self) -> dict[str, Any]:
        options = self.plan.options
        if options.starting_version == LATEST:
            return Position(start=START_LATEST).to_offset()
        if isinstance(options.starting_version, int):
            latest = self._open().latest_version
            if options.starting_version > latest:
                raise SparkOptionError(
                    "startingVersion",
                    str(options.starting_version),
                    f"a version of {self.plan.uri!r}, whose latest version is {latest} "
                    "(or latest, to read only versions committed from now on)",
                )
            return Position(options.starting_version - 1).to_offset()
        if options.starting_timestamp is not None:
            return Position(self._first_version_at(options.starting_timestamp) - 1).to_offset()
        return Position(start=START_SNAPSHOT).to_offset()

    def _first_version_at(self, text: str) -> int:
        """The oldest version committed at or after ``text`` (of those still there)."""
        when = parse_timestamp("startingTimestamp", text)
        table = self._open().refresh()
        first: int | None = None
        newest = None
        for info in table.walk_history():
            newest = newest or info
            if info.timestamp is not None and info.timestamp < when:
                break
            first = info.version
        if first is None:
            latest = (
                f"the latest, version {newest.version}, was committed "
                f"{newest.timestamp.isoformat()}"
                if newest is not None and newest.timestamp is not None
                else "the table has no versions"
            )
            raise SparkOptionError(
                "startingTimestamp",
                text,
                f"a time at or before the latest commit of {self.plan.uri!r} ({latest}); "
                "to read only versions committed from now on, use startingVersion=latest",
            )
        return first

    def getDefaultReadLimit(self) -> ReadLimit:
        options = self.plan.options
        if options.max_rows_per_trigger is not None:
            return ReadMaxRows(options.max_rows_per_trigger)
        if options.max_versions_per_trigger is not None:
            # Spark has no limit on versions; "files" carries it there and back.
            return ReadMaxFiles(options.max_versions_per_trigger)
        return ReadAllAvailable()

    def _limits(self, limit: ReadLimit) -> _Limits:
        if isinstance(limit, ReadAllAvailable):
            return _Limits()  # Trigger.Once: everything, whatever the options say
        options = self.plan.options
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else options.max_rows_per_trigger
        versions = (
            limit.max_files if isinstance(limit, ReadMaxFiles) else options.max_versions_per_trigger
        )
        return _Limits(rows, versions)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._open().latest_version

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return Position(self._latest).to_offset() if self._latest is not None else None

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        position = Position.of(start)
        target = self._latest_version()
        limits = self._limits(limit)
        if position.start == START_LATEST:
            return Position(target).to_offset()
        if position.start == START_SNAPSHOT or position.snapshot:
            return self._admit_snapshot(position, target, limits).to_offset()
        return self._admit_versions(position, target, limits).to_offset()

    def _admit_snapshot(self, position: Position, target: int, limits: _Limits) -> Position:
        """How far into the snapshot a batch goes: it ends at the snapshot's end at the
        latest, so the snapshot's version is always the end offset's."""
        version = target if position.start == START_SNAPSHOT else position.version
        fragments, _ = self._snapshot(version)
        after = position.fragment if position.snapshot else None
        rows = 0
        admitted: int | None = None
        for fragment in fragments:
            if after is not None and fragment.id <= after:
                continue
            if (
                limits.rows is not None
                and admitted is not None
                and rows + fragment.rows > limits.rows
            ):
                return Position(version, fragment=admitted, snapshot=True)
            rows += fragment.rows
            admitted = fragment.id
        return Position(version)

    def _admit_versions(self, position: Position, target: int, limits: _Limits) -> Position:
        """How far after ``position`` a batch goes, within the limits; stops before a
        version the stream cannot pass (raising when that version is the first)."""
        end = position
        rows = versions = 0
        taken = False  # a batch takes at least one fragment, however large
        for version in range(position.version + (position.fragment is None), target + 1):
            change = self._change(version, target)
            blocked = self._blocked(change)
            if blocked is not None:
                if end != position:
                    return end  # deliver the versions before it first
                raise blocked
            after = position.fragment if version == position.version else None
            fresh = [f for f in change.appended if after is None or f.id > after]
            if not fresh or self._skipped(change):
                end = Position(version)
                continue
            if limits.versions is not None and versions >= limits.versions:
                return end
            for fragment in fresh:
                if limits.rows is not None and taken and rows + fragment.rows > limits.rows:
                    return end
                taken = True
                rows += fragment.rows
                end = Position(version, fragment=fragment.id)
            end = Position(version)
            versions += 1
        return end

    def _skipped(self, change: VersionChange) -> bool:
        options = self.plan.options
        return change.changes_rows and (
            options.skip_change_commits or (options.ignore_deletes and change.deletes_only)
        )

    def _blocked(self, change: VersionChange) -> Exception | None:
        """The error that stops the stream at ``change``, if it does."""
        if change.changes_rows and not self._skipped(change):
            return StreamChangeCommitError(
                self.plan.uri,
                change.version,
                change.operation,
                change.detail,
                change.deletes_only,
            )
        if change.version > self.plan.schema_version and not self._skipped(change):
            for column in self.plan.columns:
                if column not in change.columns:
                    return StreamSchemaChangedError(
                        self.plan.uri, change.version, change.operation, column
                    )
        return None

    # ------------------------------------------------------------- partitions

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        first, last = Position.of(start), Position.of(end)
        pieces = list(self._pieces(first, last))
        return self._group(pieces)

    def _pieces(self, first: Position, last: Position) -> Iterator[tuple[Piece, int]]:
        """``(piece, rows)`` from ``first`` (exclusive) to ``last`` (inclusive)."""
        if first.start == START_LATEST:
            return
        columns = self.plan.columns
        if first.start == START_SNAPSHOT or first.snapshot:
            fragments, present = self._snapshot(last.version)
            after = first.fragment if first.snapshot else None
            upto = last.fragment if last.snapshot else None
            missing = tuple(c for c in columns if c not in present)
            for fragment in fragments:
                if (after is None or fragment.id > after) and (upto is None or fragment.id <= upto):
                    yield (last.version, (fragment.id,), missing), fragment.rows
            if last.snapshot:
                return
            first = Position(last.version)
        for version in range(first.version + (first.fragment is None), last.version + 1):
            change = self._change(version, last.version)
            if change.changes_rows:
                continue  # planned as skipped (else the batch would have ended before it)
            after = first.fragment if version == first.version else None
            upto = last.fragment if version == last.version else None
            missing = tuple(c for c in columns if c not in change.columns)
            for fragment in change.appended:
                if (after is None or fragment.id > after) and (upto is None or fragment.id <= upto):
                    yield (version, (fragment.id,), missing), fragment.rows

    def _group(self, pieces: list[tuple[Piece, int]]) -> list[InputPartition]:
        """Pieces merged per version and grouped up to ``rows_per_partition`` rows."""
        limit = self.plan.options.rows_per_partition
        partitions: list[list[Piece]] = []
        rows = 0
        for (version, ids, missing), count in pieces:
            if not partitions or (rows and rows + count > limit):
                partitions.append([])
                rows = 0
            group = partitions[-1]
            if group and group[-1][0] == version:
                group[-1] = (version, group[-1][1] + ids, missing)
            else:
                group.append((version, ids, missing))
            rows += count
        return [LanceTxStreamPartition(group) for group in partitions]

    def commit(self, end: dict[str, Any]) -> None:
        done = Position.of(end)
        if done.start is None:
            for version in [v for v in self._changes if v < done.version]:
                del self._changes[version]

    # ------------------------------------------------------------- reading

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        target = spark_arrow_schema(StructType.fromJson(json.loads(self.plan.schema_json)))
        for version, ids, missing in getattr(partition, "pieces", ()):
            try:
                yield from self._read_piece(target, version, ids, missing)
            except Exception as exc:
                raise self._read_failure(version, exc) from exc

    def _read_piece(
        self, target: pa.Schema, version: int, ids: tuple[int, ...], missing: tuple[str, ...]
    ) -> Iterator[pa.RecordBatch]:
        import lance
        import pyarrow as pa

        options = self.plan.options
        dataset = lance.dataset(
            self.plan.data_uri,
            version=version,
            storage_options=self.plan.pylance_options or None,
        )
        present = [f.name for f in target if f.name not in missing]
        scanner = dataset.scanner(
            columns=present,
            filter=options.filter,
            fragments=[_fragment(dataset, version, i) for i in ids],
            batch_size=options.batch_size,
        )
        for batch in scanner.to_batches():
            if not batch.num_rows:
                continue
            if missing:
                arrays = [
                    batch.column(f.name)
                    if f.name not in missing
                    else pa.nulls(batch.num_rows, f.type)
                    for f in target
                ]
                batch = pa.RecordBatch.from_arrays(arrays, schema=target)
            yield conform_read_batch(batch, target)

    def _read_failure(self, version: int, exc: Exception) -> Exception:
        """``exc``, or VersionsRemovedError when a cleanup removed ``version`` after this
        micro-batch was planned (pylance's own error names only a file not found)."""
        import lance

        from lancetx.commit.errors import LancetxError

        if isinstance(exc, LancetxError):
            return exc
        try:
            lance.dataset(
                self.plan.data_uri,
                version=version,
                storage_options=self.plan.pylance_options or None,
            )
        except Exception as probe:
            if not says_not_found(probe):
                return exc  # the probe failed too (a network error, say): nothing told apart
            said = pylance_gist(exc)
            return VersionsRemovedError(
                self.plan.uri,
                [version],
                None,
                f"A cleanup removed it after this micro-batch was planned (pylance: {said}), "
                "so its rows are lost to this stream. To go on, start a new query (a new "
                "checkpointLocation), with no starting option to read the table as it is "
                "now; and keep versions for longer than a stream may lag behind "
                "(lancetx-sync cleanup --older-than)",
            )
        return exc


def _fragment(dataset: Any, version: int, fragment_id: int) -> Any:
    fragment = dataset.get_fragment(fragment_id)
    if fragment is None:  # the manifest lancetx read lists it: pylance must find it
        raise ManifestFormatError(
            f"{dataset.uri} (version {version})",
            f"pylance finds no fragment {fragment_id}, which lancetx read in this "
            "version's manifest; run lancetx-sync verify on the table",
        )
    return fragment
