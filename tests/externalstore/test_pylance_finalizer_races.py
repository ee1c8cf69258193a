"""pylance's finalizer racing ours on one external-store entry.

* pylance's finalizer (unconditional copy, PutItem ``attribute_exists`` that
  does not check the path, delete staged) at every point of our commit;
* several finalizers racing a third that deletes the staged object after its
  flip -- every interleaving explored;
* a clean loss to a pylance-finalized entry reads nothing, and the finalizer's
  errors name no tool that does not exist.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import boto3
import pytest
from interleavings import DictWorld, Stepper, explore, pylance_finalizer

from lancetx.commit.errors import VersionAlreadyExistsError
from lancetx.commit.format.listing import list_manifest_locations
from lancetx.commit.format.location import ManifestLocation, TransactionSummary
from lancetx.commit.format.naming import NamingScheme, manifest_key, staged_manifest_key
from lancetx.commit.storage.objectstore import ObjectStore
from lancetx.demo.embedded import EmbeddedAws
from lancetx.externalstore.base import ManifestEntry
from lancetx.externalstore.dynamodb.config import DynamoDBConfig, make_client
from lancetx.externalstore.dynamodb.store import DynamoDBManifestStore, create_table
from lancetx.externalstore.errors import (
    EntryMismatchError,
    ManifestCopyMismatchError,
    ManifestMissingError,
    UntrustedManifestPathError,
)
from lancetx.externalstore.protocol import (
    Effect,
    Table,
    commit_steps,
    finalize_steps,
    resolve_steps,
)

ROWS = 10
V2 = NamingScheme.V2


def _base(path: str) -> str:
    return os.path.abspath(path).lstrip("/")


def _manifest_keys(store: ObjectStore, base: str) -> dict[int, str]:
    return {loc.version: loc.key for loc in list_manifest_locations(store, base)}


def _bytes_of(store: ObjectStore, keys: dict[int, str]) -> dict[int, bytes]:
    return {v: store.get(k) for v, k in keys.items()}


def test_our_flip_after_pylance_flipped_is_success_on_dynamodb(
    aws: EmbeddedAws, ddb_table_name: str
) -> None:
    """DynamoDB, real requests: the entry was claimed by us (staged path + token);
    pylance's finalizer replaced the whole item (final path, no token, its own
    committer) without checking the path. Our flip, conditioned on the staged
    path, is then a no-op success; a flip to any OTHER path is refused; and
    pylance's PutItem cannot create an item for an unclaimed version."""
    options = aws.pylance_storage_options()
    client = make_client(DynamoDBConfig.from_options(options))
    create_table(client, ddb_table_name)
    store = DynamoDBManifestStore(client, ddb_table_name)
    base = "b/t.lance"
    token = "11111111-1111-4111-8111-111111111111"
    staged = staged_manifest_key(base, 7, V2, token)
    final = manifest_key(base, 7, V2)
    ours = ManifestEntry(base, 7, staged, 100, committer="lancetx", commit_token=token)
    store.put_if_not_exists(ours)

    raw = boto3.client("dynamodb", **aws.client_kwargs("dynamodb"))

    def pylance_put_if_exists(version: int, path: str) -> None:
        raw.put_item(
            TableName=ddb_table_name,
            Item={
                "base_uri": {"S": base},
                "version": {"N": str(version)},
                "path": {"S": path},
                "size": {"N": "100"},
                "committer": {"S": "lancedb"},
            },
            ConditionExpression="attribute_exists(base_uri) AND attribute_exists(version)",
        )

    pylance_put_if_exists(7, final)
    store.put_if_exists(replace(ours, path=final), expected_path=staged)  # no error
    after = store.get(base, 7)
    assert after.path == final and after.commit_token is None and after.committer == "lancedb"

    elsewhere = staged_manifest_key(base, 7, V2, "33333333-3333-4333-8333-333333333333")
    with pytest.raises(EntryMismatchError):
        store.put_if_exists(replace(ours, path=elsewhere), expected_path=staged)
    assert store.get(base, 7).path == final

    with pytest.raises(raw.exceptions.ConditionalCheckFailedException):
        pylance_put_if_exists(8, manifest_key(base, 8, V2))
    assert [e.version for e in store.list_entries(base)] == [7]


@pytest.mark.parametrize("pylance_at", range(6))
def test_pylance_finalizer_at_every_point_of_our_commit(pylance_at: int) -> None:
    """A pylance finalizer runs to completion after each effect of our commit
    (stage, claim, copy, flip, delete). Our commit is acknowledged exactly when
    it is committed, the entry ends at the final path, and the final object
    holds our bytes: pylance's path-blind PutItem never points anywhere else."""
    world = DictWorld()
    table = Table("t", "t")
    ours = b"our manifest v1"
    writer = Stepper(commit_steps(table, 1, V2, ours))
    for _ in range(pylance_at):
        if writer.done:
            break
        writer.step(world)
    pylance = Stepper(pylance_finalizer(table))
    while not pylance.done:
        pylance.step(world)
    assert pylance.error is None
    while not writer.done:
        writer.step(world)

    assert writer.error is None, repr(writer.error)
    assert writer.result.location.version == 1
    (entry,) = world.entries.entries()
    assert entry.path == manifest_key("t", 1, V2)
    assert world.objects[entry.path] == ours
    assert [k for k in world.objects if k != entry.path] == [], "staged object left behind"


def _q2_world(readers: int, with_writer: bool) -> tuple[DictWorld, list[Stepper]]:
    """Version 1 claimed by writer W (staged, not finalized); a loser of the same
    version crashed before deleting ITS staged object (different uuid, other bytes)."""
    world = DictWorld()
    table = Table("t", "t")
    token = "11111111-1111-4111-8111-111111111111"
    staged = staged_manifest_key("t", 1, V2, token)
    world.objects[staged] = b"the winner's manifest"
    loser = staged_manifest_key("t", 1, V2, "22222222-2222-4222-8222-222222222222")
    world.objects[loser] = b"a loser's manifest, never committed!"
    entry = ManifestEntry("t", 1, staged, len(world.objects[staged]), commit_token=token)
    world.entries.put_if_not_exists(entry)
    actors = [Stepper(pylance_finalizer(table))]
    actors += [Stepper(resolve_steps(table)) for _ in range(readers)]
    if with_writer:
        actors.append(Stepper(finalize_steps(table, entry)))
    return world, actors


def _q2_check(world: DictWorld, actors: list[Stepper]) -> None:
    final = manifest_key("t", 1, V2)
    for actor in actors:
        assert not isinstance(actor.error, ManifestMissingError), actor.error
        assert actor.error is None, repr(actor.error)
    (entry,) = world.entries.entries()
    assert entry.path == final
    assert world.objects[final] == b"the winner's manifest"
    for actor in actors[1:]:
        if isinstance(actor.result, ManifestLocation):
            assert actor.result.key == final and actor.result.alternate_key is None


@pytest.mark.parametrize(
    ("readers", "with_writer"),
    [(2, False), (1, True)],
    ids=["pylance+2readers", "pylance+reader+writer"],
)
def test_racing_finalizers_every_interleaving(readers: int, with_writer: bool) -> None:
    """Every interleaving of a pylance finalizer (which deletes the staged object
    right after its flip) with lancetx readers and the writer finishing its own
    commit: nobody gets ManifestMissingError for the healthy version, the entry
    ends final, and the final object holds the winner's bytes, never the loser's
    staged object of the same version."""
    explored = explore(lambda: _q2_world(readers, with_writer), _q2_check)
    assert explored > 500  # orders of commuting effects run once each (see explore)


def test_reader_seeing_staged_gone_and_final_wrong_size_refuses() -> None:
    """A final object with other bytes (a legacy writer, not a finalizer) is never
    flipped to: the reader refuses instead of loading it."""
    world, _ = _q2_world(0, False)
    world.objects.pop(staged_manifest_key("t", 1, V2, "11111111-1111-4111-8111-111111111111"))
    world.objects[manifest_key("t", 1, V2)] = b"something else entirely, longer"
    reader = Stepper(resolve_steps(Table("t", "t")))
    while not reader.done:
        reader.step(world)
    assert isinstance(reader.error, ManifestCopyMismatchError)
    assert world.entries.entries()[0].is_staged


def test_entry_naming_another_versions_staged_object_is_never_copied() -> None:
    world = DictWorld()
    other = staged_manifest_key("t", 4, V2, "11111111-1111-4111-8111-111111111111")
    world.objects[other] = b"version 4"
    world.entries.put_if_not_exists(ManifestEntry("t", 5, other, 9))
    reader = Stepper(resolve_steps(Table("t", "t")))
    while not reader.done:
        reader.step(world)
    assert isinstance(reader.error, UntrustedManifestPathError)
    assert set(world.objects) == {other}


def test_a_clean_loss_to_a_pylance_finalized_entry_reads_no_object() -> None:
    """Nothing of ours can have landed: the winner's tokenless final entry is
    theirs without downloading its manifest."""
    world = DictWorld()
    world.entries.put_if_not_exists(ManifestEntry("t", 1, manifest_key("t", 1, V2), 5))
    world.objects[manifest_key("t", 1, V2)] = b"their"
    effects: list[str] = []

    def log(effect: Effect) -> Any:
        effects.append(type(effect).__name__)
        return world(effect)

    writer = Stepper(commit_steps(Table("t", "t"), 1, V2, b"ours"))
    while not writer.done:
        writer.step(log)
    assert isinstance(writer.error, VersionAlreadyExistsError)
    assert effects == ["PutObject", "ClaimEntry", "DeleteObject"]


def test_error_messages_name_no_tool_that_does_not_exist() -> None:
    import re

    import typer

    from lancetx.cli.app import app

    commands = set(typer.main.get_group(app).commands)
    missing = ManifestMissingError("t", 1, "a", "b")
    untrusted = UntrustedManifestPathError("t", 1, "x", "t/_versions/")
    for message in (str(missing), str(untrusted)):
        named = re.findall(r"lancetx-sync ([a-z-]+)", message)
        assert named and set(named) <= commands, message


def _summary_world(pylances: int) -> tuple[DictWorld, list[Stepper]]:
    """Version 1 claimed by us from the commit queue (the entry carries our summary
    and ticket), staged; ``pylances`` pylance readers race our own finalization."""
    world, _ = _q2_world(0, False)
    (entry,) = world.entries.entries()
    ours = replace(entry, summary=TransactionSummary("Append", "u-1", ticket=3, claimed_at=1.0))
    world.entries.put_if_exists(ours, expected_path=entry.path)
    table = Table("t", "t")
    actors = [Stepper(pylance_finalizer(table)) for _ in range(pylances)]
    actors.append(Stepper(finalize_steps(table, ours, ours=True)))
    return world, actors


def _outcome(world: DictWorld, actors: list[Stepper]) -> tuple[Any, ...]:
    entries = tuple((e.path, e.summary) for e in world.entries.entries())
    results = tuple((repr(a.error), getattr(a.result, "path", None)) for a in actors)
    return entries, tuple(sorted(world.objects.items())), results


def _every_order(make: Any, check: Any) -> None:
    def visit(prefix: list[int]) -> None:
        world, actors = make()
        for who in prefix:
            actors[who].step(world)
        live = [i for i, a in enumerate(actors) if not a.done]
        if not live:
            check(world, actors)
        for who in live:
            visit([*prefix, who])

    visit([])


def test_pylance_racing_our_finalizer_leaves_our_summary_unless_it_flips_last() -> None:
    """Every order of a pylance reader's finalization against ours (run in full,
    and as the reduced exploration runs them: both reach the same outcomes). The
    entry always ends final at our bytes; our summary (with its queue ticket) is
    put back whenever we see pylance's rewrite, and lost only when pylance's
    PutItem lands after our own flip."""
    full: set[tuple[Any, ...]] = set()
    reduced: set[tuple[Any, ...]] = set()
    _every_order(lambda: _summary_world(1), lambda w, a: full.add(_outcome(w, a)))
    explore(lambda: _summary_world(1), lambda w, a: reduced.add(_outcome(w, a)))
    assert reduced == full
    summaries = set()
    for entries, objects, results in full:
        ((path, summary),) = entries
        assert path == manifest_key("t", 1, V2)
        assert dict(objects) == {path: b"the winner's manifest", **_loser(objects)}
        assert all(error == "None" for error, _ in results)
        summaries.add(summary is not None)
    assert summaries == {True, False}


def _loser(objects: tuple[tuple[str, bytes], ...]) -> dict[str, bytes]:
    loser = staged_manifest_key("t", 1, V2, "22222222-2222-4222-8222-222222222222")
    return {k: v for k, v in objects if k == loser}
