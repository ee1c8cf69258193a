"""User data → one Arrow stream pylance can write in a single pass.

``data`` may be anything pylance's ``write_dataset`` takes: ``pa.Table``,
``pa.RecordBatch``, ``pa.RecordBatchReader``, an iterable of batches or tables,
a pandas DataFrame (if pandas is installed), or anything ``lance`` itself coerces
(a Lance or Arrow dataset or scanner, a dict of columns, a list of row dicts or
pydantic models, a polars DataFrame, a Hugging Face dataset; a lancetx Table's
``scanner()`` or ``dataset``). A list of row dicts has a column for every key of
every row; ``schema=`` given with a kind pylance coerces must be the data's.

The stream is *guarded*: when the user's iterator raises (a KeyboardInterrupt or
SystemExit too), the stream ends cleanly instead of failing inside pylance, and the
exception is kept in :class:`StreamGuard`. pylance then finishes the files it started
and tells us their paths, so the caller can delete every one of them and re-raise —
nothing half-written stays behind, nothing is committed. A Ctrl-C while pylance
writes ends the stream the same way (:func:`write_interruptibly`).
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa

from lancetx.errors import SchemaMismatchError, UnsupportedInputError

_T = TypeVar("_T")


@dataclass
class StreamGuard:
    """What a guarded stream saw: rows passed on, and the error that ended it, if any.
    ``stop`` set (from another thread) ends the stream at its next batch, as ``error``."""

    rows: int = 0
    error: BaseException | None = None
    stop: BaseException | None = None

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error


def write_interruptibly(write: Callable[[], _T], guard: StreamGuard) -> _T:
    """``write()``, a pylance write consuming ``guard``'s stream, such that Ctrl-C stops
    it and loses none of its files.

    pylance pulls the stream from a thread of its own while the caller's thread waits
    in Rust, where no signal handler runs: a Ctrl-C was seen only once the whole stream
    was written, and raised as pylance returned, before its caller learned of the files
    it wrote (they stayed, unreferenced). Here the main thread waits in Python while a
    worker writes: a KeyboardInterrupt (or whatever a signal handler raises) ends the
    stream at its next batch, pylance finishes the files it started and returns them,
    and the exception becomes ``guard.error`` — the caller deletes those files and
    raises it. Off the main thread (no signal reaches it) ``write()`` runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        return write()
    outcome: list[tuple[bool, Any]] = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append((True, write()))
        except BaseException as exc:
            outcome.append((False, exc))
        finally:
            done.set()

    # In the caller's context (as asyncio.to_thread); a daemon: after a second Ctrl-C
    # the process may exit without waiting for it.
    context = contextvars.copy_context()
    worker = threading.Thread(target=context.run, args=(run,), name="lancetx-write", daemon=True)
    try:
        worker.start()
        done.wait()
    except BaseException as exc:
        guard.stop = exc
        if not (worker.is_alive() or done.is_set()):
            raise  # not started: the stream, if it ever begins, ends at once, unwritten
        done.wait()  # pylance finishes the files it started (a second Ctrl-C: gc's)
        guard.error = exc
    ok, value = outcome[0]
    if not ok:
        if guard.stop is not None:
            raise guard.stop from value  # pylance failed after all: its files are gone
        raise value
    result: _T = value
    return result


def _first_and_rest(items: Iterable[Any]) -> tuple[Any, Iterator[Any]]:
    iterator = iter(items)
    try:
        first = next(iterator)
    except StopIteration:
        return None, iterator
    return first, iterator


def _as_batches(item: Any, uri: str) -> list[pa.RecordBatch]:
    if isinstance(item, pa.RecordBatch):
        return [item]
    if isinstance(item, pa.Table):
        batches: list[pa.RecordBatch] = item.to_batches()
        return batches
    raise UnsupportedInputError(
        uri, item, "an iterable of data must yield pa.RecordBatch or pa.Table"
    )


def to_reader(
    uri: str, data: Any, schema: pa.Schema | None = None
) -> tuple[pa.RecordBatchReader, StreamGuard]:
    """``data`` as one guarded RecordBatchReader (read once, never materialized here)."""
    guard = StreamGuard()
    source: Iterator[pa.RecordBatch]
    if isinstance(data, pa.Table):
        schema = schema or data.schema
        source = iter(data.to_batches())
    elif isinstance(data, pa.RecordBatch):
        schema = schema or data.schema
        source = iter([data])
    elif isinstance(data, pa.RecordBatchReader):
        schema = schema or data.schema
        source = iter(data)
    elif _is_pandas(data):
        table = pa.Table.from_pandas(data, schema=schema, preserve_index=False)
        schema = table.schema
        source = iter(table.to_batches())
    elif _pylance_coerces(data):
        reader = _lance_coerce(uri, data, schema)
        if schema is not None and not reader.schema.equals(schema):
            # pylance ignores schema= for a dataset, a scanner, a polars or Hugging
            # Face frame: the data would be written with a schema other than asked for.
            reader.close()
            raise SchemaMismatchError(
                uri, f"schema= is {_one_line(schema)} but the data's is {_one_line(reader.schema)}"
            )
        schema = schema or reader.schema
        source = iter(reader)
    elif isinstance(data, Iterable) and not isinstance(data, str | bytes | dict):
        first, rest = _first_and_rest(data)
        if first is None:
            if schema is None:
                raise UnsupportedInputError(
                    uri, data, "an empty iterable carries no schema; pass schema="
                )
            source = iter(())
        else:
            head = _as_batches(first, uri)
            schema = schema or (head[0].schema if head else first.schema)

            def chained() -> Iterator[pa.RecordBatch]:
                yield from head
                for item in rest:
                    yield from _as_batches(item, uri)

            source = chained()
    else:
        reader = _lance_coerce(uri, data, schema)
        schema = reader.schema
        source = iter(reader)
    assert schema is not None
    return pa.RecordBatchReader.from_batches(schema, _guarded(source, schema, guard)), guard


def _guarded(
    source: Iterator[pa.RecordBatch], schema: pa.Schema, guard: StreamGuard
) -> Iterator[pa.RecordBatch]:
    while True:
        if guard.stop is not None:
            guard.error = guard.stop
            return
        try:
            batch = next(source)
        except StopIteration:
            return
        except BaseException as exc:
            # KeyboardInterrupt and SystemExit too: raised into pylance they came back
            # as its OSError ("C Data interface error"), the interrupt lost. Not
            # GeneratorExit: that is thrown at the ``yield`` below, never caught here.
            guard.error = exc
            return
        if not batch.schema.equals(schema):
            # A stray batch would fail deep inside pylance; fail here, cleanly.
            guard.error = SchemaMismatchError(
                "<stream>",
                f"a batch has schema {batch.schema} but the stream started with {schema}",
            )
            return
        guard.rows += batch.num_rows
        yield batch


def _is_pandas(data: Any) -> bool:
    module = type(data).__module__
    return module.startswith("pandas") and hasattr(data, "to_records")


def _pylance_coerces(data: Any) -> bool:
    """Whether ``data`` is one of the kinds pylance turns into a stream itself, though it
    may also be iterable (a polars or Hugging Face frame iterates its columns or rows,
    a list its rows): an Arrow or Lance dataset or scanner (a Table's scanner too), a
    dict of columns, a list of row dicts or pydantic models, a polars DataFrame, a
    Hugging Face dataset."""
    import pyarrow.dataset as pa_dataset

    if isinstance(data, pa_dataset.Dataset | pa_dataset.Scanner | dict):
        return True
    if isinstance(data, list):
        return bool(data) and (isinstance(data[0], dict) or hasattr(data[0], "model_dump"))
    return type(data).__module__.split(".")[0] in ("polars", "datasets")


def _row_dicts_as_columns(uri: str, data: Any, schema: pa.Schema | None) -> Any:
    """A list of row dicts as pylance should coerce it: every item must be a dict (pyarrow
    took any other item for a row of nulls), and without ``schema=`` its columns are
    every key of every row, a row lacking one null there (pyarrow took only the first
    row's keys: another row's other keys were dropped, their values lost). Anything
    else is returned as it is."""
    if not (isinstance(data, list) and data and isinstance(data[0], dict)):
        return data
    for index, row in enumerate(data):
        if not isinstance(row, dict):
            raise UnsupportedInputError(
                uri, row, f"item {index} of a list of row dicts: every item must be a dict"
            )
    if schema is not None:
        return data  # the columns are the schema's
    names = list(dict.fromkeys(name for row in data for name in row))
    return {name: [row.get(name) for row in data] for name in names}


def _one_line(schema: pa.Schema) -> str:
    fields = (f"{f.name}: {f.type}{'' if f.nullable else ' not null'}" for f in schema)
    return "(" + ", ".join(fields) + ")"


def _lance_coerce(uri: str, data: Any, schema: pa.Schema | None) -> pa.RecordBatchReader:
    import importlib

    # pylance keeps its coercion in lance.types (14); older releases had it in the
    # lance.dataset module, which ``from lance import dataset`` does not reach (that
    # name is the lance.dataset() function).
    coerce = None
    for module in ("lance.types", "lance.dataset"):
        try:
            coerce = getattr(importlib.import_module(module), "_coerce_reader", None)
        except ImportError:
            continue
        if coerce is not None:
            break
    if coerce is None:
        raise UnsupportedInputError(uri, data, "expected Arrow data (pa.Table, RecordBatchReader)")
    coercible = _row_dicts_as_columns(uri, data, schema)
    try:
        reader: pa.RecordBatchReader = coerce(coercible, schema)
    except (TypeError, ValueError, KeyError, OverflowError, NotImplementedError) as exc:
        # pyarrow's conversions: a KeyError for a column schema= names that a dict
        # lacks, an OverflowError for an int too large for int64, ArrowNotImplementedError
        # (a NotImplementedError) for a type it cannot convert.
        raise UnsupportedInputError(uri, data, f"expected data pylance can write ({exc})") from None
    return reader


def check_append_schema(uri: str, data: pa.Schema, table: pa.Schema) -> None:
    """Refuse data whose columns the table does not have, or has with another type."""
    problems: list[str] = []
    for field in data:
        index = table.get_field_index(field.name)
        if index < 0:
            problems.append(f"column {field.name!r} is not in the table")
            continue
        expected = table.field(index).type
        if not field.type.equals(expected):
            problems.append(f"column {field.name!r} is {field.type}, the table has {expected}")
    missing = [f.name for f in table if data.get_field_index(f.name) < 0 and not f.nullable]
    if missing:
        problems.append(f"non-nullable column(s) {missing} are missing")
    if problems:
        raise SchemaMismatchError(uri, "; ".join(problems))


__all__ = ["StreamGuard", "check_append_schema", "to_reader", "write_interruptibly"]
