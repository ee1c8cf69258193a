"""A Table's scanner: pylance's ``LanceScanner`` at the Table's version, whose reads
say VersionNotFoundError (naming the version and what to do) when a cleanup removed
the version after the scanner was made.

A scanner is made while the version's files are there and read later, batch by batch,
perhaps for minutes: a cleanup without an age floor can remove them in between, and
pylance then names only a data file "not found". Every read here goes through the
Table's own check, so a batch read after such a cleanup fails as ``Table.to_table``
does; any other failure is pylance's, unchanged.

It is a ``LanceScanner`` (so a ``pyarrow.dataset.Scanner``), as ``Table.scanner``
returned before: ``isinstance`` checks and tools that take an Arrow scanner still
take it. pylance's own state stays in the scanner it wraps, which makes the reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import pyarrow as pa
from lance import LanceScanner


class Scanner(LanceScanner):
    """pylance's scanner at one version (a ``LanceScanner``: every method and property
    of it). Its reads (``to_table``, ``count_rows``, ``head``, ``to_pandas``,
    ``scan_batches``, ``analyze_plan``; ``to_batches`` and ``to_reader`` stream, each
    batch read under the same check) raise VersionNotFoundError when a cleanup removed
    the version."""

    def __init__(
        self, scanner: LanceScanner, reading: Callable[[], AbstractContextManager[None]]
    ) -> None:
        # Not LanceScanner.__init__: pylance's state stays in ``scanner``, which reads.
        self._wrapped = scanner
        self._reading = reading

    def __getattr__(self, name: str) -> Any:
        # Only what the class does not define: the wrapped scanner's own attributes
        # (those some pylance versions add; its state, which a LanceScanner method not
        # overridden here reads). None on an instance made without __init__ (copy,
        # unpickling): looking ``_wrapped`` up through here would recurse.
        wrapped = self.__dict__.get("_wrapped")
        if wrapped is None:
            raise AttributeError(name)
        return getattr(wrapped, name)

    def __repr__(self) -> str:
        return f"lancetx.Scanner({self._wrapped!r})"

    # Planning reads no data file: pylance's, as it is.

    @property
    def projected_schema(self) -> pa.Schema:
        """The schema of the batches the scan reads."""
        return self._wrapped.projected_schema

    @property
    def dataset_schema(self) -> pa.Schema:
        """The schema with which batches will be read from fragments."""
        return self._wrapped.dataset_schema

    def explain_plan(self, verbose: bool = False) -> str:
        return self._wrapped.explain_plan(verbose=verbose)

    # Reads.

    def to_table(self) -> pa.Table:
        with self._reading():
            return self._wrapped.to_table()

    def count_rows(self) -> int:
        with self._reading():
            return self._wrapped.count_rows()

    # pylance leaves head, take and scan_batches unannotated.

    def head(self, num_rows: int) -> pa.Table:
        untyped: Any = self._wrapped
        with self._reading():
            return untyped.head(num_rows)

    def take(self, indices: Any) -> Any:
        untyped: Any = self._wrapped
        with self._reading():
            return untyped.take(indices)

    def to_pandas(self, *args: Any, **kwargs: Any) -> Any:
        with self._reading():
            return self._wrapped.to_pandas(*args, **kwargs)

    def scan_batches(self) -> Any:
        untyped: Any = self._wrapped
        with self._reading():
            return untyped.scan_batches()

    def analyze_plan(self, count_rows: bool = False) -> str:
        with self._reading():
            return self._wrapped.analyze_plan(count_rows=count_rows)

    def to_batches(self) -> Iterator[pa.RecordBatch]:
        """The batches, read as the iteration goes on (the scan starts at the first)."""
        return self._checked(None)

    def to_reader(self) -> pa.RecordBatchReader:
        """A ``RecordBatchReader`` over the batches, read as they are pulled. The scan
        starts now, as pylance's does: an unknown column or a bad filter fails here."""
        with self._reading():
            reader = self._wrapped.to_reader()
        return pa.RecordBatchReader.from_batches(reader.schema, self._checked(reader))

    def _checked(self, reader: pa.RecordBatchReader | None) -> Iterator[pa.RecordBatch]:
        """``reader``'s batches (a new scan's if None), each read under the check, the
        caller's code between them not. pylance's reader is closed when the iteration
        ends or is abandoned (``break``, a dropped reader): its scan stops then."""
        try:
            if reader is None:
                with self._reading():
                    reader = self._wrapped.to_reader()
            while True:
                with self._reading():
                    try:
                        batch = reader.read_next_batch()
                    except StopIteration:  # the end, not a failure to look into
                        return
                yield batch
        finally:
            if reader is not None:
                reader.close()
