"""A Table's scanner: pylance's ``LanceScanner`` at the Table's version, whose reads
say VersionNotFoundError (naming the version and what to do) when a cleanup removed
the version after the scanner was made.

A scanner is made while the version's files are there and read later, batch by batch,
perhaps for minutes: a cleanup without an age floor can remove them in between, and
pylance then names only a data file "not found". Every read here goes through the
Table's own check, so a batch read after such a cleanup fails as ``Table.to_table``
does; any other failure is pylance's, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from lance import LanceScanner

#: the scanner's methods that read the version's files (the rest only plan).
_READS = frozenset(
    {"to_table", "count_rows", "head", "take", "to_pandas", "analyze_plan", "scan_batches"}
)


class Scanner:
    """pylance's scanner at one version (every ``LanceScanner`` method and property);
    ``to_batches`` and ``to_reader`` stream, each batch read under the same check."""

    def __init__(
        self, scanner: LanceScanner, reading: Callable[[], AbstractContextManager[None]]
    ) -> None:
        self._scanner = scanner
        self._reading = reading

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._scanner, name)
        if name not in _READS:
            return attribute

        def read(*args: Any, **kwargs: Any) -> Any:
            with self._reading():
                return attribute(*args, **kwargs)

        return read

    def __repr__(self) -> str:
        return f"lancetx.Scanner({self._scanner!r})"

    def to_batches(self) -> Iterator[pa.RecordBatch]:
        """The batches, read as the iteration goes on."""
        return self._checked(lambda: self._scanner.to_batches())

    def to_reader(self) -> pa.RecordBatchReader:
        """A ``RecordBatchReader`` over the batches, read as they are pulled."""
        import pyarrow as pa

        with self._reading():
            schema = self._scanner.projected_schema
        return pa.RecordBatchReader.from_batches(schema, self.to_batches())

    def _checked(self, start: Callable[[], Iterable[Any]]) -> Iterator[Any]:
        with self._reading():
            yield from start()
