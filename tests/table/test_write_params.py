"""Write parameters a user gets wrong, at every door that takes them.

``append``/``overwrite``/``write_table``/``writer`` hand ``**write_params`` to
``lance.fragment.write_fragments``. ``append(..., mode="overwrite")`` and a typo
(``max_row_per_file=``) used to fail inside pylance and be reported as "the data
does not match the table's schema … cast the data"; the streaming writer raised
pylance's raw ``TypeError`` from its worker thread; ``max_rows_per_file=0`` made
pylance's writer *panic* (``pyo3_runtime.PanicException``, a BaseException). Each is
now InvalidWriteParamError (a TypeError and a ValueError) naming the parameter,
before anything is written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lance
import pytest
from table_helpers import ids

import lancetx
import lancetx.aio
from lancetx.errors import InvalidWriteParamError
from lancetx.table import Table

BAD = {
    "mode": ({"mode": "overwrite"}, "the verb decides it"),
    "storage_options": ({"storage_options": {"k": "v"}}, "lancetx.open"),
    "typo": ({"max_row_per_file": 10}, "did you mean 'max_rows_per_file'"),
    "zero": ({"max_rows_per_file": 0}, "positive integer"),
    "negative": ({"max_bytes_per_file": -1}, "positive integer"),
}


def _writer(table: Table, params: dict[str, Any]) -> Any:
    with table.writer(**params) as w:
        w.write(ids(3, 10))
        return w.commit()


def _async_writer(table: Table, params: dict[str, Any]) -> Any:
    async def main() -> int:
        opened = await lancetx.aio.open(table.uri)
        async with opened, opened.writer(**params) as w:
            await w.write(ids(3, 10))
            return await w.commit()

    return asyncio.run(main())


DOORS: dict[str, Callable[[Table, dict[str, Any]], Any]] = {
    "append": lambda t, p: t.append(ids(3, 10), **p),
    "overwrite": lambda t, p: t.overwrite(ids(3, 10), **p),
    "write_table": lambda t, p: lancetx.write_table(t.uri, ids(3, 10), mode="append", **p),
    "writer": _writer,
    "async-writer": _async_writer,
}


#: write_table takes ``mode`` and ``storage_options`` as its own arguments.
CASES = [
    (d, b)
    for d in DOORS
    for b in BAD
    if not (d == "write_table" and b in ("mode", "storage_options"))
]


@pytest.mark.parametrize(("door", "bad"), CASES)
def test_a_bad_write_param_is_refused_before_anything_is_written(
    door: str, bad: str, tmp_path: Path
) -> None:
    table = lancetx.write_table(str(tmp_path / "t.lance"), ids(2))
    before = sorted((tmp_path / "t.lance" / "data").iterdir())
    params, says = BAD[bad]
    with pytest.raises(InvalidWriteParamError, match=says) as info:
        DOORS[door](table, dict(params))
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)
    assert sorted((tmp_path / "t.lance" / "data").iterdir()) == before
    assert lance.dataset(table.uri).version == 1


def test_good_write_params_still_reach_pylance(tmp_path: Path) -> None:
    table = lancetx.write_table(str(tmp_path / "t.lance"), ids(2))
    table.append(ids(10, 10), max_rows_per_file=4, max_rows_per_group=2)
    with table.writer(max_rows_per_file=5, data_storage_version=None) as w:
        w.write(ids(10, 20))
        w.commit()
    fragments = lance.dataset(table.uri).get_fragments()
    assert [f.count_rows() for f in fragments] == [2, 4, 4, 2, 5, 5]
