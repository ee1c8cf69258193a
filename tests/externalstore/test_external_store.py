"""The external manifest store contract, run against every implementation:
the in-memory store, the DynamoDB store (boto3) and the async DynamoDB store
(aioboto3) on the embedded moto server. Plus unit tests of the pure parts:
ManifestEntry, ownership resolution, the retry policy and classifier, and the
in-memory store's fault injection."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)

from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.base import ManifestEntry, Ownership, ownership_of, pointer_flip_done
from lancetx.externalstore.dynamodb.botocore_errors import translate_error
from lancetx.externalstore.dynamodb.config import DynamoDBConfig, make_client
from lancetx.externalstore.dynamodb.retry import (
    Attempts,
    ErrorKind,
    RetryPolicy,
    backoff_delays,
    classify,
)
from lancetx.externalstore.dynamodb.store import DynamoDBManifestStore, create_table
from lancetx.externalstore.dynamodb.store_async import AsyncDynamoDBManifestStore, open_client
from lancetx.externalstore.errors import (
    AccessDeniedError,
    AmbiguousWriteError,
    DynamoDBTableNotFoundError,
    DynamoDBTarget,
    EndpointUnreachableError,
    EntryExistsError,
    EntryMismatchError,
    EntryNotFoundError,
    ExternalStoreError,
    InvalidRequestError,
    ServiceUnavailableError,
    ThrottledError,
)
from lancetx.externalstore.memory import MemoryManifestStore

#: Runs against any real S3 + DynamoDB too: make test-localstack (LocalStack S3 + dynalite).
pytestmark = pytest.mark.integration

BASE = "warehouse/t.lance"
FAST_RETRY = RetryPolicy(max_attempts=4, base_delay=0.001, max_delay=0.01)


def staged(version: int, token: str, base: str = BASE) -> ManifestEntry:
    """An entry as a committer writes it in step 2: staged path embedding its token."""
    return ManifestEntry(
        base, version, f"{base}/_versions/{version}.manifest-{token}", 100, None, None, token
    )


def final(version: int, base: str = BASE, **kw: Any) -> ManifestEntry:
    return ManifestEntry(base, version, f"{base}/_versions/{version}.manifest", 100, **kw)


def client_error(code: str, status: int = 400, item: dict[str, Any] | None = None) -> ClientError:
    response: dict[str, Any] = {
        "Error": {"Code": code, "Message": f"{code} message"},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    if item is not None:
        response["Item"] = item
    return ClientError(response, "PutItem")  # type: ignore[arg-type]


# =========================================================================== harness


class LoopThread:
    """An event loop in a thread, so sync test code can drive an async store
    (whose aiobotocore client is bound to one loop) call by call."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=120)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


class Harness:
    """One store under test behind a blocking interface."""

    def __init__(self, store: Any, loop: LoopThread | None = None) -> None:
        self.store = store
        self.loop = loop

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.store, name)
        if self.loop is None:
            return method  # type: ignore[no-any-return]
        loop = self.loop
        return lambda *args, **kwargs: loop.run(method(*args, **kwargs))

    def race_put(self, entries: list[ManifestEntry]) -> list[BaseException | None]:
        """put_if_not_exists of every entry at once; the exception (or None) of each."""
        if self.loop is not None:

            async def one(entry: ManifestEntry) -> BaseException | None:
                try:
                    await self.store.put_if_not_exists(entry)
                except Exception as exc:
                    return exc
                return None

            async def all_of() -> list[BaseException | None]:
                return list(await asyncio.gather(*(one(e) for e in entries)))

            return self.loop.run(all_of())  # type: ignore[no-any-return]

        results: list[BaseException | None] = [None] * len(entries)
        barrier = threading.Barrier(len(entries))

        def worker(i: int) -> None:
            barrier.wait()
            try:
                self.store.put_if_not_exists(entries[i])
            except Exception as exc:
                results[i] = exc

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(entries))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results


@pytest.fixture(params=["memory", "dynamodb-sync", "dynamodb-async"])
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    if request.param == "memory":
        yield Harness(MemoryManifestStore())
        return
    aws: EmbeddedAws = request.getfixturevalue("aws")
    table: str = request.getfixturevalue("ddb_table_name")
    config = DynamoDBConfig.from_options(aws.pylance_storage_options())
    create_table(make_client(config), table)
    if request.param == "dynamodb-sync":
        yield Harness(DynamoDBManifestStore.from_config(table, config, page_size=3))
        return
    loop = LoopThread()
    stack = contextlib.AsyncExitStack()
    try:
        client = loop.run(stack.enter_async_context(open_client(config)))
        store = AsyncDynamoDBManifestStore(client, table, page_size=3)
        loop.run(store.validate())
        yield Harness(store, loop)
    finally:
        loop.run(stack.aclose())
        loop.close()


# =========================================================================== contract


def test_race_on_one_version_has_exactly_one_winner(harness: Harness) -> None:
    entries = [staged(1, str(uuid.uuid4())) for _ in range(16)]
    results = harness.race_put(entries)
    winners = [e for e, r in zip(entries, results, strict=True) if r is None]
    assert len(winners) == 1, results
    stored = harness.get(BASE, 1)
    assert stored.commit_token == winners[0].commit_token
    assert stored.path == winners[0].path
    losers = [r for r in results if r is not None]
    assert len(losers) == 15
    for error in losers:
        assert isinstance(error, EntryExistsError), error
        assert error.existing == stored
        assert error.version == 1
        assert "dynamodb:PutItem" in str(error)


def test_get_latest_and_missing(harness: Harness) -> None:
    assert harness.latest(BASE) is None
    with pytest.raises(EntryNotFoundError) as info:
        harness.get(BASE, 1)
    assert info.value.version == 1 and "dynamodb:GetItem" in str(info.value)
    for v in (1, 2, 3):
        harness.put_if_not_exists(final(v, e_tag=f"etag{v}", committer="someone"))
    harness.put_if_not_exists(final(7, base="other/t.lance"))
    latest = harness.latest(BASE)
    assert latest == final(3, e_tag="etag3", committer="someone")
    got = harness.get(BASE, 2)
    assert (got.version, got.e_tag, got.size, got.is_staged) == (2, "etag2", 100, False)


def test_put_if_not_exists_is_idempotent_for_the_same_token(harness: Harness) -> None:
    mine = staged(4, "token-a")
    harness.put_if_not_exists(mine)
    harness.put_if_not_exists(mine)  # a retried request whose first attempt landed
    with pytest.raises(EntryExistsError) as info:
        harness.put_if_not_exists(staged(4, "token-b"))
    assert info.value.existing is not None and info.value.existing.commit_token == "token-a"


def test_list_entries_since_is_ascending_and_paginated(harness: Harness) -> None:
    for v in (5, 1, 3, 2, 4, 6, 7, 8):
        harness.put_if_not_exists(final(v))
    harness.put_if_not_exists(final(1, base="warehouse/t.lance2"))
    assert [e.version for e in harness.list_entries(BASE)] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert [e.version for e in harness.list_entries(BASE, since=3)] == [4, 5, 6, 7, 8]
    assert harness.list_entries(BASE, since=8) == []
    assert harness.list_entries("nothing/here") == []


def test_pointer_flip(harness: Harness) -> None:
    claim = staged(1, "tok")
    harness.put_if_not_exists(claim)
    flipped = replace(claim, path=f"{BASE}/_versions/1.manifest", e_tag="e1")
    # Refused when the entry points elsewhere than expected: never clobber another commit.
    with pytest.raises(EntryMismatchError) as info:
        harness.put_if_exists(flipped, expected_path=f"{BASE}/_versions/1.manifest-someone-else")
    assert info.value.existing is not None and info.value.existing.path == claim.path
    assert harness.get(BASE, 1).path == claim.path
    harness.put_if_exists(flipped, expected_path=claim.path)
    assert harness.get(BASE, 1) == replace(flipped, committer=harness.get(BASE, 1).committer)
    assert not harness.get(BASE, 1).is_staged
    # A second finalizer doing the same flip is a no-op success.
    harness.put_if_exists(flipped, expected_path=claim.path)
    # No entry: refused.
    with pytest.raises(EntryNotFoundError):
        harness.put_if_exists(final(2), expected_path=staged(2, "x").path)
    with pytest.raises(EntryNotFoundError):
        harness.put_if_exists(final(2))
    # Without expected_path only existence is required.
    harness.put_if_exists(replace(flipped, size=5))
    assert harness.get(BASE, 1).size == 5


def test_delete_all_spans_pages(harness: Harness) -> None:
    for v in range(1, 11):  # page_size=3 for the DynamoDB stores: 4 pages
        harness.put_if_not_exists(final(v))
    harness.put_if_not_exists(final(1, base="keep/me"))
    harness.delete_all(BASE)
    assert harness.list_entries(BASE) == []
    assert harness.latest(BASE) is None
    assert [e.version for e in harness.list_entries("keep/me")] == [1]
    harness.delete_all("absent/table")  # nothing to delete is fine


def test_commit_token_and_optional_attributes_round_trip(harness: Harness) -> None:
    bare = ManifestEntry(BASE, 9, f"{BASE}/_versions/9.manifest")
    harness.put_if_not_exists(bare)
    got = harness.get(BASE, 9)
    assert (got.size, got.e_tag, got.commit_token) == (None, None, None)
    full = staged(10, "t-10")
    harness.put_if_not_exists(full)
    assert harness.get(BASE, 10).commit_token == "t-10"
    assert harness.get(BASE, 10).is_staged


# =========================================================================== pure units


def test_manifest_entry_validation_and_staged() -> None:
    assert staged(1, "x").is_staged
    assert not final(1).is_staged
    assert ManifestEntry("b", 1, "b/_versions/18446744073709551614.manifest").is_staged is False
    for bad in (
        lambda: ManifestEntry("", 1, "p"),
        lambda: ManifestEntry("b", -1, "p"),
        lambda: ManifestEntry("b", 1, ""),
        lambda: ManifestEntry("b", True, "p"),
        lambda: ManifestEntry("b", 1, "p", size=-1),
    ):
        with pytest.raises(ValueError):
            bad()


def test_ownership_resolution() -> None:
    mine = staged(3, "aaa")
    assert ownership_of(mine, mine) is Ownership.MINE
    # Our commit finalized by a token-aware finalizer: still ours.
    assert ownership_of(replace(mine, path=final(3).path), mine) is Ownership.MINE
    assert ownership_of(staged(3, "bbb"), mine) is Ownership.THEIRS
    # A Lance writer's staged entry (no token, other uuid).
    assert ownership_of(replace(staged(3, "ccc"), commit_token=None), mine) is Ownership.THEIRS
    # Finalized by pylance (token dropped): cannot tell from the entry.
    assert ownership_of(final(3), mine) is Ownership.UNKNOWN
    # Same path without tokens (e.g. an onboarding backfill of a final path).
    assert ownership_of(final(3), final(3)) is Ownership.MINE
    assert pointer_flip_done(final(3), final(3)) and not pointer_flip_done(mine, final(3))


def test_backoff_is_bounded_jittered_and_deterministic_with_a_seed() -> None:
    policy = RetryPolicy(max_attempts=6, base_delay=0.1, max_delay=0.5)
    delays = list(backoff_delays(policy, random.Random(7)))
    assert len(delays) == 5
    caps = [0.1, 0.2, 0.4, 0.5, 0.5]
    assert all(0 <= d <= c for d, c in zip(delays, caps, strict=True))
    assert delays == list(backoff_delays(policy, random.Random(7)))
    assert len(set(delays)) > 1
    assert list(backoff_delays(RetryPolicy(max_attempts=1))) == []
    assert RetryPolicy(max_attempts=100, base_delay=1, max_delay=3).cap(10_000) == 3
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (client_error("ProvisionedThroughputExceededException"), ErrorKind.THROTTLED),
        (client_error("ThrottlingException"), ErrorKind.THROTTLED),
        (client_error("RequestLimitExceeded"), ErrorKind.THROTTLED),
        (client_error("TransactionConflictException"), ErrorKind.THROTTLED),
        (client_error("InternalServerError", 500), ErrorKind.MAYBE_APPLIED),
        (client_error("ServiceUnavailable", 503), ErrorKind.MAYBE_APPLIED),
        (client_error("ConditionalCheckFailedException"), ErrorKind.CONDITION_FAILED),
        (client_error("AccessDeniedException"), ErrorKind.FATAL),
        (client_error("ValidationException"), ErrorKind.FATAL),
        (client_error("ResourceNotFoundException"), ErrorKind.FATAL),
        (EndpointConnectionError(endpoint_url="http://x"), ErrorKind.UNREACHABLE),
        (ConnectTimeoutError(endpoint_url="http://x"), ErrorKind.UNREACHABLE),
        # aiobotocore's wrapping of a reset after the request was sent
        (
            EndpointConnectionError(
                endpoint_url="http://x", error=aiohttp.ClientOSError(104, "reset by peer")
            ),
            ErrorKind.MAYBE_APPLIED,
        ),
        (ReadTimeoutError(endpoint_url="http://x"), ErrorKind.MAYBE_APPLIED),
        (ConnectionClosedError(endpoint_url="http://x"), ErrorKind.MAYBE_APPLIED),
        (NoCredentialsError(), ErrorKind.FATAL),
        (RuntimeError("x"), ErrorKind.FATAL),
    ],
)
def test_classify(exc: BaseException, kind: ErrorKind) -> None:
    assert classify(exc) is kind


def test_attempts_bookkeeping() -> None:
    attempts = Attempts(RetryPolicy(max_attempts=3, base_delay=0, max_delay=0))
    assert attempts.record(ErrorKind.THROTTLED, write=True) == 0
    assert not attempts.ambiguous
    assert attempts.record(ErrorKind.MAYBE_APPLIED, write=True) == 0
    assert attempts.ambiguous
    assert attempts.record(ErrorKind.THROTTLED, write=True) is None  # exhausted
    assert attempts.count == 3
    reads = Attempts(RetryPolicy(max_attempts=3))
    assert reads.record(ErrorKind.MAYBE_APPLIED, write=False) is not None
    assert not reads.ambiguous
    assert reads.record(ErrorKind.FATAL, write=False) is None


def test_translate_error_names_action_resource_and_remedy() -> None:
    target = DynamoDBTarget("T", "eu-west-1", "http://ddb.local:8000")
    resource = "arn:aws:dynamodb:eu-west-1:*:table/T"
    entry = staged(2, "tok")

    def check(exc: BaseException, cls: type[ExternalStoreError], *needles: str, **kw: Any) -> None:
        error = translate_error(exc, target, "PutItem", attempts=3, **kw)
        assert type(error) is cls, error
        assert "dynamodb:PutItem" in str(error) and resource in str(error)
        for needle in needles:
            assert needle in str(error), (needle, str(error))

    check(
        client_error("AccessDeniedException"),
        AccessDeniedError,
        "grant IAM action dynamodb:PutItem",
    )
    check(client_error("UnrecognizedClientException"), AccessDeniedError, "credentials")
    check(NoCredentialsError(), AccessDeniedError, "credentials")
    check(client_error("ThrottlingException"), ThrottledError, "3 attempts", "PAY_PER_REQUEST")
    check(
        client_error("ResourceNotFoundException"),
        DynamoDBTableNotFoundError,
        "create_table",
        "eu-west-1",
    )
    check(EndpointConnectionError(endpoint_url="http://ddb.local:8000"), EndpointUnreachableError,
          "http://ddb.local:8000", "dynamodb_endpoint")  # fmt: skip
    check(client_error("InternalServerError", 500), ServiceUnavailableError, "retry later")
    check(client_error("ValidationException"), InvalidRequestError, "ValidationException")
    # Any error after an attempt that may have landed: the outcome is unknown.
    check(
        client_error("ThrottlingException"),
        AmbiguousWriteError,
        "tok",
        "Do not delete",
        ambiguous_entry=entry,
    )
    assert DynamoDBTarget(
        "T", "eu-west-1", arn="arn:aws:dynamodb:eu-west-1:1:table/T"
    ).resource.endswith(":1:table/T")


# =========================================================================== memory faults


def test_memory_fail_next_changes_nothing() -> None:
    store = MemoryManifestStore()
    boom = ThrottledError("dynamodb:PutItem", "memory:x", "ThrottlingException", 1)
    store.fail_next("put_if_not_exists", boom)
    with pytest.raises(ThrottledError):
        store.put_if_not_exists(final(1))
    assert store.latest(BASE) is None
    store.put_if_not_exists(final(1))  # the fault was consumed
    store.fail_next(
        "get", EndpointUnreachableError("dynamodb:GetItem", "memory:x", None, "down", 1), times=2
    )
    for _ in range(2):
        with pytest.raises(EndpointUnreachableError):
            store.get(BASE, 1)
    assert store.get(BASE, 1) == final(1)
    assert store.calls["get"] == 3
    with pytest.raises(ValueError):
        store.fail_next("nope", boom)


def test_memory_land_then_fail_applies_the_write() -> None:
    store = MemoryManifestStore()
    mine = staged(1, "tok")
    store.land_then_fail("put_if_not_exists")
    with pytest.raises(AmbiguousWriteError) as info:
        store.put_if_not_exists(mine)
    assert info.value.entry == mine
    assert store.get(BASE, 1) == mine  # it landed
    store.put_if_not_exists(mine)  # retrying with the same token resolves it as ours
    store.land_then_fail("put_if_exists")
    with pytest.raises(AmbiguousWriteError):
        store.put_if_exists(final(1), expected_path=mine.path)
    assert store.get(BASE, 1) == final(1)
    store.put_if_exists(final(1), expected_path=mine.path)  # retry: already flipped
    with pytest.raises(ValueError):
        store.land_then_fail("get")


def test_memory_hook_interleaves_a_competitor() -> None:
    store = MemoryManifestStore()
    done: list[bool] = []

    def competitor(s: MemoryManifestStore) -> None:
        if not done:
            done.append(True)
            s.put_if_not_exists(staged(1, "competitor"))

    store.on_call("put_if_not_exists", competitor)
    with pytest.raises(EntryExistsError) as info:
        store.put_if_not_exists(staged(1, "me"))
    assert info.value.existing is not None and info.value.existing.commit_token == "competitor"
    store.clear_faults()


def test_memory_async_view_shares_state() -> None:
    store = MemoryManifestStore()
    view = store.as_async()

    async def main() -> ManifestEntry | None:
        await view.put_if_not_exists(final(1))
        await view.put_if_exists(final(1, e_tag="x"))
        assert [e.version for e in await view.list_entries(BASE)] == [1]
        assert (await view.get(BASE, 1)).e_tag == "x"
        latest = await view.latest(BASE)
        await view.delete_all(BASE)
        return latest

    assert asyncio.run(main()) == final(1, e_tag="x")
    assert store.entries() == []
