"""Ages an impatient operator types: ``--older-than inf``, ``1e309``, ``99999999999w``
used to crash ``gc`` and ``cleanup`` with a raw ``OverflowError`` traceback (and ``nan``
said "cannot convert float NaN to integer"; ``1000000d`` passed, then overflowed once
subtracted from today's date); each is a usage error (exit 2) that says what an age
looks like."""

from __future__ import annotations

from datetime import timedelta

import pytest
from cli_helpers import run_cli

from lancetx.externalstore.embedded import EmbeddedAws
from lancetx.ops.gc import parse_age

URI = "s3+ddb://b/t.lance?ddbTableName=T"


@pytest.mark.parametrize("text", ["inf", "-inf", "nan", "1e309", "1e20d", "99999999999w", "1000000d", "7x", ""])
def test_parse_age_refuses_what_is_no_age(text: str) -> None:
    with pytest.raises(ValueError, match="is not an age|too large|negative"):
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
