"""Helpers of the Spark tests: a local session, option and table inspection helpers."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any


def build_session(app_name: str = "lancetx-tests") -> Any:
    """A small local-mode session (also used by the examples' test)."""
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master("local[2,3]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )


def spark_options(storage_options: dict[str, str]) -> dict[str, str]:
    """The same options as data-source options (``storage.<name>``)."""
    return {f"storage.{k}": v for k, v in storage_options.items()}


def lance_ids(
    uri: str, storage_options: dict[str, str] | None = None, column: str = "id"
) -> list[int]:
    """The sorted ``column`` values pylance reads from the latest version."""
    import lance

    ds = lance.dataset(uri, storage_options=storage_options or None)
    return sorted(ds.to_table(columns=[column]).column(column).to_pylist())


def data_files(uri: str, storage_options: dict[str, str] | None = None) -> set[str]:
    """Every data file under the table's ``data/`` directory."""
    from lancetx.commit.storage.stores import open_object_store
    from lancetx.externalstore.connect import connect

    conn = connect(uri, storage_options or {})
    store, base = open_object_store(conn.data_uri, storage_options or {}, legacy=True)
    prefix = f"{base}/data/"
    return {meta.key[len(prefix) :] for meta in store.list(prefix)}


def referenced_files(uri: str, storage_options: dict[str, str] | None = None) -> set[str]:
    """Data files referenced by any version of the table."""
    import lance

    ds = lance.dataset(uri, storage_options=storage_options or None)
    out: set[str] = set()
    for v in ds.versions():
        old = lance.dataset(uri, version=v["version"], storage_options=storage_options or None)
        out |= {f.path for frag in old.get_fragments() for f in frag.metadata.files}
    return out


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example(name: str) -> Any:
    """Import ``examples/<name>.py`` (examples are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: Spark gives a Python worker it starts on its own (a streaming source's, a planner's)
#: a fixed 10 s to connect back; on a loaded machine the worker's imports can take longer.
WORKER_DID_NOT_CONNECT = "Python worker failed to connect back"
#: Starts of a streaming query on a worker that did not connect back.
STREAM_ATTEMPTS = 5


def run_stream(start: Callable[[], Any]) -> Any:
    """``start()`` a streaming query and wait for it to end; started again (from its
    checkpoint, which a restart resumes exactly) when Spark gave up on one of its Python
    workers connecting back, so a loaded machine cannot fail the test. Returns the
    query; raises what stopped it otherwise."""
    for attempt in range(1, STREAM_ATTEMPTS + 1):
        query = start()
        try:
            query.awaitTermination()
        except Exception as exc:
            if WORKER_DID_NOT_CONNECT not in str(exc) or attempt == STREAM_ATTEMPTS:
                raise
            continue
        return query
    raise AssertionError("unreachable")
