"""Helpers for the Table API tests: one test body runs through the sync and the async API.

``Api`` is the front door of one flavour; ``api.run(x)`` returns ``x`` or, for the
async flavour, awaits it — so a test reads ``api.run(table.delete("id < 3"))`` for both.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import lance
import pyarrow as pa

import lancetx
import lancetx.aio


@dataclass
class Api:
    """The sync (``lancetx``) or async (``lancetx.aio``) front door; the async one runs
    every call on one event loop (as an application would) and closes its tables."""

    name: str
    loop: asyncio.AbstractEventLoop | None = None
    tables: list[Any] = field(default_factory=list)

    @property
    def is_async(self) -> bool:
        return self.name == "async"

    def run(self, value: Any) -> Any:
        if inspect.isawaitable(value):
            if self.loop is None:
                self.loop = asyncio.new_event_loop()
            return self.loop.run_until_complete(_await(value))
        return value

    def close(self) -> None:
        if self.loop is not None:
            for table in self.tables:
                self.loop.run_until_complete(table.aclose())
            self.loop.close()

    def _keep(self, table: Any) -> Any:
        if self.is_async:
            self.tables.append(table)
        return table

    def write_table(self, uri: str, data: Any, **kwargs: Any) -> Any:
        module: Any = lancetx.aio if self.is_async else lancetx
        return self._keep(self.run(module.write_table(uri, data, **kwargs)))

    def open(self, uri: str, options: dict[str, str] | None, **kwargs: Any) -> Any:
        module: Any = lancetx.aio if self.is_async else lancetx
        return self._keep(self.run(module.open(uri, options, **kwargs)))

    def commit_fragments(self, uri: str, fragments: Any, **kwargs: Any) -> Any:
        module: Any = lancetx.aio if self.is_async else lancetx
        return self.run(module.commit_fragments(uri, fragments, **kwargs))

    def history(self, table: Any) -> list[lancetx.VersionInfo]:
        result: list[lancetx.VersionInfo] = self.run(table.history())
        return result


async def _await(value: Any) -> Any:
    return await value


def pylance_rows(
    uri: str, options: dict[str, str] | None, version: int, sort: str = "id"
) -> dict[str, list[Any]]:
    """What real pylance reads at ``version``, sorted by ``sort``."""
    table = lance.dataset(uri, version=version, storage_options=options).to_table()
    return table.sort_by(sort).to_pydict()


def ids(n: int, start: int = 0) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(start, start + n), pa.int64()),
            "name": [f"n{i}" for i in range(start, start + n)],
        }
    )


def ddb_uri(bucket: str, ddb_table: str, name: str = "t.lance") -> str:
    return f"s3+ddb://{bucket}/{name}?ddbTableName={ddb_table}"


def data_files(s3_client: Any, bucket: str, prefix: str) -> set[str]:
    """Keys under ``prefix`` in ``bucket`` (e.g. a table's ``data/``)."""
    keys: set[str] = set()
    for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.update(obj["Key"] for obj in page.get("Contents", []))
    return keys


def api_fixture(request: Any) -> Iterator[Api]:
    """Body of the ``api`` fixture: the flavour named by the parameter, closed after."""
    api = Api(request.param)
    try:
        yield api
    finally:
        api.close()


class WriterFacade:
    """A streaming writer of either flavour, used with plain calls and ``with``."""

    def __init__(self, api: Api, writer: Any) -> None:
        self.api = api
        self.writer = writer

    def __enter__(self) -> WriterFacade:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.api.is_async:
            self.api.run(self.writer.__aexit__(*exc))
        else:
            self.writer.__exit__(*exc)

    def write(self, data: Any) -> None:
        self.api.run(self.writer.write(data))

    def commit(self) -> int:
        version: int = self.api.run(self.writer.commit())
        return version

    def abort(self) -> None:
        self.api.run(self.writer.abort())
