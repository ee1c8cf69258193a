"""Lean GETs (``commit/storage/s3_lean/gets.py``): what botocore would send, at a fraction
of its CPU, and never an answer of their own on anything but a plain success.

* the signature is botocore's, byte for byte, for the keys, regions, session tokens
  and extra headers a request can carry;
* against the embedded server a lean ``get_tail_bulk`` gives what ``get_tail`` gives,
  one request each, seen by the client's ``before-send`` handlers like any other;
* an error answer, a reset connection or a response it does not understand gives
  None (the caller then reads the ordinary way, whose answer is definitive);
* a ``before-send`` handler that answers (a mock) is used, nothing is sent;
* a client botocore would not sign with plain SigV4 gets no lean GETs at all;
* the asyncio store does the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from botocore import UNSIGNED
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest, AWSResponse
from botocore.config import Config
from botocore.credentials import ReadOnlyCredentials
from s3_helpers import s3_config

from lancetx.commit.errors import ObjectNotFoundError
from lancetx.commit.storage.s3_lean import LeanGets, LeanTemplate, quoted_key, sign_get
from lancetx.commit.storage.s3store import S3Config, S3ObjectStore
from lancetx.commit.storage.s3store_async import AsyncS3ObjectStore
from lancetx.demo.embedded import (
    EmbeddedAws,
    InterceptedRequest,
    InterceptedResponse,
)

pytestmark = pytest.mark.embedded_only

KEYS = (
    "t/_versions/18446744073709551614.manifest",
    "t/a b+c~d=\u00e9%/x.manifest",
    "t/deep/er/than/that/x",
)
BODY = bytes(range(256)) * 40  # 10,240 bytes


def config(endpoint: str, **overrides: Any) -> S3Config:
    return s3_config(endpoint, **{"max_attempts": 2, **overrides})


@pytest.fixture
def store(aws: EmbeddedAws, bucket: str) -> S3ObjectStore:
    s = S3ObjectStore(bucket, config=config(aws.endpoint))
    for key in KEYS:
        s.put(key, BODY)
    return s


# ------------------------------------------------------------------------- signature


@pytest.mark.parametrize(
    ("prefix", "region", "token", "extra"),
    [
        ("http://127.0.0.1:5000/bkt/", "us-east-1", None, ()),
        ("https://bkt.s3.eu-west-1.amazonaws.com/", "eu-west-1", "a session token", ()),
        ("https://s3.amazonaws.com:443/bkt/", "us-east-1", None, ()),
        ("http://[::1]:9000/bkt/", "us-west-2", None, (("x-amz-request-payer", " requester  "),)),
    ],
)
def test_the_signature_is_botocores(
    prefix: str, region: str, token: str | None, extra: tuple[tuple[str, str], ...]
) -> None:
    headers = (("User-Agent", "lancetx/1  botocore"), *extra)
    template = LeanTemplate(prefix, region, "s3", headers)
    credentials = ReadOnlyCredentials("AKIDEXAMPLE", "secret/with+chars", token)
    for key in KEYS:
        request = AWSRequest(
            "GET",
            prefix + quoted_key(key),
            headers={**dict(headers), "Range": "bytes=-65536"},
        )
        S3SigV4Auth(credentials, "s3", region).add_auth(request)
        url, signed = sign_get(template, key, 65536, credentials, request.headers["X-Amz-Date"])
        assert url == request.url
        assert signed["Authorization"] == request.headers["Authorization"]
        assert {k.lower(): v for k, v in signed.items()} == {
            k.lower(): v for k, v in request.headers.items()
        }


# -------------------------------------------------------------- against the server


def test_a_lean_read_is_what_get_tail_reads_in_one_request(
    store: S3ObjectStore, seen: list[InterceptedRequest]
) -> None:
    sent: list[str] = []
    store.client.meta.events.register(
        "before-send.s3", lambda request, event_name, **_: sent.append(event_name)
    )
    for key in KEYS:
        for length in (1, 16, len(BODY) - 1, len(BODY), 65536):
            seen.clear()
            sent.clear()
            assert store.get_tail_bulk(key, length) == store.get_tail(key, length)
            gets = [r for r in seen if r.method == "GET"]
            assert len(gets) == 2, key  # the lean GET and get_tail's own
            assert gets[0].headers["range"] == f"bytes=-{length}"
            assert gets[0].headers["user-agent"].startswith("lancetx/")
            # Request counters and guards on the client see it as a GetObject.
            assert sent == ["before-send.s3.GetObject"] * 2


def test_anything_but_a_plain_success_is_left_to_the_ordinary_read(
    aws: EmbeddedAws, store: S3ObjectStore, seen: list[InterceptedRequest]
) -> None:
    key = KEYS[0]
    assert store.get_tail_bulk("t/missing", 64) is None  # 404
    with pytest.raises(ObjectNotFoundError):
        store.get_tail("t/missing", 64)
    store.get_tail_bulk(key, 64)  # learned; from here on one request per lean read
    for answer in (
        InterceptedResponse(500, b"<Error><Code>InternalError</Code></Error>"),
        InterceptedResponse(403, b"<Error><Code>AccessDenied</Code></Error>"),
        InterceptedResponse(200, BODY),  # the whole object where a range was asked
        InterceptedResponse(206, b"xy", [("Content-Range", "bytes 0-1/10")]),  # not a tail
        InterceptedResponse(206, b"x", [("Content-Range", "bytes 9-9/10")]),  # short
        InterceptedResponse(200, b"", reset=True),
    ):
        requests: list[InterceptedRequest] = []

        def once(
            request: InterceptedRequest,
            answer: InterceptedResponse = answer,
            requests: list[InterceptedRequest] = requests,
        ) -> Any:
            requests.append(request)
            return answer if len(requests) == 1 else None

        aws.set_interceptor(once)
        assert store.get_tail_bulk(key, 64) is None, answer
        assert len(requests) == 1
        assert store.get_tail(key, 64) == (BODY[-64:], len(BODY))  # the ordinary read


def test_refusals_in_a_row_make_it_learn_again(
    aws: EmbeddedAws, store: S3ObjectStore, seen: list[InterceptedRequest]
) -> None:
    """A bucket botocore learns is elsewhere (a redirect) refuses every lean GET built
    from what was learned before: after RELEARN_AFTER refusals it is learned again."""
    from lancetx.commit.storage.s3_lean import RELEARN_AFTER

    probes: list[str] = []
    store.client.meta.events.register(
        "before-call.s3.GetObject", lambda **_: probes.append("probe"), unique_id="count"
    )
    try:
        lean = LeanGets(store.client, store.bucket)
        assert lean.get_tail(KEYS[0], 8) == (BODY[-8:], len(BODY))
        assert probes == ["probe"]
        moved = InterceptedResponse(
            301,
            b"<Error><Code>PermanentRedirect</Code></Error>",
            [("x-amz-bucket-region", "eu-west-1")],
        )
        aws.set_interceptor(lambda request: moved)
        for _ in range(RELEARN_AFTER):
            assert lean.get_tail(KEYS[0], 8) is None
        assert probes == ["probe"]
        aws.set_interceptor(None)
        assert lean.get_tail(KEYS[0], 8) == (BODY[-8:], len(BODY))
        assert probes == ["probe", "probe"]  # learned again
        # A missing object is an ordinary answer, not a refusal.
        for _ in range(RELEARN_AFTER + 1):
            assert lean.get_tail("t/missing", 8) is None
        assert lean.get_tail(KEYS[0], 8) is not None
        assert probes == ["probe", "probe"]
    finally:
        store.client.meta.events.unregister("before-call.s3.GetObject", unique_id="count")


def test_a_before_send_handler_that_answers_is_used(
    store: S3ObjectStore, seen: list[InterceptedRequest]
) -> None:
    store.get_tail_bulk(KEYS[0], 8)  # learn first

    class Raw:
        def __init__(self, data: bytes) -> None:
            self.data = data

        def stream(self, *_: Any, **__: Any) -> Iterator[bytes]:
            yield self.data

    def answer(request: Any, **_: Any) -> AWSResponse:
        assert request.headers["Range"] == "bytes=-4"
        return AWSResponse(request.url, 206, {"Content-Range": "bytes 6-9/10"}, Raw(b"mock"))

    store.client.meta.events.register("before-send.s3", answer, unique_id="test-answer")
    try:
        seen.clear()
        assert store.get_tail_bulk(KEYS[0], 4) == (b"mock", 10)
        assert seen == []  # nothing sent
    finally:
        store.client.meta.events.unregister("before-send.s3", unique_id="test-answer")


def test_a_client_not_signing_with_sigv4_gets_no_lean_reads(
    aws: EmbeddedAws, bucket: str, store: S3ObjectStore, seen: list[InterceptedRequest]
) -> None:
    import boto3

    anonymous = boto3.client("s3", **aws.client_kwargs(), config=Config(signature_version=UNSIGNED))
    lean = LeanGets(anonymous, bucket)
    seen.clear()
    assert lean.get_tail(KEYS[0], 8) is None
    assert lean.template() is None
    assert seen == []  # learning it sent nothing


def test_a_session_token_is_sent_and_signed(
    aws: EmbeddedAws, bucket: str, store: S3ObjectStore, seen: list[InterceptedRequest]
) -> None:
    tokened = S3ObjectStore(bucket, config=config(aws.endpoint, session_token="tok"))
    seen.clear()
    assert tokened.get_tail_bulk(KEYS[0], 8) == (BODY[-8:], len(BODY))
    (get,) = [r for r in seen if r.method == "GET"]
    assert get.headers["x-amz-security-token"] == "tok"
    assert "x-amz-security-token" in get.headers["authorization"]


def test_the_asyncio_store_reads_lean_too(
    aws: EmbeddedAws, bucket: str, store: S3ObjectStore, seen: list[InterceptedRequest]
) -> None:
    async def body() -> None:
        async with AsyncS3ObjectStore(bucket, config=config(aws.endpoint)) as lean:
            client = await lean.client()
            sent: list[str] = []
            client.meta.events.register(
                "before-send.s3", lambda request, event_name, **_: sent.append(event_name)
            )
            for key in KEYS:
                for length in (1, len(BODY), 65536):
                    seen.clear()
                    sent.clear()
                    assert await lean.get_tail_bulk(key, length) == await lean.get_tail(key, length)
                    assert len([r for r in seen if r.method == "GET"]) == 2
                    assert sent == ["before-send.s3.GetObject"] * 2
            assert await lean.get_tail_bulk("t/missing", 8) is None

    asyncio.run(body())
