"""The README's commands and usage examples stay true."""

from __future__ import annotations

import os
import re
from pathlib import Path

import boto3
import external_backend
import lance
import pytest

from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.dynamodb.store import create_table

#: Runs against any real S3 + DynamoDB too: make test-localstack (LocalStack S3 + dynalite).
pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parent.parent / "README.md"
README_URI = '"s3+ddb://my-bucket/tables/events.lance?ddbTableName=lance_manifests"'
README_OPTIONS = '{"aws_region": "eu-west-1"}'


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_opens_with_the_two_commands() -> None:
    first = _blocks("bash")[0].strip().splitlines()
    assert [line.split("#")[0].strip() for line in first] == ["make demo", "make test"]
    ci = (README.parent / ".ci" / "run").read_text()
    assert "make test" in ci


def test_every_python_snippet_runs_on_a_fresh_empty_path(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """All python blocks, in order, in one namespace, against a table that does not exist yet."""
    if not external_backend.implements_transactions(aws):
        pytest.skip(
            "this run's DynamoDB (dynalite) lacks TransactWriteItems, which the README's keyed "
            "commits need; tests/externalstore/test_endpoint_without_transactions.py covers "
            "what a user sees there"
        )
    blocks = _blocks("python")
    assert README_URI in blocks[0] and README_OPTIONS in blocks[0], "README example changed shape"
    uri = f"s3+ddb://{bucket}/tables/events.lance?ddbTableName={ddb_table_name}"
    options = aws.pylance_storage_options()
    create_table(boto3.client("dynamodb", **aws.client_kwargs("dynamodb")), ddb_table_name)
    namespace: dict[str, object] = {}
    for i, block in enumerate(blocks):
        code = block.replace(README_URI, repr(uri)).replace(README_OPTIONS, repr(options))
        exec(compile(code, f"{README}:python block {i + 1}", "exec"), namespace)
    ds = lance.dataset(uri, storage_options=options)
    history = [v["version"] for v in ds.versions()]
    assert history == list(range(1, ds.version + 1))
    # created, changed by every verb, then the async snippet deleted ids >= 100
    # (the streamed rows and the committed fragment); the low-level append added 600.
    assert sorted(ds.to_table()["id"].to_pylist()) == [1, 3, 4, 9, 10, 600]


_ASYNC_SCRIPT = """
import json, sys
uri, options = json.loads(sys.argv[1])
"""
#: What asyncio's debug mode may log: a step that held the loop longer than 100 ms
#: (timing on a loaded machine, not a fault).
_DEBUG_TIMING = re.compile(r"^Executing <.*> took [0-9.]+ seconds$")


@pytest.mark.parametrize("debug", [False, True], ids=["asyncio.run", "PYTHONASYNCIODEBUG"])
def test_the_asyncio_snippet_runs_cleanly_with_warnings_as_errors(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str, debug: bool
) -> None:
    """The README's asyncio block as a user runs it (a script, the table never closed):
    no warning, no "Task exception was never retrieved", nothing on stderr."""
    import json
    import subprocess
    import sys

    import pyarrow as pa

    import lancetx

    (snippet,) = [b for b in _blocks("python") if "asyncio.run(" in b]
    uri = f"s3+ddb://{bucket}/tables/events.lance?ddbTableName={ddb_table_name}"
    options = aws.pylance_storage_options()
    create_table(boto3.client("dynamodb", **aws.client_kwargs("dynamodb")), ddb_table_name)
    lancetx.write_table(uri, pa.table({"id": list(range(150))}), storage_options=options)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONASYNCIODEBUG"}
    env["PYTHONWARNINGS"] = "error"
    # Python's development mode turns asyncio's debug mode on (and shows every
    # ResourceWarning): only in the debug case.
    flags = ["-W", "error"]
    if debug:
        env["PYTHONASYNCIODEBUG"] = "1"
        flags += ["-X", "dev"]
    done = subprocess.run(
        [sys.executable, *flags, "-c", _ASYNC_SCRIPT + snippet, json.dumps([uri, options])],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    noise = [line for line in done.stderr.splitlines() if line and not _DEBUG_TIMING.match(line)]
    assert done.returncode == 0 and noise == [], done.stderr
    assert done.stdout.split() == ["100"]
