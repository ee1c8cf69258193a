"""Re-planning: a verb that meets a retryable conflict plans again on the new version.

Three writers plan against the same version: two deletes whose rows overlap and a
compaction of the same fragments. All three land; pylance reads the right rows.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import boto3
import lance
import pytest
from table_helpers import Api, api_fixture, ddb_uri, ids

import lancetx
from lancetx.commit.errors import RetryableConflictError
from lancetx.committing import MAX_REPLANS
from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.dynamodb.store import create_table

EXPECTED = [i for i in range(200) if not 40 <= i < 100]


@pytest.fixture(params=["sync", "async"])
def api(request: pytest.FixtureRequest) -> Iterator[Api]:
    yield from api_fixture(request)


@pytest.fixture
def options(aws: EmbeddedAws) -> dict[str, str]:
    return aws.pylance_storage_options()


@pytest.fixture
def uri(aws: EmbeddedAws, bucket: str, ddb_table_name: str, options: dict[str, str]) -> str:
    create_table(boto3.client("dynamodb", **aws.client_kwargs()), ddb_table_name)
    uri = ddb_uri(bucket, ddb_table_name)
    lancetx.write_table(uri, ids(200), storage_options=options, max_rows_per_file=20)
    return uri


def test_stale_planners_all_land(api: Api, uri: str, options: dict[str, str]) -> None:
    # Each Table knows version 1 only: each plans against it, as racing writers do.
    first, second, third = (api.open(uri, options) for _ in range(3))
    v2 = api.run(first.delete("id >= 40 AND id < 80"))
    v3 = api.run(second.delete("id >= 60 AND id < 100"))  # rows 60..79 already gone
    assert second.last_commit.plans == 2
    v4 = api.run(third.compact({"target_rows_per_fragment": 1000}))
    assert third.last_commit.plans == 2
    assert (v2, v3, v4) == (2, 3, 4)
    ds = lance.dataset(uri, storage_options=options)
    assert sorted(ds.to_table()["id"].to_pylist()) == EXPECTED
    assert len(ds.get_fragments()) == 1
    assert [h.operation for h in api.history(third)] == ["Overwrite", "Delete", "Delete", "Rewrite"]


def test_without_replanning_the_overlap_is_a_conflict(uri: str, options: dict[str, str]) -> None:
    """The same race, with re-planning disabled (strict mode never re-plans)."""
    first, second = lancetx.open(uri, options), lancetx.open(uri, options)
    first.delete("id >= 40 AND id < 80")
    with pytest.raises(lancetx.ExpectedVersionMismatchError):
        second.delete("id >= 60 AND id < 100", expected_version=1)
    assert MAX_REPLANS >= 1


def test_concurrent_deletes_and_compaction_in_threads(uri: str, options: dict[str, str]) -> None:
    tables = [lancetx.open(uri, options) for _ in range(3)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(3)

    def run(work: Any) -> None:
        barrier.wait()
        try:
            work()
        except BaseException as exc:
            errors.append(exc)

    jobs = [
        lambda: tables[0].delete("id >= 40 AND id < 80"),
        lambda: tables[1].delete("id >= 60 AND id < 100"),
        lambda: tables[2].compact({"target_rows_per_fragment": 1000}),
    ]
    threads = [threading.Thread(target=run, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert not any(isinstance(e, RetryableConflictError) for e in errors)
    ds = lance.dataset(uri, storage_options=options)
    assert ds.version == 4
    assert sorted(ds.to_table()["id"].to_pylist()) == EXPECTED
