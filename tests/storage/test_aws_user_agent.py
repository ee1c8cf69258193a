"""lancetx's clients build their User-Agent once per feature set (``aws_user_agent``):
the header is botocore's, a feature registered mid-request still shows, and botocore's
builder runs once for many requests instead of twice each."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.useragent import UserAgentString, register_feature_id

from lancetx.commit.storage import aws_clients
from lancetx.commit.storage.aws_user_agent import cache_user_agent


class Stop(Exception):
    def __init__(self, user_agent: str) -> None:
        super().__init__(user_agent)
        self.user_agent = user_agent


def _stop(request: Any, **_: Any) -> None:
    value = request.headers["User-Agent"]
    raise Stop(value.decode() if isinstance(value, bytes) else str(value))


def _components(user_agent: str) -> tuple[list[str], set[str]]:
    """The header's components, the feature list (``m/…``) as a set: botocore joins an
    unordered set there."""
    parts = user_agent.split(" ")
    features = {f for p in parts if p.startswith("m/") for f in p[2:].split(",")}
    return [p for p in parts if not p.startswith("m/")], features


def _sent(client: Any, key: str) -> str:
    with pytest.raises(Stop) as stopped:
        client.get_object(Bucket="some-bucket", Key=key)
    return stopped.value.user_agent


def _client(**kwargs: Any) -> Any:
    client = aws_clients.new_session().create_client(
        "s3",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        endpoint_url="http://127.0.0.1:1",
        **kwargs,
    )
    client.meta.events.register("before-send", _stop)
    return client


def _register_late(**_: Any) -> None:
    # A handler that uses a feature while the request is built (after the first
    # User-Agent was made, before the one that is signed).
    register_feature_id("GZIP_REQUEST_COMPRESSION")


def test_the_header_is_botocores_and_a_late_feature_shows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[int] = []
    original = UserAgentString.to_string

    def counted(self: UserAgentString) -> str:
        built.append(1)
        return original(self)

    monkeypatch.setattr(UserAgentString, "to_string", counted)
    plain, cached = _client(), _client()
    assert cache_user_agent(cached)
    assert not cache_user_agent(cached)  # once is enough
    for client in (plain, cached):
        client.meta.events.register_first("request-created.s3", _register_late)

    built.clear()
    theirs = [_sent(plain, f"k/{i}") for i in range(10)]
    assert len(built) == 20  # botocore: twice a request
    built.clear()
    ours = [_sent(cached, f"k/{i}") for i in range(10)]
    assert len(built) <= 2  # once per feature set
    for a, b in zip(theirs, ours, strict=True):
        assert _components(a) == _components(b)
    assert "L" in _components(ours[0])[1]  # the late feature is in the signed header


def test_lancetxs_shared_clients_are_cached() -> None:
    aws_clients.clear_client_cache()
    client = aws_clients.make_client(
        "s3",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    assert getattr(client._user_agent_creator.to_string, "lancetx_cached", False)
