"""Every public verb checks its arguments against its own signature: a wrong type is an
ArgumentTypeError naming the argument, the type it needs and the call's signature,
raised before anything is read or written."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pytest

import lancetx
import lancetx.aio
from lancetx.errors import ArgumentTypeError
from lancetx.table import MergeInsertBuilder


def _table(path: Path) -> lancetx.Table:
    return lancetx.write_table(
        str(path / "t.lance"), pa.table({"id": list(range(20)), "v": ["a"] * 20})
    )


def _files(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()}


def test_swapped_update_arguments_name_the_type_and_the_signature(tmp_path: Path) -> None:
    table = _table(tmp_path)
    before = _files(tmp_path)
    with pytest.raises(ArgumentTypeError) as caught:
        table.update("id >= 15", {"v": "1"})  # type: ignore[arg-type]
    message = str(caught.value)
    assert "Table.update(): argument 'values' must be Mapping[str, Any], got str 'id >= 15'" in (
        message
    )
    assert "are 'where' and 'values' swapped?" in message
    assert "Signature: Table.update(values: Mapping[str, Any], where: str | None = None, *," in (
        message
    )
    assert isinstance(caught.value, TypeError)  # what Python code catches for a wrong type
    assert _files(tmp_path) == before
    assert lance.dataset(str(tmp_path / "t.lance")).version == 1


def test_the_async_table_checks_the_same_way(tmp_path: Path) -> None:
    _table(tmp_path)

    async def swapped() -> None:
        async with await lancetx.aio.open(str(tmp_path / "t.lance")) as table:
            await table.update("id >= 15", {"v": "1"})  # type: ignore[arg-type]

    with pytest.raises(ArgumentTypeError, match=r"AsyncTable\.update\(\): argument 'values'"):
        asyncio.run(swapped())
    with pytest.raises(ArgumentTypeError, match=r"lancetx\.aio\.open\(\): argument 'uri'"):
        asyncio.run(lancetx.aio.open(tmp_path))  # type: ignore[arg-type]


WRONG_CALLS: list[tuple[str, Callable[[lancetx.Table], Any], str, str]] = [
    ("delete", lambda t: t.delete(5), "predicate", "str"),
    ("drop_columns", lambda t: t.drop_columns("v"), "columns", "Sequence[str]"),
    ("alter_columns", lambda t: t.alter_columns("v"), "alterations", "Mapping[str, Any]"),
    ("create_index", lambda t: t.create_index("id", 3), "index_type", "str"),
    ("drop_index", lambda t: t.drop_index(None), "name", "str"),
    ("restore", lambda t: t.restore("1"), "version", "int"),
    ("compact", lambda t: t.compact(expected_version=True), "expected_version", "int | None"),
    ("update_config", lambda t: t.update_config({"k": 1}), "values", "Mapping[str, str | None]"),
    (
        "append",
        lambda t: t.append([], properties={"job": 42}),
        "properties",
        "Mapping[str, str] | None",
    ),
    ("append", lambda t: t.append([], commit_message=7), "commit_message", "str | None"),
    # pa is imported by the verb, not by lancetx.table (opening a table loads no
    # pyarrow): the hint is still resolved and checked
    ("append", lambda t: t.append([], schema="id"), "schema", "pa.Schema | None"),
    ("overwrite", lambda t: t.overwrite([], idempotency_key=1), "idempotency_key", "str | None"),
    ("merge_insert", lambda t: t.merge_insert(5), "on", "str | Sequence[str]"),
    (
        "when_matched_update_all",
        lambda t: t.merge_insert("id").when_matched_update_all(1),
        "condition",
        "str | None",
    ),
    ("checkout", lambda t: t.checkout(3.0), "version", "int | str"),  # a str names a tag
    ("count_rows", lambda t: t.count_rows(3), "filter", "str | None"),
    ("writer", lambda t: t.writer(commit_message=b"x"), "commit_message", "str | None"),
    (
        "commit_fragments",
        lambda t: lancetx.commit_fragments(t.uri, [], schema="id"),
        "schema",
        "pa.Schema | None",
    ),
    ("open", lambda t: lancetx.open(t.uri, ["a=b"]), "storage_options", "Mapping[str, str] | None"),
    ("write_table", lambda t: lancetx.write_table(t.uri, [], mode=1), "mode", "str"),
    (
        "commit_many",
        lambda t: lancetx.commit_many([t.uri]),
        "transactions",
        "Mapping[K, Transaction]",
    ),
]


@pytest.mark.parametrize(
    ("verb", "call", "argument", "expected"), WRONG_CALLS, ids=[c[0] for c in WRONG_CALLS]
)
def test_a_wrong_type_is_refused_before_anything_is_written(
    tmp_path: Path, verb: str, call: Callable[[lancetx.Table], Any], argument: str, expected: str
) -> None:
    table = _table(tmp_path)
    before = _files(tmp_path)
    with pytest.raises(ArgumentTypeError) as caught:
        call(table)
    message = str(caught.value)
    assert f"{verb}(): argument {argument!r} must be {expected}, got " in message
    assert "Signature: " in message and f"{verb}(" in message.split("Signature: ")[1]
    assert _files(tmp_path) == before


def _public_functions(owner: Any) -> list[tuple[str, Any]]:
    return [
        (name, member)
        for name, member in inspect.getmembers(owner)
        if not name.startswith("_") and inspect.isfunction(member)
    ]


@pytest.mark.parametrize("owner", [lancetx.Table, lancetx.aio.AsyncTable, MergeInsertBuilder])
def test_every_public_method_is_checked(owner: type) -> None:
    methods = _public_functions(owner)
    assert len(methods) > 3
    unchecked = [name for name, fn in methods if not hasattr(fn, "__wrapped__")]
    assert unchecked == []


@pytest.mark.parametrize("module", [lancetx, lancetx.aio])
def test_every_front_door_function_is_checked(module: Any) -> None:
    names = ["open", "connect", "write_table", "commit_fragments"]
    if module is lancetx:
        names.append("commit_many")
    unchecked = [n for n in names if not hasattr(getattr(module, n), "__wrapped__")]
    assert unchecked == []
