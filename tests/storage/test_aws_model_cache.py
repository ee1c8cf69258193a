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

from lancetx.commit.storage import aws_model_cache
from lancetx.commit.storage.aws_model_cache import CACHE_ENV, CachingFileLoader
from lancetx.externalstore.embedded import EmbeddedAws


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
    session = botocore.session.Session()
    aws_model_cache.install(session)
    return session


def use_clients(session: Any, aws: EmbeddedAws) -> None:
    session.create_client("s3", **aws.client_kwargs()).list_buckets()
    session.create_client("dynamodb", **aws.client_kwargs()).list_tables()


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


def test_a_copy_holds_what_the_json_holds(tmp_path: Path) -> None:
    data = Path(botocore.__file__).parent / "data"
    plain = botocore.loaders.JSONFileLoader()
    for name in ("endpoints", "s3/2006-03-01/service-2", "dynamodb/2012-08-10/service-2"):
        path = str(data / name)
        CachingFileLoader(tmp_path).load_file(path)  # writes the copy
        from_copy = CachingFileLoader(tmp_path).load_file(path)
        assert from_copy == plain.load_file(path), name
        assert list(from_copy) == list(plain.load_file(path)), name  # key order kept


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
