"""No secret in any message, repr, log record or CLI output.

Distinctive fake secrets (``SECRETxyz…``, ``TOKENxyz…``) go through every entry
point — the library's open and verbs (sync and async), the config objects, the
operator tools' table, the CLI in text and ``--json`` and at
``LANCETX_LOG_LEVEL=DEBUG`` (botocore then prints every request) — and everything
produced is searched for them. The embedded server accepts any credentials, so
the same fake secrets also make real requests. Spark's entry points are in
``tests/spark/test_spark_secrets.py``.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
import uuid
from collections.abc import Iterable

import pyarrow as pa
import pytest
from cli_helpers import make_table, run_cli

import lancetx
import lancetx.aio
from lancetx.commit.errors import StorageOptionError
from lancetx.commit.storage.s3store import S3Config
from lancetx.commit.storage.secrets import (
    REDACTED,
    RedactingFilter,
    is_secret_option,
    redact_options,
)
from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.dynamodb.config import DynamoDBConfig
from lancetx.ops.table import open_table

SECRET = f"SECRETxyz{uuid.uuid4().hex}"
OTHER_SECRET = f"SECRETxyz{uuid.uuid4().hex}"
TOKEN = f"TOKENxyz{uuid.uuid4().hex}"
OTHER_TOKEN = f"TOKENxyz{uuid.uuid4().hex}"
ALL = (SECRET, OTHER_SECRET, TOKEN, OTHER_TOKEN)


def assert_clean(*texts: str, where: str = "") -> None:
    for text in texts:
        for secret in ALL:
            assert secret not in text, f"{where}: secret {secret[:12]}… printed in {text[:2000]}"
        assert "xyz" not in text.replace("AKIDxyz", ""), f"{where}: {text[:2000]}"


def exception_texts(exc: BaseException) -> list[str]:
    return [str(exc), repr(exc), "".join(traceback.format_exception(exc))]


def with_secrets(aws: EmbeddedAws, **extra: str) -> dict[str, str]:
    options = aws.pylance_storage_options()
    options.update(
        aws_access_key_id="AKIDxyz", aws_secret_access_key=SECRET, aws_session_token=TOKEN
    )
    options.update(extra)
    return options


CONFLICTS = {
    "secret": {"secret_access_key": OTHER_SECRET},
    "token": {"token": OTHER_TOKEN},
}


@pytest.mark.parametrize("spelling", sorted(CONFLICTS))
def test_a_secret_under_two_spellings_is_refused_without_printing_either(
    aws: EmbeddedAws, bucket: str, spelling: str
) -> None:
    options = with_secrets(aws, **CONFLICTS[spelling])
    uri = f"s3+ddb://{bucket}/t.lance?ddbTableName=nothing_{uuid.uuid4().hex[:6]}"
    raised: list[BaseException] = []
    for attempt in (
        lambda: lancetx.open(uri, storage_options=options),
        lambda: lancetx.write_table(uri, pa.table({"a": [1]}), storage_options=options),
        lambda: lancetx.connect(uri, options),
        lambda: S3Config.from_options(options),
        lambda: open_table(uri, options),
        lambda: asyncio.run(lancetx.aio.open(uri, storage_options=options)),
    ):
        with pytest.raises(StorageOptionError) as caught:
            attempt()
        raised.append(caught.value)
    for exc in raised:
        assert_clean(*exception_texts(exc), where=type(exc).__name__)
        assert "not shown" in str(exc)  # says why it does not show them


def test_reprs_hide_secrets_and_lancetx_logs_carry_none(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    options = with_secrets(aws)
    table = make_table(aws, bucket, ddb_table_name, versions=1)
    caplog.set_level(logging.DEBUG)
    opened = lancetx.open(table.uri, storage_options=options)
    opened.append(pa.table({"writer": ["s"], "seq": [9], "i": [99]}))
    opened.delete("i = 99")
    state = opened._state
    objects: Iterable[object] = (
        opened,
        state,
        state.conn,
        opened.last_commit,
        S3Config.from_options(options),
        DynamoDBConfig.from_options(options),
        open_table(table.uri, options),
    )
    assert_clean(*(repr(o) for o in objects), where="repr")
    with pytest.raises(lancetx.LancetxError) as bad_region:
        lancetx.open(table.uri, storage_options={**options, "aws_region": "not a region"})
    assert_clean(*exception_texts(bad_region.value), where="bad region")
    records = [r for r in caplog.records if r.name.startswith(("lancetx", "pyspark_lancetx"))]
    assert_clean(*(r.getMessage() for r in records), where="lancetx log record")


def test_the_redacting_filter_scrubs_botocore_request_logs() -> None:
    """The three shapes botocore prints a session token in at DEBUG."""
    record = logging.LogRecord(
        "botocore.endpoint", logging.DEBUG, __file__, 1,
        "Sending: headers={'X-Amz-Security-Token': b'%s', 'Authorization': b'AWS4-HMAC-SHA256 "
        "Credential=AKID/x, Signature=0123456789abcdef0123456789abcdef'}\n"
        "x-amz-security-token:%s\n?X-Amz-Security-Token=%s&x=1",
        ("FROMAPROFILE1", "FROMAPROFILE2", "FROMAPROFILE3"), None,
    )  # fmt: skip
    assert RedactingFilter().filter(record)
    text = record.getMessage()
    assert "FROMAPROFILE" not in text and "0123456789abcdef" not in text
    assert text.count(REDACTED) == 4
    assert is_secret_option("AWS_SECRET_ACCESS_KEY_DYNAMODB") and is_secret_option("token")
    assert not is_secret_option("aws_access_key_id") and not is_secret_option("aws_endpoint")
    assert redact_options({"aws_session_token": TOKEN, "aws_region": "r"}) == {
        "aws_session_token": REDACTED,
        "aws_region": "r",
    }


def _cli_options(options: dict[str, str]) -> list[str]:
    return [arg for k, v in options.items() for arg in ("-o", f"{k}={v}")]


def test_cli_output_never_shows_a_secret(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    table = make_table(aws, bucket, ddb_table_name, versions=1)
    conflicting = _cli_options(with_secrets(aws, secret_access_key=OTHER_SECRET))
    # Every command opens its table the same way: one in text, one in JSON.
    for command, json in (("status", ()), ("doctor", ("--json",))):
        out = run_cli(aws, command, table.uri, *json, *conflicting)
        assert out.code == 2, out.stdout + out.stderr  # conflicting options: a usage error
        assert "StorageOptionError" in out.stdout or "storage options" in out.stderr
        assert_clean(out.stdout, out.stderr, where=f"{command} {json}")


def test_cli_debug_logs_never_show_a_secret(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """At LANCETX_LOG_LEVEL=DEBUG botocore prints every request it sends."""
    table = make_table(aws, bucket, ddb_table_name, versions=1)
    debug = {"LANCETX_LOG_LEVEL": "DEBUG"}
    # Through -o: every request carries the token; doctor's probes write and delete.
    out = run_cli(aws, "doctor", table.uri, *_cli_options(with_secrets(aws)), extra_env=debug)
    assert "DEBUG botocore" in out.stderr and "x-amz-security-token" in out.stderr.lower()
    assert_clean(out.stdout, out.stderr, where="doctor at DEBUG")
    # Through the environment, as most deployments hand them over.
    env = {**debug, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_SESSION_TOKEN": TOKEN}
    out = run_cli(aws, "verify", table.uri, "--json", extra_env=env)
    assert out.code == 0, out.stdout + out.stderr
    assert "DEBUG botocore" in out.stderr
    assert_clean(out.stdout, out.stderr, where="verify with secrets in the environment")
