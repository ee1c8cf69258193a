"""No silent option: every data-source option is checked (unknown names refused with
the closest valid one, camelCase and Delta spellings accepted, empty values refused),
and reads raise the same typed, actionable errors as writes."""

from __future__ import annotations

import uuid
from typing import Any

import boto3
import lance
import pytest
from spark_helpers import data_files, spark_options

import lancetx
from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.dynamodb.store import create_table
from pyspark_lancetx import errors as spark_errors
from pyspark_lancetx import last_commit
from pyspark_lancetx.errors import SparkOptionError
from pyspark_lancetx.options import ReadOptions, WriteOptions


def test_a_camel_case_job_id_makes_the_rerun_commit_nothing(
    spark: Any, ddb_uri: str, storage: dict[str, str]
) -> None:
    """``jobId`` is ``job_id``: the second run of the same job is found, not committed."""
    df = spark.range(0, 5, 1, 1)
    for _ in range(2):
        (
            df.write.format("lancetx")
            .mode("append")
            .options(**spark_options(storage))
            .option("jobId", "J1")
            .option("commitMessage", "nightly")
            .save(ddb_uri)
        )
    history = lancetx.open(ddb_uri, storage).history()
    assert [v.version for v in history] == [1]
    assert history[0].commit_message == "nightly"
    assert last_commit(ddb_uri, "J1", storage) == 1
    assert lance.dataset(ddb_uri, storage_options=storage).count_rows() == 5


@pytest.mark.parametrize(
    ("key", "suggestion"),
    [("comit_message", "did you mean commit_message?"), ("bogus_option", "options here:")],
)
def test_an_unknown_write_option_is_refused_before_anything_is_written(
    spark: Any, ddb_uri: str, storage: dict[str, str], key: str, suggestion: str
) -> None:
    df = spark.range(0, 5, 1, 1)
    with pytest.raises(Exception) as caught:
        (
            df.write.format("lancetx")
            .mode("append")
            .options(**spark_options(storage))
            .option(key, "x")
            .save(ddb_uri)
        )
    message = str(caught.value)
    assert "UnknownSparkOptionError" in message and f"unknown option {key!r}" in message
    assert suggestion in message
    assert data_files(ddb_uri, storage) == set()


def test_read_options_take_delta_names_and_refuse_typos_and_empty_values(
    spark: Any, tmp_path: Any
) -> None:
    uri = str(tmp_path / "t.lance")
    for _ in range(2):
        spark.range(0, 3, 1, 1).write.format("lancetx").mode("append").save(uri)
    assert spark.read.format("lancetx").option("versionAsOf", 1).load(uri).count() == 3
    assert spark.read.format("lancetx").option("version", 2).load(uri).count() == 6
    with pytest.raises(Exception, match=r"unknown option 'verison'.*did you mean version\?"):
        spark.read.format("lancetx").option("verison", 1).load(uri).count()
    with pytest.raises(Exception, match=r"'job_?id'.*it is a write option"):
        spark.read.format("lancetx").option("jobId", "J1").load(uri).count()
    with pytest.raises(Exception, match=r"option 'version'='' is invalid: expected a value"):
        spark.read.format("lancetx").option("version", "").load(uri).count()


def test_the_parsers_refuse_none_duplicates_and_keep_storage_options() -> None:
    """Spark drops an option whose value is None before the data source sees it (the
    README says to check first); should one arrive, it is refused too."""
    with pytest.raises(SparkOptionError, match=r"option 'version'=None is invalid"):
        ReadOptions.parse({"path": "/t", "version": None})
    with pytest.raises(SparkOptionError, match=r"also given as 'jobid'"):
        WriteOptions.parse({"path": "/t", "jobid": "a", "job_id": "b"})
    with pytest.raises(SparkOptionError) as twice:  # a credential is never repeated back
        WriteOptions.parse(
            {
                "path": "/t",
                "storage.aws_secret_access_key": "S3CR3T-1",
                "STORAGE.AWS_SECRET_ACCESS_KEY": "S3CR3T-2",
            }
        )
    assert "S3CR3T" not in str(twice.value)
    with pytest.raises(
        spark_errors.UnknownSparkOptionError, match=r"did you mean storage\.aws_region\?"
    ):
        WriteOptions.parse({"path": "/t", "storag.aws_region": "eu-west-1"})
    parsed = WriteOptions.parse(
        {
            "path": "/t",
            "storage.aws_region": "eu-west-1",
            "properties.team": "x",
            "mergeschema": "true",
            "maxrowsperfile": "10",
            "checkpointlocation": "/c",
        }
    )
    assert parsed.storage_options == {"aws_region": "eu-west-1"}
    assert parsed.properties == {"team": "x"} and parsed.merge_schema
    assert parsed.max_rows_per_file == 10
    read = ReadOptions.parse({"path": "/t", "timestampasof": "2026-01-01T00:00:00Z"})
    assert read.timestamp == "2026-01-01T00:00:00Z"


def test_read_errors_are_typed_and_name_what_to_do(
    spark: Any, aws: EmbeddedAws, bucket: str, storage: dict[str, str]
) -> None:
    table = f"lancetx_{uuid.uuid4().hex[:10]}"
    create_table(boto3.client("dynamodb", **aws.client_kwargs()), table)
    uri = f"s3+ddb://{bucket}/t.lance?ddbTableName={table}"
    for _ in range(2):
        spark.range(0, 3, 1, 1).write.format("lancetx").mode("append").options(
            **spark_options(storage)
        ).save(uri)
    reader = spark.read.format("lancetx").options(**spark_options(storage))

    with pytest.raises(Exception) as missing_version:
        reader.option("version", 99).load(uri).count()
    text = str(missing_version.value)
    assert "VersionNotFoundError" in text and "version 99 of table" in text
    assert "the table has versions 1, 2" in text and "Not found" not in text

    no_table = f"s3+ddb://{bucket}/t.lance?ddbTableName=nope_{uuid.uuid4().hex[:6]}"
    with pytest.raises(Exception) as missing_table:
        reader.load(no_table).count()
    text = str(missing_table.value)
    assert "DynamoDBTableNotFoundError" in text and "does not exist" in text
    assert "lancetx-sync create-table" in text and "LanceError" not in text

    with pytest.raises(Exception, match=r"DatasetNotFoundError.*no Lance table"):
        reader.load(f"s3+ddb://{bucket}/none.lance?ddbTableName={table}").count()


def test_a_job_id_that_cannot_be_an_idempotency_key_is_refused_on_the_driver() -> None:
    """A job id (or stream id) is the commit's idempotency key: one over the key limit
    used to pass the parser, let every task write its files, and fail at the commit."""
    from lancetx.committing import MAX_IDEMPOTENCY_KEY_BYTES

    huge = "j" * (MAX_IDEMPOTENCY_KEY_BYTES + 1)
    for name in ("job_id", "stream_id"):
        with pytest.raises(
            SparkOptionError, match=rf"option '{name}'.*at most \d+ UTF-8 bytes"
        ) as info:
            WriteOptions.parse({"path": "/t", name: huge})
        assert len(str(info.value)) < 500
    odd = "job/1?x=%2F#key#ключ"
    assert WriteOptions.parse({"path": "/t", "job_id": odd}).job_id == odd
