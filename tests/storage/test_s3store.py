"""S3ObjectStore specifics on the embedded moto server: the legacy rule, error
mapping, retries, pagination and configuration."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from s3_helpers import s3_config as embedded_s3_config

from lancetx.commit.errors import (
    ObjectExistsError,
    ObjectNotFoundError,
    ObjectStoreError,
    StorageOptionError,
    TransientObjectStoreError,
    UnsupportedOperationError,
)
from lancetx.commit.storage.s3store import S3Config, S3ObjectStore
from lancetx.commit.storage.stores import open_object_store
from lancetx.demo.embedded import (
    DEFAULT_REGION,
    FAKE_ACCESS_KEY,
    FAKE_SECRET_KEY,
    EmbeddedAws,
    InterceptedRequest,
    InterceptedResponse,
)

#: Runs against any real S3 + DynamoDB too: make test-localstack (LocalStack S3 + dynalite).
pytestmark = pytest.mark.integration

ACCESS_DENIED = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message>"
    b"<RequestId>R</RequestId><HostId>H</HostId></Error>"
)
SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b"<Error><Code>ServiceUnavailable</Code><Message>Please reduce your request rate.</Message>"
    b"</Error>"
)


def s3_config(endpoint: str, **overrides: Any) -> S3Config:
    """The embedded server's configuration, retrying little (these tests count attempts)."""
    return embedded_s3_config(endpoint, **{"max_attempts": 2, **overrides})


@pytest.fixture
def store(aws: EmbeddedAws, bucket: str) -> Iterator[S3ObjectStore]:
    with S3ObjectStore(bucket, config=s3_config(aws.endpoint)) as s:
        yield s


@pytest.fixture
def intercept(aws: EmbeddedAws) -> Iterator[EmbeddedAws]:
    """The server, with any interceptor removed after the test."""
    try:
        yield aws
    finally:
        aws.set_interceptor(None)


class Recorder:
    """A botocore ``before-send`` handler keeping every request's operation and headers."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str]]] = []

    def __call__(self, request: Any, event_name: str, **_: Any) -> None:
        operation = event_name.rsplit(".", 1)[-1]
        self.requests.append((operation, {k.lower(): str(v) for k, v in request.headers.items()}))

    @property
    def operations(self) -> set[str]:
        return {op for op, _ in self.requests}

    def conditional(self) -> list[tuple[str, str]]:
        return [
            (op, name)
            for op, headers in self.requests
            for name in headers
            if name in ("if-none-match", "if-match") or name.startswith("x-amz-copy-source-if-")
        ]


# ------------------------------------------------------------------ legacy rule


def test_legacy_store_never_sends_a_conditional_header(
    legacy_aws: EmbeddedAws, bucket: str
) -> None:
    store = S3ObjectStore(bucket, config=s3_config(legacy_aws.endpoint), legacy=True)
    assert store.capabilities.conditional_put is False
    recorder = Recorder()
    store.client.meta.events.register("before-send.s3", recorder)

    store.put("t/data/a", b"0123456789")
    store.put("t/data/a", b"0123456789!")
    assert store.get("t/data/a") == b"0123456789!"
    assert store.get_range("t/data/a", 2, 4) == b"23"
    assert store.get_tail("t/data/a", 3) == (b"89!", 11)
    assert store.head("t/data/a").size == 11
    store.copy("t/data/a", "t/_versions/1.manifest")
    assert [m.key for m in store.list("t/_versions/")] == ["t/_versions/1.manifest"]
    store.delete("t/data/a")
    store.delete("t/data/missing")
    sent_before = len(recorder.requests)

    with pytest.raises(UnsupportedOperationError) as info:
        store.put_if_not_exists("t/_versions/2.manifest", b"manifest")
    message = str(info.value)
    assert "s3+ddb://" + bucket + "/t?ddbTableName=" in message
    assert "DynamoDB" in message and store.uri("t/_versions/2.manifest") in message
    assert len(recorder.requests) == sent_before  # refused without sending anything
    with pytest.raises(ObjectNotFoundError):
        store.head("t/_versions/2.manifest")

    assert {
        "PutObject",
        "GetObject",
        "HeadObject",
        "CopyObject",
        "DeleteObject",
        "ListObjectsV2",
    } <= (recorder.operations)
    assert recorder.conditional() == []


def test_recorder_sees_if_none_match_on_a_modern_store(aws: EmbeddedAws, bucket: str) -> None:
    """The legacy test above can fail: the same recorder catches the header."""
    store = S3ObjectStore(bucket, config=s3_config(aws.endpoint))
    recorder = Recorder()
    store.client.meta.events.register("before-send.s3", recorder)
    store.put_if_not_exists("t/_versions/1.manifest", b"m")
    assert recorder.conditional() == [("PutObject", "if-none-match")]


def test_legacy_guard_refuses_conditional_requests_on_its_client(
    legacy_aws: EmbeddedAws, bucket: str
) -> None:
    store = S3ObjectStore(bucket, config=s3_config(legacy_aws.endpoint), legacy=True)
    with pytest.raises(UnsupportedOperationError, match=r"(?i)if-none-match"):
        store.client.put_object(Bucket=bucket, Key="k", Body=b"x", IfNoneMatch="*")
    with pytest.raises(ObjectNotFoundError):
        store.head("k")  # nothing reached the server


def test_stores_configured_alike_share_one_client_and_the_guard_stays_with_legacy(
    aws: EmbeddedAws, bucket: str
) -> None:
    """One client per configuration and process (building one costs ~5-80 ms), but a
    legacy store's guard never reaches a store that may send conditional requests."""
    config = s3_config(aws.endpoint)
    modern, modern_again = (
        S3ObjectStore(bucket, config=config),
        S3ObjectStore(bucket, config=config),
    )
    legacy = S3ObjectStore(bucket, config=config, legacy=True)
    assert modern.client is modern_again.client
    assert legacy.client is S3ObjectStore(bucket, config=config, legacy=True).client
    assert legacy.client is not modern.client
    other = S3ObjectStore(bucket, config=replace(config, read_timeout=7.0))
    assert other.client is not modern.client
    modern.put_if_not_exists("shared/_versions/1.manifest", b"m")  # not refused
    with pytest.raises(UnsupportedOperationError):
        legacy.client.put_object(Bucket=bucket, Key="k", Body=b"x", IfNoneMatch="*")
    modern.close()  # a shared client outlives the store that was handed it
    assert modern_again.get("shared/_versions/1.manifest") == b"m"


@pytest.mark.embedded_only
def test_why_legacy_matters_the_server_ignores_the_condition(
    legacy_aws: EmbeddedAws, bucket: str
) -> None:
    """On a bucket that ignores If-None-Match a conditional put is a plain put:
    both "creates" succeed, which is what the legacy flag protects against."""
    store = S3ObjectStore(bucket, config=s3_config(legacy_aws.endpoint))
    store.put_if_not_exists("t/_versions/1.manifest", b"writer A")
    store.put_if_not_exists("t/_versions/1.manifest", b"writer B")
    assert store.get("t/_versions/1.manifest") == b"writer B"


def test_put_if_not_exists_conflict(store: S3ObjectStore) -> None:
    store.put_if_not_exists("p/k", b"one")
    with pytest.raises(ObjectExistsError) as info:
        store.put_if_not_exists("p/k", b"two")
    assert "PutObject" in str(info.value) and store.uri("p/k") in str(info.value)


def test_conditional_conflict_409_is_exists(intercept: EmbeddedAws, store: S3ObjectStore) -> None:
    body = b"<Error><Code>ConditionalRequestConflict</Code><Message>conflict</Message></Error>"
    intercept.set_interceptor(
        lambda r: InterceptedResponse(409, body) if r.method == "PUT" else None
    )
    with pytest.raises(ObjectExistsError):
        store.put_if_not_exists("p/k", b"x")


# -------------------------------------------------- ambiguous conditional create


def _fail_first_put(response: InterceptedResponse) -> tuple[list[str], Any]:
    seen: list[str] = []

    def interceptor(request: InterceptedRequest) -> InterceptedResponse | None:
        if request.method != "PUT":
            return None
        seen.append(request.headers.get("if-none-match", ""))
        return response if len(seen) == 1 else None

    return seen, interceptor


def test_put_if_not_exists_whose_first_attempt_landed_is_ours(
    intercept: EmbeddedAws, store: S3ObjectStore
) -> None:
    """The write lands, its response is lost (503), botocore retries and gets
    412: the object holds our bytes, so the create is ours."""
    seen, interceptor = _fail_first_put(InterceptedResponse(503, SLOW_DOWN, after_forwarding=True))
    intercept.set_interceptor(interceptor)
    meta = store.put_if_not_exists("p/_versions/3.manifest", b"our manifest")
    assert seen == ["*", "*"]  # retried once, both conditional
    assert meta.size == len(b"our manifest")
    assert store.get("p/_versions/3.manifest") == b"our manifest"


def test_put_if_not_exists_retry_that_finds_another_writer_loses(
    intercept: EmbeddedAws, store: S3ObjectStore
) -> None:
    store.put("p/_versions/3.manifest", b"their manifest")
    seen, interceptor = _fail_first_put(InterceptedResponse(503, SLOW_DOWN))
    intercept.set_interceptor(interceptor)
    with pytest.raises(ObjectExistsError):
        store.put_if_not_exists("p/_versions/3.manifest", b"our manifest")
    assert len(seen) == 2
    assert store.get("p/_versions/3.manifest") == b"their manifest"


# ------------------------------------------------------------------ error mapping


def test_no_such_key_names_the_uri(store: S3ObjectStore) -> None:
    with pytest.raises(ObjectNotFoundError) as info:
        store.get("t/_versions/9.manifest")
    text = str(info.value)
    assert "GetObject" in text and f"s3://{store.bucket}/t/_versions/9.manifest" in text


def test_persistent_503_is_retried_then_transient(
    intercept: EmbeddedAws, store: S3ObjectStore
) -> None:
    store.put("t/obj", b"data")
    gets: list[str] = []

    def unavailable(request: InterceptedRequest) -> InterceptedResponse | None:
        if request.method == "GET" and request.path.endswith("/t/obj"):
            gets.append(request.path)
            return InterceptedResponse(503, SLOW_DOWN)
        return None

    intercept.set_interceptor(unavailable)
    with pytest.raises(TransientObjectStoreError) as info:
        store.get("t/obj")
    assert len(gets) == 2  # max_attempts=2: botocore retried once
    assert "GetObject" in str(info.value) and store.uri("t/obj") in str(info.value)


def test_one_503_is_retried_transparently(intercept: EmbeddedAws, store: S3ObjectStore) -> None:
    store.put("t/obj", b"data")
    gets: list[str] = []

    def once(request: InterceptedRequest) -> InterceptedResponse | None:
        if request.method == "GET":
            gets.append(request.path)
            return InterceptedResponse(503, SLOW_DOWN) if len(gets) == 1 else None
        return None

    intercept.set_interceptor(once)
    assert store.get("t/obj") == b"data"
    assert len(gets) == 2


@pytest.mark.parametrize(
    ("method", "call", "action", "resource"),
    [
        ("GET", lambda s: s.get("t/obj"), "s3:GetObject", "arn:aws:s3:::{b}/t/obj"),
        ("HEAD", lambda s: s.head("t/obj"), "s3:GetObject", "arn:aws:s3:::{b}/t/obj"),
        ("PUT", lambda s: s.put("t/obj", b"x"), "s3:PutObject", "arn:aws:s3:::{b}/t/obj"),
        ("DELETE", lambda s: s.delete("t/obj"), "s3:DeleteObject", "arn:aws:s3:::{b}/t/obj"),
        ("GET", lambda s: list(s.list("t/")), "s3:ListBucket", "arn:aws:s3:::{b}"),
        ("PUT", lambda s: s.copy("t/src", "t/obj"), "s3:PutObject", "arn:aws:s3:::{b}/t/obj"),
    ],
)
def test_access_denied_names_action_and_resource(
    intercept: EmbeddedAws,
    store: S3ObjectStore,
    method: str,
    call: Any,
    action: str,
    resource: str,
) -> None:
    intercept.set_interceptor(
        lambda r: InterceptedResponse(403, ACCESS_DENIED) if r.method == method else None
    )
    with pytest.raises(ObjectStoreError) as info:
        call(store)
    err = info.value
    assert not isinstance(err, (TransientObjectStoreError, ObjectNotFoundError))
    text = str(err)
    assert action in text and resource.format(b=store.bucket) in text
    assert "grant" in text and f"s3://{store.bucket}/t/" in text


def test_access_denied_on_get_object(intercept: EmbeddedAws, store: S3ObjectStore) -> None:
    intercept.set_interceptor(lambda r: InterceptedResponse(403, ACCESS_DENIED))
    with pytest.raises(ObjectStoreError) as info:
        store.get("t/_versions/1.manifest")
    text = str(info.value)
    assert text.startswith(f"GetObject s3://{store.bucket}/t/_versions/1.manifest: access denied")
    assert f"s3:GetObject on arn:aws:s3:::{store.bucket}/t/_versions/1.manifest" in text


def test_copy_access_denied_names_both_sides(intercept: EmbeddedAws, store: S3ObjectStore) -> None:
    intercept.set_interceptor(lambda r: InterceptedResponse(403, ACCESS_DENIED))
    with pytest.raises(ObjectStoreError) as info:
        store.copy("t/staged", "t/final")
    text = str(info.value)
    assert f"s3:GetObject on arn:aws:s3:::{store.bucket}/t/staged" in text
    assert f"s3:PutObject on arn:aws:s3:::{store.bucket}/t/final" in text


def test_missing_bucket(aws: EmbeddedAws) -> None:
    store = S3ObjectStore("lancetx-no-such-bucket", config=s3_config(aws.endpoint))
    with pytest.raises(ObjectStoreError, match="bucket 'lancetx-no-such-bucket' does not exist"):
        store.get("k")


def test_connection_refused_is_transient(bucket: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = S3ObjectStore(
        bucket,
        config=s3_config(f"http://127.0.0.1:{port}", max_attempts=1, connect_timeout=2),
    )
    with pytest.raises(TransientObjectStoreError) as info:
        store.put("t/obj", b"x")
    assert "PutObject" in str(info.value) and store.uri("t/obj") in str(info.value)


def test_read_timeout_is_transient(intercept: EmbeddedAws, bucket: str) -> None:
    store = S3ObjectStore(
        bucket, config=s3_config(intercept.endpoint, max_attempts=1, read_timeout=0.3)
    )
    store.put("t/obj", b"x")

    def slow(request: InterceptedRequest) -> InterceptedResponse | None:
        time.sleep(1.0)
        return None

    intercept.set_interceptor(slow)
    with pytest.raises(TransientObjectStoreError, match="HeadObject"):
        store.head("t/obj")


# ------------------------------------------------------------------ listing


def test_list_paginates_in_lexical_order(aws: EmbeddedAws, bucket: str) -> None:
    store = S3ObjectStore(bucket, config=s3_config(aws.endpoint), page_size=2)
    keys = [f"t/_versions/{n:020d}.manifest" for n in (5, 1, 4, 2, 3, 7, 6)]
    for key in keys:
        store.put(key, b"m")
    store.put("t/data/other", b"d")
    store.put("u/elsewhere", b"e")
    recorder = Recorder()
    store.client.meta.events.register("before-send.s3", recorder)
    listed = [m.key for m in store.list("t/_versions/")]
    assert listed == sorted(keys)
    assert [op for op, _ in recorder.requests] == ["ListObjectsV2"] * 4  # pages of 2, 2, 2, 1
    assert all(m.size == 1 and m.etag for m in store.list("t/_versions/"))


def test_list_is_lazy(aws: EmbeddedAws, bucket: str) -> None:
    store = S3ObjectStore(bucket, config=s3_config(aws.endpoint), page_size=1)
    for i in range(3):
        store.put(f"t/{i}", b"x")
    recorder = Recorder()
    store.client.meta.events.register("before-send.s3", recorder)
    first = next(iter(store.list("t/")))
    assert first.key == "t/0" and len(recorder.requests) == 1


def test_page_size_bounds(bucket: str) -> None:
    with pytest.raises(ValueError):
        S3ObjectStore(bucket, config=S3Config(region=DEFAULT_REGION), page_size=0)
    with pytest.raises(ValueError):
        S3ObjectStore(bucket, config=S3Config(region=DEFAULT_REGION), page_size=1001)


def test_capabilities() -> None:
    modern = S3ObjectStore("bkt", config=S3Config(region=DEFAULT_REGION))
    legacy = S3ObjectStore(
        "bkt", config=S3Config(region=DEFAULT_REGION), legacy=True, consistent_list=False
    )
    assert modern.capabilities.conditional_put and modern.capabilities.lexically_ordered_list
    assert modern.capabilities.consistent_list and not modern.capabilities.atomic_rename
    assert not legacy.capabilities.conditional_put and not legacy.capabilities.consistent_list
    assert modern.uri("a/b") == "s3://bkt/a/b"


# ------------------------------------------------------------------ configuration


def test_config_from_pylance_options(aws: EmbeddedAws) -> None:
    config = S3Config.from_options(aws.pylance_storage_options())
    assert config.endpoint_url == aws.endpoint
    assert config.region == DEFAULT_REGION
    assert (config.access_key_id, config.secret_access_key) == (FAKE_ACCESS_KEY, FAKE_SECRET_KEY)


def test_config_from_boto3_style_options() -> None:
    config = S3Config.from_options(
        {
            "endpoint_url": "http://e:1",
            "region_name": "eu-west-1",
            "aws_access_key_id": "a",
            "aws_secret_access_key": "s",
            "aws_session_token": "t",
            "profile": "p",
            "max_attempts": "5",
            "connect_timeout": "2.5",
            "timeout": "500ms",
            "aws_virtual_hosted_style_request": "false",
            "max_pool_connections": "64",
            "allow_http": "true",
            "dynamodb_endpoint": "http://ignored",
        }
    )
    assert config == S3Config(
        endpoint_url="http://e:1",
        region="eu-west-1",
        access_key_id="a",
        secret_access_key="s",
        session_token="t",
        profile="p",
        max_attempts=5,
        connect_timeout=2.5,
        read_timeout=0.5,
        addressing_style="path",
        max_pool_connections=64,
    )
    assert S3Config.from_options(None) == S3Config()
    assert S3Config.from_options({"AWS_REGION": "x", "read_timeout": "1m"}) == S3Config(
        region="x", read_timeout=60.0
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"aws_endpoint": "http://a", "endpoint_url": "http://b"}, "conflicting"),
        ({"aws_access_key_id": "a"}, "both an access key id and a secret"),
        ({"max_attempts": "0"}, "at least 1"),
        ({"max_attempts": "three"}, "not an integer"),
        ({"timeout": "soon"}, "not a duration"),
        ({"addressing_style": "sideways"}, "addressing_style"),
        ({"request_checksum_calculation": "always"}, "request_checksum_calculation"),
        (
            {"addressing_style": "virtual", "aws_virtual_hosted_style_request": "false"},
            "conflicting",
        ),
    ],
)
def test_config_rejects(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        S3Config.from_options(options)
    assert isinstance(info.value, StorageOptionError)


def test_legacy_compatible_checksums_send_no_checksum_header(
    legacy_aws: EmbeddedAws, bucket: str
) -> None:
    """``request_checksum_calculation=when_required`` (for older S3-compatible
    stores) really stops botocore's default CRC32 upload checksum."""
    options = {
        **legacy_aws.pylance_storage_options(),
        "request_checksum_calculation": "when_required",
    }
    for config, expect_checksum in (
        (S3Config.from_options(options), False),
        (s3_config(legacy_aws.endpoint), True),
    ):
        store = S3ObjectStore(bucket, config=config, legacy=True)
        recorder = Recorder()
        store.client.meta.events.register("before-send.s3", recorder)
        store.put("t/obj", b"x")
        ((_, headers),) = recorder.requests
        assert any(h.startswith("x-amz-checksum-") for h in headers) is expect_checksum


def test_client_uses_standard_retries_and_timeouts(bucket: str) -> None:
    store = S3ObjectStore(
        bucket,
        config=S3Config(
            region=DEFAULT_REGION,
            max_attempts=4,
            connect_timeout=3,
            read_timeout=7,
            addressing_style="path",
        ),
    )
    config = store.client.meta.config
    assert config.retries == {"mode": "standard", "total_max_attempts": 4}
    assert (config.connect_timeout, config.read_timeout) == (3, 7)
    assert config.s3 == {"addressing_style": "path"}


@pytest.mark.parametrize("variable", ["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"])
def test_endpoint_from_environment(
    aws: EmbeddedAws, bucket: str, monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    """No endpoint in the config: boto3's own environment lookup reaches moto
    (the bucket exists only there; real AWS would reject the fake keys)."""
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", raising=False)
    monkeypatch.setenv(variable, aws.endpoint)
    store = S3ObjectStore(bucket, config=S3Config(max_attempts=1, connect_timeout=2))
    assert store.client.meta.endpoint_url == aws.endpoint
    store.put("env/obj", b"via environment")
    assert store.get("env/obj") == b"via environment"


def test_open_object_store_reaches_moto_with_pylance_options(aws: EmbeddedAws, bucket: str) -> None:
    store, base = open_object_store(
        f"s3+ddb://{bucket}/tables/t.lance?ddbTableName=x", aws.pylance_storage_options()
    )
    assert base == "tables/t.lance"
    store.put(base + "/_versions/1.manifest", b"m")
    assert [m.key for m in store.list(base + "/")] == ["tables/t.lance/_versions/1.manifest"]


def test_passed_in_client_is_used(aws: EmbeddedAws, bucket: str, s3_client: Any) -> None:
    store = S3ObjectStore(bucket, client=s3_client)
    assert store.client is s3_client
    store.put("k", b"v")
    assert s3_client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"
    store.close()  # not ours: stays open
    assert store.get("k") == b"v"
    with pytest.raises(ValueError):
        S3ObjectStore(bucket, client=s3_client, config=S3Config())


def test_store_is_thread_safe_for_plain_puts(aws: EmbeddedAws, bucket: str) -> None:
    store = S3ObjectStore(bucket, config=s3_config(aws.endpoint, max_pool_connections=16))
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for j in range(5):
                store.put(f"mt/{i}/{j}", f"{i}-{j}".encode())
                assert store.get(f"mt/{i}/{j}") == f"{i}-{j}".encode()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(list(store.list("mt/"))) == 40
