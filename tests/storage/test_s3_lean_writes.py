"""Lean writes (``commit/storage/s3_lean/writes.py``): a store's ``put``, ``copy`` and
``delete`` send what botocore would send, without botocore's pipeline, and leave every
answer but a plain success to botocore's call.

* each lean write is botocore's request byte for byte (URL, headers, signature, body:
  the CRC32 header over HTTP, ``aws-chunked`` with a trailing checksum over HTTPS, no
  checksum with ``when_required``, a session token, virtual-hosted addressing);
* against the embedded server each write is one request, seen by the client's
  ``before-send`` handlers (request counters, guards) and never by botocore's call;
* an error status, a reset, a lost answer (the write landed), a copy answered 200 with
  an error in its body: botocore's call follows and its answer is the definitive one
  (a copy whose source went away meanwhile: botocore's not-found);
* in a commit, a lost answer to each of its four lean writes costs one request more and
  nothing else; a definitive failure after a lost lean answer is botocore's, and the
  file the lean write may have left is kept (nothing decides on a lean outcome);
* the asyncio store does the same.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import lance
import pyarrow as pa
import pytest
from protocol_helpers import ddb_uri, ensure_ddb_table
from s3_helpers import s3_config

import lancetx
from lancetx.commit.errors import ObjectNotFoundError, ObjectStoreError
from lancetx.commit.storage.s3_lean.writes import (
    AsyncLeanWrites,
    LeanWrites,
    lean_writes,
    prepare_copy,
    prepare_delete,
    prepare_put,
)
from lancetx.commit.storage.s3store import S3Config, S3ObjectStore
from lancetx.commit.storage.s3store_async import AsyncS3ObjectStore
from lancetx.demo.embedded import (
    EmbeddedAws,
    InterceptedRequest,
    InterceptedResponse,
)

pytestmark = pytest.mark.embedded_only

KEYS = ("t/_versions/18446744073709551614.manifest", "t/a b+c~d=\u00e9%/x.manifest")
BODIES = (b"", b"hello", bytes(range(256)) * 4100)  # the last spans two aws-chunked chunks
S3_ERROR = b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>InternalError</Code></Error>"


def config(endpoint: str, **overrides: Any) -> S3Config:
    return s3_config(endpoint, **{"max_attempts": 1, **overrides})


# ------------------------------------------------------------------ byte for byte


class _Stop(Exception):
    def __init__(self, request: Any) -> None:
        super().__init__("stopped before sending")
        self.request = request


def _botocores(client: Any, operation: str, **params: Any) -> Any:
    """The prepared request botocore would send for ``operation`` (never sent)."""

    def stop(request: Any, **_: Any) -> None:
        raise _Stop(request)

    client.meta.events.register_first("before-send.s3", stop, unique_id="test-stop")
    try:
        getattr(client, operation)(**params)
    except _Stop as stopped:
        return stopped.request
    finally:
        client.meta.events.unregister("before-send.s3", unique_id="test-stop")
    raise AssertionError("botocore sent nothing")


def _body(request: Any) -> bytes:
    body = request.body
    if body is None:
        return b""
    if isinstance(body, bytes):
        return body
    return bytes(body.read())


def _text(value: Any) -> str:
    # botocore's prepared headers hold bytes; the same bytes go on the wire.
    return value.decode() if isinstance(value, bytes) else str(value)


#: botocore's retry bookkeeping, added after signing (so unsigned: the signatures
#: compared below are equal); a lean request is a first attempt and leaves them out.
RETRY_HEADERS = ("amz-sdk-invocation-id", "amz-sdk-request")


def _same(theirs: Any, ours: Any) -> None:
    assert ours.method == theirs.method
    assert ours.url == theirs.url
    expected = {k.lower(): _text(v) for k, v in theirs.headers.items()}
    for name in RETRY_HEADERS:
        expected.pop(name, None)
    assert {k.lower(): _text(v) for k, v in ours.headers.items()} == expected
    assert _body(ours) == _body(theirs)


@pytest.mark.parametrize(
    "settings",
    [
        {"endpoint_url": "http://127.0.0.1:9"},
        {"endpoint_url": "https://s3.eu-west-1.amazonaws.com", "region": "eu-west-1"},
        {"endpoint_url": "http://127.0.0.1:9", "request_checksum_calculation": "when_required"},
        {
            "endpoint_url": "https://s3.amazonaws.com",
            "request_checksum_calculation": "when_required",
        },
        {"endpoint_url": "http://[::1]:9000", "session_token": "a session token"},
        {
            "endpoint_url": "https://s3.us-west-2.amazonaws.com",
            "region": "us-west-2",
            "addressing_style": "virtual",
        },
    ],
    ids=["http", "https-trailer", "http-no-checksum", "https-no-checksum", "token", "virtual"],
)
def test_each_lean_write_is_botocores_byte_for_byte(settings: dict[str, Any]) -> None:
    endpoint = settings.pop("endpoint_url")
    client = config(endpoint, **settings).create_client()
    bucket = "bkt"
    put, copy, delete = LeanWrites(client, bucket).learned()
    assert put is not None and copy is not None and delete is not None
    frozen = client._get_credentials().get_frozen_credentials()  # type: ignore[attr-defined]
    for key in KEYS:
        for data in BODIES:
            theirs = _botocores(client, "put_object", Bucket=bucket, Key=key, Body=data)
            ours = prepare_put(put, key, data, frozen, _text(theirs.headers["X-Amz-Date"]))
            _same(theirs, ours)
        source = {"Bucket": bucket, "Key": key}
        theirs = _botocores(
            client, "copy_object", Bucket=bucket, Key=key + ".final", CopySource=source
        )
        _same(
            theirs,
            prepare_copy(
                copy, bucket, key, key + ".final", frozen, _text(theirs.headers["X-Amz-Date"])
            ),
        )
        theirs = _botocores(client, "delete_object", Bucket=bucket, Key=key)
        _same(theirs, prepare_delete(delete, key, frozen, _text(theirs.headers["X-Amz-Date"])))


# -------------------------------------------------------------- against the server


class Calls:
    """botocore's ``before-send`` (every request, lean ones included) and
    ``before-call`` (botocore's own calls only) events on a client, by operation."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.called: list[str] = []

    def attach(self, events: Any) -> None:
        events.register("before-send.s3", self._sent, unique_id="test-sent")
        events.register("before-call.s3", self._called, unique_id="test-called")

    def _sent(self, event_name: str, **_: Any) -> None:
        self.sent.append(event_name.rsplit(".", 1)[-1])

    def _called(self, event_name: str, **_: Any) -> None:
        self.called.append(event_name.rsplit(".", 1)[-1])

    def clear(self) -> None:
        self.sent.clear()
        self.called.clear()


@pytest.fixture
def store(aws: EmbeddedAws, bucket: str) -> S3ObjectStore:
    s = S3ObjectStore(bucket, config=config(aws.endpoint))
    # Learned first: learning makes botocore's call (stopped before it is sent).
    assert all(lean_writes(s.client, bucket).learned())
    return s


@pytest.fixture
def calls(store: S3ObjectStore) -> Calls:
    found = Calls()
    found.attach(store.client.meta.events)
    return found


def test_each_write_is_one_lean_request_the_counters_see(
    store: S3ObjectStore, calls: Calls, seen: list[InterceptedRequest]
) -> None:
    for key in KEYS:
        for data in BODIES:
            seen.clear()
            calls.clear()
            written = store.put(key, data)
            assert written.size == len(data) and written.etag
            copied = store.copy(key, key + ".final")
            assert copied.etag == written.etag
            store.delete(key)
            assert [(r.method, r.path.rsplit("/", 1)[-1]) for r in seen] == [
                ("PUT", key.rsplit("/", 1)[-1]),
                ("PUT", key.rsplit("/", 1)[-1] + ".final"),
                ("DELETE", key.rsplit("/", 1)[-1]),
            ]
            assert all(r.headers["user-agent"].startswith("lancetx/") for r in seen)
            # Request counters and guards see each; botocore's pipeline none.
            assert calls.sent == ["PutObject", "CopyObject", "DeleteObject"]
            assert calls.called == []
            assert store.get(key + ".final") == data
            with pytest.raises(ObjectNotFoundError):
                store.head(key)


class FirstOf:
    """An interceptor answering the first request matching ``match`` with ``answer``."""

    def __init__(
        self, match: Callable[[InterceptedRequest], bool], answer: InterceptedResponse
    ) -> None:
        self.match = match
        self.answer = answer
        self.requests: list[InterceptedRequest] = []
        self._lock = threading.Lock()

    def __call__(self, request: InterceptedRequest) -> InterceptedResponse | None:
        if not self.match(request):
            return None
        with self._lock:
            self.requests.append(request)
            first = len(self.requests) == 1
        return self.answer if first else None


FAULTS = {
    "500": InterceptedResponse(500, S3_ERROR, [("Content-Type", "application/xml")]),
    "403": InterceptedResponse(403, b"<Error><Code>AccessDenied</Code></Error>"),
    "reset": InterceptedResponse(200, b"", reset=True),
    "landed-then-reset": InterceptedResponse(200, b"", after_forwarding=True, reset=True),
    "landed-then-500": InterceptedResponse(500, S3_ERROR, after_forwarding=True),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_anything_but_a_plain_success_is_left_to_botocore(
    aws: EmbeddedAws, store: S3ObjectStore, calls: Calls, fault: str
) -> None:
    """With one attempt for botocore (``max_attempts=1``), the only way these writes
    succeed is the lean attempt failing and botocore's call then succeeding."""
    key = KEYS[1]
    for operation, method, write in (
        ("PutObject", "PUT", lambda: store.put(key, b"bytes")),
        ("CopyObject", "PUT", lambda: store.copy(key, key + ".final")),
        ("DeleteObject", "DELETE", lambda: store.delete(key)),
    ):
        calls.clear()
        injected = FirstOf(lambda r, method=method: r.method == method, FAULTS[fault])
        aws.set_interceptor(injected)
        try:
            write()
        finally:
            aws.set_interceptor(None)
        assert len(injected.requests) == 2, operation
        assert calls.sent == [operation, operation]
        assert calls.called == [operation]  # botocore's own, after the lean one
    assert store.get(key + ".final") == b"bytes"
    with pytest.raises(ObjectNotFoundError):
        store.head(key)


def test_a_copy_answered_200_with_an_error_is_no_success(
    aws: EmbeddedAws, store: S3ObjectStore, calls: Calls
) -> None:
    store.put(KEYS[0], b"source")
    calls.clear()
    injected = FirstOf(lambda r: r.method == "PUT", InterceptedResponse(200, S3_ERROR))
    aws.set_interceptor(injected)
    try:
        copied = store.copy(KEYS[0], "t/final")
    finally:
        aws.set_interceptor(None)
    assert calls.called == ["CopyObject"] and len(injected.requests) == 2
    assert copied.etag == store.head(KEYS[0]).etag
    assert store.get("t/final") == b"source"


def test_a_copy_whose_source_went_away_gets_botocores_not_found(
    aws: EmbeddedAws, store: S3ObjectStore, s3_client: Any, calls: Calls
) -> None:
    """The lean copy's answer is lost; before botocore's copy, another finalizer has
    finished the version and deleted the staged object: botocore's answer (the source
    is gone) is what the caller sees, and nothing is written under the final name."""
    staged, final = "t/_versions/2.manifest-staged", "t/_versions/2.manifest"
    store.put(staged, b"manifest")
    calls.clear()

    def finish_elsewhere() -> None:
        s3_client.delete_object(Bucket=store.bucket, Key=staged)

    injected = FirstOf(
        lambda r: (
            r.method == "PUT"
            and r.path.endswith(final)
            and r.headers.get("user-agent", "").startswith("lancetx/")
        ),
        InterceptedResponse(200, b"", reset=True, then=finish_elsewhere),
    )
    aws.set_interceptor(injected)
    try:
        with pytest.raises(ObjectNotFoundError, match="copy source not found"):
            store.copy(staged, final)
    finally:
        aws.set_interceptor(None)
    assert calls.called == ["CopyObject"]
    with pytest.raises(ObjectNotFoundError):
        store.head(final)


# ------------------------------------------------------------------- in a commit


def _rows(start: int, n: int = 10) -> pa.Table:
    return pa.table({"id": pa.array(range(start, start + n), pa.int64())})


@pytest.fixture
def table(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> Iterator[tuple[str, dict[str, str]]]:
    options = {**aws.pylance_storage_options(), "max_attempts": "1"}
    ensure_ddb_table(options, ddb_table_name)
    uri = ddb_uri(bucket, "t.lance", ddb_table_name)
    lancetx.write_table(uri, _rows(0), storage_options=options)
    try:
        yield uri, options
    finally:
        aws.set_interceptor(None)


def _objects(s3: Any, bucket: str) -> set[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return {o["Key"] for page in pages for o in page.get("Contents", [])}


def _is_lancetx(r: InterceptedRequest) -> bool:
    return r.service == "s3" and r.headers.get("user-agent", "").startswith("lancetx/")


COMMIT_WRITES: dict[str, Callable[[InterceptedRequest], bool]] = {
    "transaction file": lambda r: r.method == "PUT" and "/_transactions/" in r.path,
    "staged manifest": lambda r: (
        r.method == "PUT" and "/_versions/" in r.path and "x-amz-copy-source" not in r.headers
    ),
    "copy": lambda r: r.method == "PUT" and "x-amz-copy-source" in r.headers,
    "staged delete": lambda r: r.method == "DELETE" and "/_versions/" in r.path,
}


@pytest.mark.parametrize("write", list(COMMIT_WRITES))
def test_a_lost_answer_to_a_commits_lean_write_costs_one_request(
    aws: EmbeddedAws, table: tuple[str, dict[str, str]], s3_client: Any, bucket: str, write: str
) -> None:
    """Each of a commit's four S3 writes lands but its answer is lost (botocore has one
    attempt): the commit completes as if nothing happened, with one request more."""
    uri, options = table
    held = lancetx.open(uri, storage_options=options)
    held.append(_rows(100))  # learned, connected: the next append is the plain one
    injected = FirstOf(
        lambda r: _is_lancetx(r) and COMMIT_WRITES[write](r),
        InterceptedResponse(200, b"", after_forwarding=True, reset=True),
    )
    aws.set_interceptor(injected)
    held.append(_rows(200))
    aws.set_interceptor(None)
    assert len(injected.requests) == 2  # the lean write and botocore's
    assert held.version == 3
    dataset = lance.dataset(uri, storage_options=aws.pylance_storage_options())
    assert dataset.version == 3 and dataset.count_rows() == 30
    keys = _objects(s3_client, bucket)
    assert not [k for k in keys if "/_versions/" in k and not k.endswith(".manifest")]
    assert len([k for k in keys if "/_transactions/" in k]) == 3


def test_a_definitive_failure_after_a_lost_lean_answer_is_botocores(
    aws: EmbeddedAws, table: tuple[str, dict[str, str]], s3_client: Any, bucket: str
) -> None:
    """The lean PUT of the transaction file lands and its answer is lost; botocore's PUT
    is then refused (403). The append fails with botocore's error, nothing is
    claimed, and the transaction file the lean PUT may have left is kept: no file is
    deleted on a lean outcome."""
    uri, options = table
    held = lancetx.open(uri, storage_options=options)
    held.append(_rows(100))
    before = _objects(s3_client, bucket)
    puts: list[InterceptedRequest] = []

    def lost_then_refused(r: InterceptedRequest) -> InterceptedResponse | None:
        if not (_is_lancetx(r) and COMMIT_WRITES["transaction file"](r)):
            return None
        puts.append(r)
        if len(puts) == 1:
            return InterceptedResponse(200, b"", after_forwarding=True, reset=True)
        return InterceptedResponse(403, b"<Error><Code>AccessDenied</Code></Error>")

    aws.set_interceptor(lost_then_refused)
    with pytest.raises(ObjectStoreError, match="access denied"):
        held.append(_rows(200))
    aws.set_interceptor(None)
    assert len(puts) == 2
    assert lance.dataset(uri, storage_options=aws.pylance_storage_options()).version == 2
    added = _objects(s3_client, bucket) - before
    assert [k for k in added if "/_transactions/" in k] == [puts[0].path.split("/", 2)[2]]


# --------------------------------------------------------------------------- asyncio


def test_the_asyncio_store_writes_lean_too(
    aws: EmbeddedAws, bucket: str, seen: list[InterceptedRequest]
) -> None:
    async def body() -> None:
        async with AsyncS3ObjectStore(bucket, config=config(aws.endpoint)) as store:
            client = await store.client()
            assert all(await AsyncLeanWrites(client, bucket).learned())
            # The store's first writes learn (botocore's calls, stopped before sending).
            await store.put("t/learn", b"")
            await store.copy("t/learn", "t/learned")
            await store.delete("t/learn")
            found = Calls()
            found.attach(client.meta.events)
            for data in BODIES:
                seen.clear()
                found.clear()
                written = await store.put(KEYS[1], data)
                copied = await store.copy(KEYS[1], "t/final")
                await store.delete(KEYS[1])
                assert copied.etag == written.etag and written.size == len(data)
                assert [r.method for r in seen] == ["PUT", "PUT", "DELETE"]
                assert found.sent == ["PutObject", "CopyObject", "DeleteObject"]
                assert found.called == []
                assert await store.get("t/final") == data
            # A write that landed and was answered 500 (a reset would be resent by
            # aiohttp itself, on a kept-alive connection): botocore's call (one
            # attempt) follows and succeeds.
            found.clear()
            injected = FirstOf(lambda r: r.method == "PUT", FAULTS["landed-then-500"])
            aws.set_interceptor(injected)
            try:
                await store.put(KEYS[0], b"again")
            finally:
                aws.set_interceptor(None)
            assert len(injected.requests) == 2 and found.called == ["PutObject"]
            assert await store.get(KEYS[0]) == b"again"

    asyncio.run(body())


def test_a_plain_boto3_client_writes_lean_too(aws: EmbeddedAws, bucket: str) -> None:
    """A client the user built (stock botocore handlers, its retry headers): its writes
    are reproduced exactly (the check when learning) and go out lean."""
    client = boto3.client("s3", **aws.client_kwargs())
    store = S3ObjectStore(bucket, client=client)
    assert all(lean_writes(client, bucket).learned())
    found = Calls()
    found.attach(client.meta.events)
    store.put("t/x", b"data")
    store.copy("t/x", "t/y")
    store.delete("t/x")
    assert found.sent == ["PutObject", "CopyObject", "DeleteObject"] and found.called == []
    assert store.get("t/y") == b"data"


@pytest.mark.parametrize("raised", [KeyboardInterrupt, RuntimeError])
def test_a_before_send_handler_that_raises_stops_the_write_once(
    store: S3ObjectStore, calls: Calls, seen: list[InterceptedRequest], raised: type[BaseException]
) -> None:
    """A guard or an injected fault in a ``before-send`` handler (an interrupt too) leaves
    the write as it would leave botocore's call: raised once, nothing sent, no second try."""

    refused: list[str] = []

    def refuse(event_name: str, **_: Any) -> None:
        refused.append(event_name)
        raise raised("refused")

    store.client.meta.events.register("before-send.s3.PutObject", refuse, unique_id="test-refuse")
    try:
        with pytest.raises(raised, match="refused"):
            store.put(KEYS[0], b"bytes")
    finally:
        store.client.meta.events.unregister("before-send.s3.PutObject", unique_id="test-refuse")
    assert refused == ["before-send.s3.PutObject"]  # the lean request's, once
    assert calls.called == []  # botocore's call was not made
    assert [r for r in seen if r.method == "PUT"] == []
