"""``s3+ddb://`` URIs and the one canonical form of ``base_uri``.

Parsing ``s3+ddb://bucket/path?ddbTableName=T`` follows Lance's
``commit_handler_from_url`` (``rust/lance-table/src/io/commit.rs``): exactly one
query pair, whose key is ``ddbTableName`` and whose value is non-empty and needs
no decoding (Lance only accepts borrowed, i.e. undecoded, query strings).

Canonical ``base_uri``
----------------------
``base_uri`` is the key of a table in the DynamoDB table; Lance and lancetx
writers exclude each other only if they compute it byte for byte alike
(delta-rs learned this with trailing slashes and ``s3`` vs ``s3a``). It is the
table's path **inside the bucket**, as pylance 14 computes it (object_store
``Path::from_url_path`` of the parsed URL's path):

1. A URI (``s3://``, ``s3a://``, ``s3n://``, ``s3+ddb://``; the scheme is
   case-insensitive and does not matter) is parsed as a URL: leading and
   trailing spaces/control characters and every tab/newline are dropped, the
   bucket (authority), query and fragment are removed, and ``.`` / ``..``
   segments (also written ``%2e``) are resolved as a URL parser does.
2. The path is then **percent-decoded** (UTF-8; ``%20`` → space, ``%2F`` → a
   ``/`` that separates segments; an invalid escape such as ``%zz`` or a lone
   ``%`` stays literal).
3. Empty segments are dropped: no leading or trailing ``/``, repeated ``/``
   collapsed. (Lance refuses a path with an empty segment; we accept it and
   use the collapsed form.)
4. A segment that is ``.`` or ``..`` after decoding, or any ASCII control
   character, is an error (Lance refuses both).

A bare key (no ``scheme://``, e.g. ``a/b.lance`` or ``/a/b.lance/``) is
already a decoded key: steps 3 and 4 only, no percent-decoding.

So ``s3://b/a/b.lance``, ``s3a://b/a/b.lance/``, ``s3+ddb://b//a/b.lance?ddbTableName=T``
and ``a/b.lance`` all give ``a/b.lance``; ``s3+ddb://b/x%20y?ddbTableName=T`` gives
``x y`` (pylance 14.0.2 writes exactly that; measured). A table at the bucket
root has the empty base_uri, which DynamoDB cannot store as a key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote, unquote_to_bytes

from lancetx.externalstore.errors import InvalidUriError

__all__ = [
    "DDB_QUERY_KEY",
    "S3_SCHEMES",
    "DynamoDBTableUri",
    "canonical_base_uri",
    "parse_ddb_uri",
    "split_uri",
]

#: Lance's query key naming the DynamoDB table.
DDB_QUERY_KEY = "ddbTableName"
#: Schemes whose path is a bucket-relative key.
S3_SCHEMES = frozenset({"s3", "s3a", "s3n", "s3+ddb"})

_URI_RE = re.compile(
    r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<authority>[^/?#]*)(?P<path>[^?#]*)(?:\?(?P<query>[^#]*))?(?:#.*)?$",
    re.DOTALL,
)
_TABLE_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_DOUBLE_DOT = frozenset({"..", ".%2e", "%2e.", "%2e%2e"})
_SINGLE_DOT = frozenset({".", "%2e"})
_C0_AND_SPACE = "".join(chr(c) for c in range(0x21))
# RFC 3986 pchar minus the unreserved set (always safe), plus "/" between segments.
_PATH_SAFE = "/!$&'()*+,;=:@"


@dataclass(frozen=True)
class DynamoDBTableUri:
    """A parsed ``s3+ddb://bucket/base_key?ddbTableName=table_name``.

    ``base_key`` is the canonical ``base_uri``; ``s3_uri`` the plain
    ``s3://bucket/base_key`` of the same table (percent-encoded where needed,
    so parsing it gives ``base_key`` back).
    """

    bucket: str
    base_key: str
    table_name: str
    s3_uri: str

    @property
    def base_uri(self) -> str:
        """The DynamoDB ``base_uri`` of the table (same as ``base_key``)."""
        return self.base_key

    @property
    def uri(self) -> str:
        """The ``s3+ddb://`` URI in canonical form."""
        return (
            f"s3+ddb://{self.bucket}/{_encode_key(self.base_key)}?{DDB_QUERY_KEY}={self.table_name}"
        )


def _encode_key(key: str) -> str:
    return quote(key, safe=_PATH_SAFE)


def _whatwg_trim(uri: str) -> str:
    # A URL parser strips C0 controls and spaces at both ends and drops every tab/newline.
    return re.sub(r"[\t\n\r]", "", uri.strip(_C0_AND_SPACE))


def _resolve_dot_segments(path: str) -> list[str]:
    """URL-parser dot-segment resolution; empty segments are kept (and popped by ``..``)."""
    segments = path.split("/")
    if path.startswith("/"):
        segments = segments[1:]
    out: list[str] = []
    for segment in segments:
        lowered = segment.lower()
        if lowered in _DOUBLE_DOT:
            if out:
                out.pop()
        elif lowered not in _SINGLE_DOT:
            out.append(segment)
    return out


def _normalize_key(original: str, key: str) -> str:
    if _CONTROL_RE.search(key):
        raise InvalidUriError(original, "the path contains a control character")
    segments = [s for s in key.split("/") if s]
    for segment in segments:
        if segment in (".", ".."):
            raise InvalidUriError(original, f"the path has a {segment!r} segment after decoding")
    return "/".join(segments)


def split_uri(uri: str) -> tuple[str, str, str, str | None]:
    """``(scheme, bucket, canonical base key, raw query or None)`` of an S3-family URI."""
    trimmed = _whatwg_trim(uri)
    match = _URI_RE.match(trimmed)
    if match is None:
        raise InvalidUriError(uri, "expected scheme://bucket/path")
    scheme = match.group("scheme").lower()
    if scheme not in S3_SCHEMES:
        raise InvalidUriError(uri, f"scheme {scheme!r} is not one of {sorted(S3_SCHEMES)}")
    bucket = match.group("authority")
    if not bucket:
        raise InvalidUriError(uri, "no bucket")
    resolved = "/".join(_resolve_dot_segments(match.group("path")))
    try:
        decoded = unquote_to_bytes(resolved).decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidUriError(uri, "the percent-decoded path is not UTF-8") from None
    return scheme, bucket, _normalize_key(uri, decoded), match.group("query")


#: Table paths lancetx refuses: its own DynamoDB keys are ``<path>#lancetx-…`` (a
#: table's idempotency keys, its commit queue) and ``__lancetx_…`` (a moved record, the
#: layout stamp). A table at such a path would share another table's items.
RESERVED_MARK = "#lancetx-"
RESERVED_PREFIX = "__lancetx_"


def canonical_base_uri(path_or_uri: str) -> str:
    """The canonical ``base_uri`` of a table URI or bucket-relative key (module docstring).

    Raises InvalidUriError for other schemes, control characters, or ``.``/``..``
    segments that survive decoding.
    """
    if "://" in path_or_uri:
        return split_uri(path_or_uri)[2]
    return _normalize_key(path_or_uri, path_or_uri)


def parse_ddb_uri(uri: str) -> DynamoDBTableUri:
    """Parse ``s3+ddb://bucket/path?ddbTableName=T`` exactly as Lance accepts it.

    Raises InvalidUriError for another scheme, anything but one
    ``ddbTableName=<non-empty>`` query pair, a table name that needs decoding
    or that DynamoDB would refuse, and a table at the bucket root (DynamoDB
    keys cannot be empty).
    """
    scheme, bucket, base_key, query = split_uri(uri)
    if scheme != "s3+ddb":
        raise InvalidUriError(uri, f"expected the s3+ddb:// scheme, got {scheme}://")
    pairs = [p for p in (query or "").split("&") if p]
    if len(pairs) != 1:
        raise InvalidUriError(
            uri, f"s3+ddb:// expects exactly one query pair {DDB_QUERY_KEY}=<table>"
        )
    key, _, value = pairs[0].partition("=")
    if key != DDB_QUERY_KEY:
        raise InvalidUriError(
            uri, f"s3+ddb:// expects exactly one query pair {DDB_QUERY_KEY}=<table>, got {key!r}"
        )
    if not value:
        raise InvalidUriError(uri, "s3+ddb:// requires a non-empty DynamoDB table name")
    if not _TABLE_NAME_RE.match(value):
        raise InvalidUriError(
            uri, f"DynamoDB table name {value!r} may only contain letters, digits, '_', '-' and '.'"
        )
    if not base_key:
        raise InvalidUriError(
            uri,
            "a table at the bucket root cannot be keyed in DynamoDB (empty base_uri); use a sub-path",
        )
    if base_key.startswith(RESERVED_PREFIX) or RESERVED_MARK in base_key:
        raise InvalidUriError(
            uri,
            f"the path {base_key!r} is reserved: lancetx keeps its own DynamoDB items under "
            f"keys of this shape (a table's idempotency keys under '<path>#lancetx-keys', "
            "its commit queue, its moved record under '__lancetx_moved__/<path>', the layout "
            "stamp '__lancetx_schema__'), so a table here would share another table's items "
            f"and permissions; use a path without {RESERVED_MARK!r} that does not start with "
            f"{RESERVED_PREFIX!r}",
        )
    return DynamoDBTableUri(
        bucket=bucket,
        base_key=base_key,
        table_name=value,
        s3_uri=f"s3://{bucket}/{_encode_key(base_key)}",
    )
