"""botocore's service data served from marshal copies (``aws_model_cache``).

The copies must give botocore exactly what its JSON gives, be used by the next
session instead of the JSON, and never make a client fail: an unwritable cache
directory or a damaged copy only costs the speed-up.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import botocore.loaders
import botocore.session
import pytest
from botocore.exceptions import ClientError
from botocore.regions import EndpointResolver

from lancetx.commit.storage import aws_clients, aws_model_cache, aws_service_models
from lancetx.commit.storage.aws_model_cache import (
    CACHE_ENV,
    CachingFileLoader,
    TrimmedEndpointResolver,
)
from lancetx.commit.storage.aws_service_models import CLIENT_OPERATIONS, trim_service_model
from lancetx.demo.embedded import EmbeddedAws


@pytest.fixture
def json_parses(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The JSON documents botocore parses (by size), counted at its loader."""
    parsed: list[str] = []
    real = json.loads

    class CountingJson:
        @staticmethod
        def loads(payload: str, **kwargs: Any) -> Any:
            parsed.append(f"{len(payload)} bytes")
            return real(payload, **kwargs)

    monkeypatch.setattr(botocore.loaders, "json", CountingJson)
    yield parsed


def new_session() -> Any:
    """A session as lancetx builds its own (the cache as the environment says)."""
    return aws_clients.new_session()


def use_clients(session: Any, aws: EmbeddedAws) -> None:
    with pytest.raises(ClientError, match="NoSuchBucket"):
        session.create_client("s3", **aws.client_kwargs()).list_objects_v2(Bucket="no-such")
    with pytest.raises(ClientError, match="ResourceNotFound"):
        session.create_client("dynamodb", **aws.client_kwargs()).describe_table(TableName="no")


def test_the_next_session_reads_the_copies_instead_of_the_json(
    aws: EmbeddedAws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, json_parses: list[str]
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    use_clients(new_session(), aws)
    assert json_parses  # the first session parsed botocore's JSON ...
    assert list(tmp_path.glob("*.marshal"))  # ... and kept copies
    json_parses.clear()

    use_clients(new_session(), aws)  # as a new process would
    assert json_parses == []


def _rule_set(service_model_path: str) -> Any:
    """The endpoint rule set beside a service model (what the trim reads it against)."""
    rule_set = str(Path(service_model_path).parent / "endpoint-rule-set-1")
    return json.loads(json.dumps(botocore.loaders.JSONFileLoader().load_file(rule_set)))


def test_a_copy_holds_what_the_json_holds(tmp_path: Path) -> None:
    data = Path(botocore.__file__).parent / "data"
    plain = botocore.loaders.JSONFileLoader()
    for name in ("endpoints", "s3/2006-03-01/endpoint-rule-set-1", "sts/2011-06-15/service-2"):
        path = str(data / name)
        CachingFileLoader(tmp_path).load_file(path)  # writes the copy
        from_copy = CachingFileLoader(tmp_path).load_file(path)
        expected = plain.load_file(path)
        if name.endswith("service-2"):
            expected = trim_service_model(
                name.split("/")[0], json.loads(json.dumps(expected)), _rule_set(path)
            )
        assert from_copy == expected, name
        assert list(from_copy) == list(expected), name  # key order kept


def test_service_models_come_trimmed_whether_parsed_or_from_a_copy(tmp_path: Path) -> None:
    path = str(Path(botocore.__file__).parent / "data" / "s3" / "2006-03-01" / "service-2")
    full = botocore.loaders.JSONFileLoader().load_file(path)
    expected = trim_service_model("s3", json.loads(json.dumps(full)), _rule_set(path))
    parsed = CachingFileLoader(tmp_path).load_file(path)  # no copy yet: parsed, then kept
    from_copy = CachingFileLoader(tmp_path).load_file(path)
    assert parsed == from_copy == expected
    assert set(expected["operations"]) == CLIENT_OPERATIONS["s3"] < set(full["operations"])


def test_copies_made_for_another_list_of_operations_are_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(Path(botocore.__file__).parent / "data" / "s3" / "2006-03-01" / "service-2")
    CachingFileLoader(tmp_path).load_file(path)
    more = {**CLIENT_OPERATIONS, "s3": CLIENT_OPERATIONS["s3"] | {"HeadBucket"}}
    monkeypatch.setattr(aws_service_models, "CLIENT_OPERATIONS", more)
    assert "HeadBucket" in CachingFileLoader(tmp_path).load_file(path)["operations"]


def test_an_unwritable_cache_or_a_damaged_copy_only_costs_the_speed_up(
    aws: EmbeddedAws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv(CACHE_ENV, str(blocker / "cache"))
    use_clients(new_session(), aws)

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    use_clients(new_session(), aws)
    for copy in (tmp_path / "cache").glob("*.marshal"):
        copy.write_bytes(b"\x00garbage")
    use_clients(new_session(), aws)


def test_the_cache_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, "off")
    session = new_session()
    assert type(session.get_component("data_loader").file_loader) is (
        botocore.loaders.JSONFileLoader
    )
    # botocore's own endpoint resolver, over the whole endpoint data.
    resolver = session._get_internal_component("endpoint_resolver")
    assert type(resolver) is EndpointResolver
    assert len(resolver._endpoint_data["partitions"][0]["services"]) > 100
    # botocore's whole models, and every built-in handler (those of S3's other
    # operations included): a client with every operation works as botocore's.
    client = session.create_client("s3", region_name="us-east-1")
    assert hasattr(client, "put_bucket_policy") and hasattr(client, "upload_part")
    assert (
        handlers_of(session, "before-parameter-build.s3.UploadPart")
        == handlers_of(botocore.session.Session(), "before-parameter-build.s3.UploadPart")
        != []
    )


def handlers_of(session: Any, event_name: str) -> list[Any]:
    """The handlers ``session``'s clients run for ``event_name``, in order."""
    return list(session._original_handler._handlers.prefix_search(event_name))


# ------------------------------------------------------------------ trimmed endpoint data

REGIONS = ("us-east-1", "eu-west-1", "cn-north-1", "us-gov-west-1")
#: lancetx's clients, and STS (credentials of an assumed role).
LANCETX_SERVICES = ("s3", "dynamodb", "sts")


class Sent(Exception):
    """Raised by the hook below instead of sending: what would have gone on the wire."""

    def __init__(self, url: str, authorization: str) -> None:
        super().__init__(url)
        self.url = url
        self.authorization = authorization


def _stop_before_sending(request: Any, **kwargs: Any) -> None:
    raise Sent(request.url, str(request.headers.get("Authorization", b""), "utf-8", "replace"))


def where_it_goes(
    session: Any, service: str, region: str, endpoint_url: str | None
) -> tuple[Any, ...]:
    """Where a client of ``session`` sends a request, and the scope it signs it for."""
    kwargs: dict[str, Any] = {
        "region_name": region,
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
    }
    if endpoint_url is not None:
        kwargs["endpoint_url"] = endpoint_url
    client = session.create_client(service, **kwargs)
    client.meta.events.register("before-send", _stop_before_sending)
    call = {
        "s3": lambda: client.head_object(Bucket="some-bucket", Key="k"),
        "dynamodb": lambda: client.describe_table(TableName="some-table"),
        "sts": lambda: client.get_caller_identity(),
        "sqs": lambda: client.list_queues(),
    }[service]
    with pytest.raises(Sent) as sent:
        call()
    scope = sent.value.authorization.split("Credential=", 1)[-1].split(",", 1)[0]
    return (
        client.meta.endpoint_url,
        client.meta.region_name,
        client.meta.partition,
        sent.value.url,
        scope.split("/", 2)[-1],  # date/region/service/aws4_request, without the key id
    )


def resolver_of(session: Any) -> Any:
    return session._get_internal_component("endpoint_resolver")


def plain_and_trimmed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """A session with the cache off, and one reading the trimmed copy (written by a
    session before it, as the next process would find it)."""
    monkeypatch.setenv(CACHE_ENV, "off")
    plain = new_session()
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    new_session()  # writes the trimmed copy
    return plain, new_session()


def test_clients_resolve_the_same_endpoints_from_the_trimmed_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain, trimmed = plain_and_trimmed(tmp_path, monkeypatch)
    assert isinstance(resolver_of(trimmed), TrimmedEndpointResolver)
    assert type(resolver_of(plain)) is EndpointResolver

    for service in LANCETX_SERVICES:
        for region in REGIONS:
            for endpoint_url in (None, "http://127.0.0.1:4566"):
                expected = where_it_goes(plain, service, region, endpoint_url)
                assert where_it_goes(trimmed, service, region, endpoint_url) == expected, (
                    service,
                    region,
                    endpoint_url,
                )
    # Every answer came from the trimmed data: nothing lancetx uses is missing from it.
    assert resolver_of(trimmed).trimmed
    for region in REGIONS:
        partition = resolver_of(plain).get_partition_for_region(region)
        assert resolver_of(trimmed).get_partition_for_region(region) == partition
        assert resolver_of(trimmed).get_partition_dns_suffix(partition) == (
            resolver_of(plain).get_partition_dns_suffix(partition)
        )
    assert resolver_of(trimmed).trimmed


def test_any_other_service_loads_the_whole_endpoint_data_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain, trimmed = plain_and_trimmed(tmp_path, monkeypatch)
    resolver = resolver_of(trimmed)
    assert resolver.trimmed and "sqs" not in resolver._endpoint_data["partitions"][0]["services"]
    assert resolver.get_available_endpoints("sqs") == plain.get_available_regions("sqs") != []
    assert not resolver.trimmed  # the whole data was loaded to answer
    assert trimmed.get_available_regions("ec2") == plain.get_available_regions("ec2")
    for region in ("eu-west-1", "cn-north-1"):
        assert where_it_goes(trimmed, "sqs", region, None) == where_it_goes(
            plain, "sqs", region, None
        )


def test_a_trimmed_copy_is_kept_per_service_set_and_endpoints_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    session = new_session()
    only_s3 = aws_model_cache.endpoint_resolver_factory(session, tmp_path, ["s3"])()
    assert set(only_s3._endpoint_data["partitions"][0]["services"]) == {"s3"}
    both = aws_model_cache.endpoint_resolver_factory(session, tmp_path, ["s3", "dynamodb"])()
    assert set(both._endpoint_data["partitions"][0]["services"]) == {"s3", "dynamodb"}
    again = aws_model_cache.endpoint_resolver_factory(session, tmp_path, ["s3"])()
    assert set(again._endpoint_data["partitions"][0]["services"]) == {"s3"}


def test_a_trimmed_copy_keeps_every_partitions_own_data() -> None:
    data = botocore.loaders.JSONFileLoader().load_file(
        str(Path(botocore.__file__).parent / "data" / "endpoints")
    )
    trimmed = aws_model_cache.trim_endpoints(data, ["s3"])
    assert [p["partition"] for p in trimmed["partitions"]] == [
        p["partition"] for p in data["partitions"]
    ]
    for before, after in zip(data["partitions"], trimmed["partitions"], strict=True):
        assert {k: v for k, v in after.items() if k != "services"} == {
            k: v for k, v in before.items() if k != "services"
        }
        assert after["services"] == {k: v for k, v in before["services"].items() if k == "s3"}
