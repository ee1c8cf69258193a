"""Arguments an impatient operator types wrong, each a usage error (exit 2).

Ages: ``--older-than inf``, ``1e309``, ``99999999999w`` used to crash ``gc`` and
``cleanup`` with a raw ``OverflowError`` traceback (``nan`` said "cannot convert float
NaN to integer"; ``1000000d`` passed, then overflowed once subtracted from today's
date); each now says what an age looks like. A mistyped table path for ``status``,
a DynamoDB table name ``create-table`` cannot use: below."""

from __future__ import annotations

from datetime import timedelta

import boto3
import pytest
from cli_helpers import make_table, run_cli

from lancetx.demo.embedded import EmbeddedAws
from lancetx.ops.gc import parse_age

URI = "s3+ddb://b/t.lance?ddbTableName=T"


@pytest.mark.parametrize(
    "text", ["inf", "-inf", "nan", "1e309", "1e20d", "99999999999w", "1000000d", "7x", ""]
)
def test_parse_age_refuses_what_is_no_age(text: str) -> None:
    with pytest.raises(ValueError, match=r"is not an age|too large|negative"):
        parse_age(text)


def test_parse_age_reads_ages() -> None:
    assert parse_age("7d") == timedelta(days=7)
    assert parse_age(" 90 ") == timedelta(seconds=90)
    assert parse_age("1.5h") == timedelta(minutes=90)


def test_the_cli_reports_an_absurd_age_as_a_usage_error(aws: EmbeddedAws) -> None:
    for args in (
        ("gc", URI, "--older-than", "inf"),
        ("gc", URI, "--older-than", "1000000d"),
        ("cleanup", URI, "--keep-versions", "2", "--items-older-than", "99999999999w"),
    ):
        done = run_cli(aws, *args)
        assert done.code == 2, (args, done.stderr)
        assert "Traceback" not in done.stderr and "age" in done.stderr, done.stderr


def test_status_of_a_path_never_written_is_a_usage_error(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """It used to print an empty status (no latest version, 0 items) and exit 0."""
    table = make_table(aws, bucket, ddb_table_name, versions=1)
    done = run_cli(aws, "status", table.uri.replace("t.lance", "t-typo.lance"))
    assert done.code == 2, done.stdout + done.stderr
    assert "no Lance table at" in done.stderr and done.stdout == ""
    assert run_cli(aws, "status", table.uri).code == 0


def test_create_table_refuses_a_name_dynamodb_and_uris_refuse(aws: EmbeddedAws) -> None:
    """``create-table 'bad name!'`` used to create it (the embedded server is lenient;
    DynamoDB is not, and no s3+ddb:// URI can name it)."""
    for name in ("bad name!", "ab"):
        done = run_cli(aws, "create-table", name)
        assert done.code == 2, (name, done.stdout + done.stderr)
        assert "3 to 255" in done.stderr, done.stderr
    names = boto3.client("dynamodb", **aws.client_kwargs()).list_tables()["TableNames"]
    assert "bad name!" not in names and "ab" not in names
