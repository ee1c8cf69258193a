"""The README's commands and usage example stay true."""

from __future__ import annotations

import re
from pathlib import Path

import boto3
import lance
import pyarrow as pa
import pytest

from lancetx.externalstore.dynamodb import create_table
from lancetx.externalstore.embedded import EmbeddedAws

#: Runs against any real S3 + DynamoDB too: make test-localstack (LocalStack S3 + dynalite).
pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parent.parent / "README.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_opens_with_the_two_commands() -> None:
    first = _blocks("bash")[0].strip().splitlines()
    assert [line.split("#")[0].strip() for line in first] == ["make demo", "make test"]
    ci = (README.parent / ".ci" / "run").read_text()
    assert "make test" in ci


def test_usage_example_runs_against_moto(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    code = _blocks("python")[0]
    uri = f"s3+ddb://{bucket}/tables/events.lance?ddbTableName={ddb_table_name}"
    options = aws.pylance_storage_options()
    code = code.replace(
        '"s3+ddb://my-bucket/tables/events.lance?ddbTableName=lance_manifests"', repr(uri)
    ).replace('{"aws_region": "eu-west-1"}', repr(options))
    assert repr(uri) in code and repr(options) in code, "README example changed shape"
    create_table(boto3.client("dynamodb", **aws.client_kwargs("dynamodb")), ddb_table_name)
    lance.write_dataset(pa.table({"x": [0]}), uri, storage_options=options)
    namespace: dict[str, object] = {}
    exec(compile(code, str(README), "exec"), namespace)
    ds = lance.dataset(uri, storage_options=options)
    assert ds.version == 2
    assert sorted(ds.to_table()["x"].to_pylist()) == [0, 1, 2]
