"""The README's Spark snippet runs as written, against the embedded server, on the shared session."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import boto3
import lance
from spark_helpers import spark_options

from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.dynamodb.store import create_table

README = Path(__file__).resolve().parents[2] / "README.md"
README_URI = '"s3+ddb://my-bucket/tables/events.lance?ddbTableName=lance_manifests"'


def test_the_readme_spark_snippet_writes_and_reads_back(
    spark: Any, aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    (code,) = re.findall(r"```python spark\n(.*?)```", README.read_text(), flags=re.S)
    options = aws.pylance_storage_options()
    uri = f"s3+ddb://{bucket}/tables/events.lance?ddbTableName={ddb_table_name}"
    create_table(boto3.client("dynamodb", **aws.client_kwargs("dynamodb")), ddb_table_name)
    assert README_URI in code, "README Spark example changed shape"
    code = (
        code.replace(README_URI, repr(uri))
        .replace('{"storage.aws_region": "eu-west-1"}', repr(spark_options(options)))
        .replace('{"aws_region": "eu-west-1"}', repr(options))
    )
    df = spark.createDataFrame(
        [(i, [float(i)] * 128) for i in range(5)], "id long, emb array<float>"
    )
    namespace: dict[str, Any] = {"df": df, "spark": spark}
    exec(compile(code, f"{README}:python spark block", "exec"), namespace)
    assert namespace["version"] == 1
    assert sorted(r["id"] for r in namespace["old"].collect()) == [0, 1, 2, 3, 4]
    ds = lance.dataset(uri, storage_options=options)
    assert str(ds.schema.field("emb").type) == "fixed_size_list<item: float>[128]"
