"""s3+ddb:// parsing and the canonical base_uri, table-driven, checked against
what pylance 14 actually writes to DynamoDB."""

from __future__ import annotations

from typing import Any

import boto3
import lance
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.dynamodb.config import DynamoDBConfig, make_client
from lancetx.externalstore.dynamodb.store import create_table
from lancetx.externalstore.dynamodb.store_schema import STAMP_BASE_URI
from lancetx.externalstore.dynamodb.uri import (
    DynamoDBTableUri,
    canonical_base_uri,
    parse_ddb_uri,
    split_uri,
)
from lancetx.externalstore.errors import InvalidUriError

#: Runs against any real S3 + DynamoDB too: make test-localstack (LocalStack S3 + dynalite).
pytestmark = pytest.mark.integration

CANONICAL = [
    # (input, canonical base_uri)
    ("s3+ddb://bucket/ddbds?ddbTableName=T", "ddbds"),
    ("s3+ddb://bucket/a/b.lance?ddbTableName=T", "a/b.lance"),
    ("s3://bucket/a/b.lance", "a/b.lance"),
    ("s3a://bucket/a/b.lance", "a/b.lance"),
    ("s3n://bucket/a/b.lance", "a/b.lance"),
    ("S3A://bucket/a/b.lance", "a/b.lance"),
    ("s3://bucket/a/b.lance/", "a/b.lance"),
    ("s3://bucket/a/b.lance///", "a/b.lance"),
    ("s3://bucket//a//b.lance", "a/b.lance"),
    ("s3+ddb://bucket/a/b.lance/?ddbTableName=T", "a/b.lance"),
    ("s3://bucket/a/b.lance#fragment", "a/b.lance"),
    ("s3://bucket/a/b.lance?versionId=3", "a/b.lance"),
    ("s3://bucket", ""),
    ("s3://bucket/", ""),
    # dot segments resolve as a URL parser does (also %2e spellings)
    ("s3://bucket/a/./b/../c/t", "a/c/t"),
    ("s3://bucket/a/%2e%2E/t", "t"),
    ("s3://bucket/../t", "t"),
    ("s3://bucket/a//../t", "a/t"),
    # percent-decoding, as pylance 14 does
    ("s3://bucket/pct%20x/t", "pct x/t"),
    ("s3://bucket/a%2Fb/t", "a/b/t"),
    ("s3://bucket/%41bc", "Abc"),
    ("s3://bucket/pc%25", "pc%"),
    ("s3://bucket/bad%zz", "bad%zz"),
    ("s3://bucket/%E4%B8%AD%E6%96%87/t", "中文/t"),
    ("s3://bucket/中文/t", "中文/t"),
    ("s3://bucket/sp ace/t", "sp ace/t"),
    ("s3://bucket/plus+sign/t", "plus+sign/t"),
    ("s3://bucket/eq=&/t", "eq=&/t"),
    ("s3://bucket/back\\slash", "back\\slash"),
    (" s3://bucket/tab\tbed\n/t ", "tabbed/t"),
    # bare keys are keys: trimmed of empty segments, never decoded
    ("a/b.lance", "a/b.lance"),
    ("/a/b.lance/", "a/b.lance"),
    ("a//b.lance", "a/b.lance"),
    ("pct%20x/t", "pct%20x/t"),
    ("", ""),
]


@pytest.mark.parametrize(("uri", "expected"), CANONICAL)
def test_canonical_base_uri(uri: str, expected: str) -> None:
    assert canonical_base_uri(uri) == expected


@pytest.mark.parametrize(
    "bad",
    [
        "gs://bucket/a",
        "file:///tmp/a",
        "s3:///a/b",  # no bucket
        "s3://bucket/a/%2E%2E%2Fb",  # decodes to a '..' segment
        "s3://bucket/a%2F.%2Fb",
        "s3://bucket/ctl%01/t",
        "s3://bucket/%FF/t",  # not UTF-8
        "a/../b",
        "a/./b",
        "a\x00b",
    ],
)
def test_canonical_base_uri_rejects(bad: str) -> None:
    with pytest.raises(InvalidUriError):
        canonical_base_uri(bad)


def test_s3_schemes_agree() -> None:
    forms = [
        "s3://bkt/warehouse/t.lance",
        "s3a://bkt/warehouse/t.lance/",
        "s3+ddb://bkt/warehouse/t.lance?ddbTableName=T",
        "s3+ddb://bkt//warehouse/t.lance/?ddbTableName=T",
        "warehouse/t.lance",
        "/warehouse/t.lance/",
    ]
    assert {canonical_base_uri(f) for f in forms} == {"warehouse/t.lance"}
    assert split_uri("s3a://bkt/warehouse/t.lance/")[:2] == ("s3a", "bkt")


def test_parse_ddb_uri() -> None:
    parsed = parse_ddb_uri("s3+ddb://my-bucket/a/b.lance/?ddbTableName=lance_tables")
    assert parsed == DynamoDBTableUri(
        "my-bucket", "a/b.lance", "lance_tables", "s3://my-bucket/a/b.lance"
    )
    assert parsed.base_uri == "a/b.lance"
    assert parsed.uri == "s3+ddb://my-bucket/a/b.lance?ddbTableName=lance_tables"
    # Lance accepts these too: empty pairs are skipped, the fragment is not the query.
    for ok in (
        "s3+ddb://b/t?ddbTableName=T&",
        "s3+ddb://b/t?&ddbTableName=T",
        "s3+ddb://b/t?ddbTableName=T#frag",
        "S3+DDB://b/t?ddbTableName=T",
    ):
        assert parse_ddb_uri(ok).table_name == "T"
    encoded = parse_ddb_uri("s3+ddb://b/x%20y/%E4%B8%AD?ddbTableName=T")
    assert encoded.base_key == "x y/中"
    assert encoded.s3_uri == "s3://b/x%20y/%E4%B8%AD"


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("s3://b/t?ddbTableName=T", r"s3\+ddb://"),
        ("s3+ddb://b/t", "exactly one"),
        ("s3+ddb://b/t?", "exactly one"),
        ("s3+ddb://b/t?ddbTableName=T&x=1", "exactly one"),
        ("s3+ddb://b/t?table=T", "exactly one"),
        ("s3+ddb://b/t?ddbtablename=T", "exactly one"),
        ("s3+ddb://b/t?ddbTableName=", "non-empty"),
        ("s3+ddb://b/t?ddbTableName", "non-empty"),
        ("s3+ddb://b/t?ddbTableName=%54", "may only contain"),  # Lance refuses escapes too
        ("s3+ddb://b/t?ddbTableName=a+b", "may only contain"),
        ("s3+ddb://b?ddbTableName=T", "bucket root"),
        ("s3+ddb://b/x/..?ddbTableName=T", "bucket root"),
    ],
)
def test_parse_ddb_uri_rejects(bad: str, why: str) -> None:
    with pytest.raises(InvalidUriError, match=why):
        parse_ddb_uri(bad)


_SEGMENT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="/"),
    min_size=1,
    max_size=8,
).filter(lambda s: s not in (".", ".."))


@given(st.lists(_SEGMENT, min_size=1, max_size=4), st.sampled_from(["s3", "s3a", "s3+ddb"]))
def test_encoded_uris_round_trip(segments: list[str], scheme: str) -> None:
    key = "/".join(segments)
    parsed = parse_ddb_uri(DynamoDBTableUri("bkt", key, "T", "").uri)
    assert parsed.base_key == key
    assert canonical_base_uri(parsed.s3_uri.replace("s3://", f"{scheme}://", 1)) == key
    assert canonical_base_uri(key) == key


# ------------------------------------------------------------------------- pylance


PYLANCE_PATHS = [
    "ddbds",
    "a/b.lance",
    "sp ace/t",
    "pct%20x/t",
    "中文/t",
    "eq=&/t",
    "a/./b/../c/t",
    "a%2Fb2/t",
    "%41bc/t",
]


def test_pylance_writes_the_canonical_base_uri(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    options = aws.pylance_storage_options()
    client = make_client(DynamoDBConfig.from_options(options))
    create_table(client, ddb_table_name)
    expected: dict[str, str] = {}
    for path in PYLANCE_PATHS:
        uri = f"s3+ddb://{bucket}/{path}?ddbTableName={ddb_table_name}"
        lance.write_dataset(pa.table({"x": [1]}), uri, storage_options=options)
        expected[canonical_base_uri(uri)] = path
    # The same table through a trailing slash: pylance sees it as existing.
    with pytest.raises(Exception, match="already exists"):
        lance.write_dataset(
            pa.table({"x": [1]}),
            f"s3+ddb://{bucket}/a/b.lance/?ddbTableName={ddb_table_name}",
            storage_options=options,
        )
    plain = boto3.client("dynamodb", **aws.client_kwargs("dynamodb"))  # lancetx's has no Scan
    items: list[dict[str, Any]] = plain.scan(TableName=ddb_table_name, ConsistentRead=True)["Items"]
    items = [i for i in items if i["base_uri"]["S"] != STAMP_BASE_URI]  # create_table's
    written = {item["base_uri"]["S"] for item in items}
    assert written == set(expected), (written, expected)
    assert "ddbds" in written and "a/b.lance" in written and "pct x/t" in written
    for item in items:
        assert item["path"]["S"].startswith(item["base_uri"]["S"] + "/_versions/")
