"""Tags (``Table.tags``, ``checkout(tag)``, ``open(version=tag)``), stored as Lance
stores them: pylance and lancetx see each other's tags, refuse the same names, and
a tag never names a version a cleanup removed."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pytest
from protocol_helpers import batch, ddb_uri, ensure_ddb_table

import lancetx
import lancetx.aio
from lancetx.commit.storage.objectstore import ObjectMeta
from lancetx.demo.embedded import EmbeddedAws
from lancetx.ops.cleanup import cleanup_versions
from lancetx.ops.table import open_table


def _local_table(tmp_path: Path, versions: int = 4) -> lancetx.Table:
    """Versions 1..``versions`` of a local table, ``k`` rows at version ``k``."""
    table = lancetx.write_table(str(tmp_path / "t.lance"), pa.table({"id": [0]}))
    for n in range(1, versions):
        table.append(pa.table({"id": [n]}))
    return table


def _tag_document(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def test_lancetx_and_pylance_see_each_others_tags_through_ddb(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    options = legacy_aws.pylance_storage_options()
    ensure_ddb_table(options, ddb_table_name)
    uri = ddb_uri(bucket, "t.lance", ddb_table_name)
    table = lancetx.write_table(uri, batch("w", 0, 3), storage_options=options)
    for n in range(1, 4):
        table.append(batch("w", n, 3))  # versions 1..4

    created = table.tags.create("from-lancetx", 2)
    assert (created.name, created.version, created.branch) == ("from-lancetx", 2, None)
    ds = lance.dataset(uri, storage_options=options)
    ds.tags.create("from-pylance", 2)  # pylance's file for the same version: same fields
    seen = ds.tags.list()
    assert seen["from-lancetx"]["version"] == 2
    assert seen["from-lancetx"]["manifest_size"] == seen["from-pylance"]["manifest_size"]
    assert set(seen["from-lancetx"]) == set(seen["from-pylance"])
    assert lance.dataset(uri, version="from-lancetx", storage_options=options).count_rows() == 6

    ds.tags.create("p3", 3)
    # a legacy bucket has no conditional PUT: "already exists" is read, and refused alike
    with pytest.raises(lancetx.TagExistsError, match=r"'p3' already exists \(version 3\)"):
        table.tags.create("p3", 1)
    listed = table.tags.list()
    assert {name: t.version for name, t in listed.items()} == {
        "from-lancetx": 2,
        "from-pylance": 2,
        "p3": 3,
    }
    assert listed["p3"].manifest_size > 0 and listed["p3"].created_at is not None
    assert table.checkout("p3").count_rows() == 9
    assert lancetx.open(uri, options, version="p3").version == 3
    assert lancetx.open(uri, options, version="from-pylance").count_rows() == 6

    # update and delete, each way
    table.tags.update("p3", 4)
    assert lance.dataset(uri, storage_options=options).tags.get_version("p3") == 4
    ds.tags.update("from-lancetx", 1)
    assert table.tags.get_version("from-lancetx") == 1
    ds.tags.delete("from-lancetx")
    table.tags.delete("from-pylance")
    assert list(table.tags.list()) == ["p3"]
    assert list(lance.dataset(uri, storage_options=options).tags.list()) == ["p3"]


def test_the_tag_file_has_pylances_fields_and_format(tmp_path: Path) -> None:
    table = _local_table(tmp_path)
    table.tags.create("ours", 3)
    lance.dataset(table.uri).tags.create("theirs", 3)
    tags_dir = tmp_path / "t.lance" / "_refs" / "tags"
    ours, theirs = _tag_document(tags_dir / "ours.json"), _tag_document(tags_dir / "theirs.json")
    assert list(ours) == list(theirs)  # same fields, same order
    for field in ("branch", "version", "manifestSize", "metadata"):
        assert ours[field] == theirs[field], field
    assert ours["createdAt"].endswith("Z") and ours["createdAt"] == ours["updatedAt"]
    # pretty-printed as pylance does, so a diff of the two files shows only the times
    assert (tags_dir / "ours.json").read_text().splitlines()[1] == '  "branch": null,'

    # update keeps the creation time and moves updatedAt, as pylance's does
    table.tags.update("ours", 2)
    moved = _tag_document(tags_dir / "ours.json")
    assert moved["createdAt"] == ours["createdAt"] and moved["version"] == 2
    assert lance.dataset(table.uri).tags.list()["ours"]["version"] == 2


def test_a_tag_names_a_version_by_number_or_by_another_tag(tmp_path: Path) -> None:
    table = _local_table(tmp_path)
    table.tags.create("a", 2)
    assert table.tags.create("b", "a").version == 2
    assert table.tags.update("b", 3).version == 3
    checked_out = table.checkout("b")
    assert (checked_out.version, checked_out.read_only, checked_out.count_rows()) == (3, True, 3)
    # a read-only view manages tags too (they are not commits)
    checked_out.tags.delete("a")
    assert list(lancetx.open(table.uri).tags.list()) == ["b"]


def test_unknown_tags_name_the_tag_and_list_the_existing_ones(tmp_path: Path) -> None:
    table = _local_table(tmp_path)
    with pytest.raises(lancetx.TagNotFoundError, match="the table has no tags"):
        table.checkout("nope")
    table.tags.create("gold", 2)
    table.tags.create("silver", 3)
    for attempt in (
        lambda: table.checkout("nope"),
        lambda: lancetx.open(table.uri, version="nope"),
        lambda: table.tags.delete("nope"),
        lambda: table.tags.update("nope", 1),
        lambda: table.tags.create("x", "nope"),
    ):
        with pytest.raises(lancetx.TagNotFoundError) as caught:
            attempt()
        assert "'nope'" in str(caught.value)
        assert "'gold' (version 2), 'silver' (version 3)" in str(caught.value)
        assert caught.value.existing == {"gold": 2, "silver": 3}
    assert isinstance(caught.value, LookupError)


def test_a_tag_that_exists_is_refused_and_kept(tmp_path: Path) -> None:
    table = _local_table(tmp_path)
    table.tags.create("gold", 2)
    with pytest.raises(lancetx.TagExistsError, match=r"'gold' already exists \(version 2\)"):
        table.tags.create("gold", 3)
    assert table.tags.get_version("gold") == 2
    with pytest.raises(lancetx.TagExistsError):
        lancetx.open(table.uri).tags.create("gold", 1)
    # pylance refuses ours as its own
    with pytest.raises(ValueError, match="already exists"):
        lance.dataset(table.uri).tags.create("gold", 1)


def test_a_version_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    table = _local_table(tmp_path)
    with pytest.raises(lancetx.VersionNotFoundError, match=r"version 9 .*versions 1, 2, 3, 4"):
        table.tags.create("far", 9)
    assert table.tags.list() == {}
    table.tags.create("near", 4)
    with pytest.raises(lancetx.VersionNotFoundError, match="version 0 "):
        table.tags.update("near", 0)
    assert table.tags.get_version("near") == 4


def test_a_version_a_cleanup_removed_is_refused_naming_the_cleanup(tmp_path: Path) -> None:
    table = _local_table(tmp_path)
    assert cleanup_versions(open_table(table.uri), keep_versions=2).removed_versions == [1, 2]
    with pytest.raises(lancetx.VersionNotFoundError, match="a cleanup removed it"):
        table.tags.create("old", 1)
    table.tags.create("kept", 3)
    with pytest.raises(lancetx.VersionNotFoundError, match="a cleanup removed it"):
        table.tags.update("kept", 2)
    assert table.tags.get_version("kept") == 3
    assert list((tmp_path / "t.lance" / "_refs" / "tags").iterdir()) == [
        tmp_path / "t.lance" / "_refs" / "tags" / "kept.json"
    ]


GOOD_NAMES = ["ref", "ref-with-dashes", "ref.extension", "ref_with_underscores", "v1.2.3-rc4"]
BAD_NAMES = [
    "",
    "../ref",
    ".ref",
    "/ref",
    "@",
    "nested/ref",
    "nested\\ref",
    "ref*",
    "ref.lock",
    "ref/",
    "ref?",
    "ref@{ref",
    "ref[",
    "ref^",
    "~/ref",
    "ref.",
    "ref..ref",
    "with space",
]


def test_lancetx_refuses_exactly_the_names_pylance_refuses(tmp_path: Path) -> None:
    table = _local_table(tmp_path, versions=2)
    ds = lance.dataset(table.uri)
    for name in BAD_NAMES:
        with pytest.raises(lancetx.InvalidTagNameError) as caught:
            table.tags.create(name, 1)
        assert repr(name) in str(caught.value)
        with pytest.raises((OSError, ValueError)):
            ds.tags.create(name, 1)
        with pytest.raises(lancetx.InvalidTagNameError):
            table.checkout(name)
    for n, name in enumerate(GOOD_NAMES):
        table.tags.create(name, 1 + n % 2)
    assert {n: t["version"] for n, t in lance.dataset(table.uri).tags.list().items()} == {
        name: 1 + n % 2 for n, name in enumerate(GOOD_NAMES)
    }
    tags_dir = tmp_path / "t.lance" / "_refs" / "tags"
    assert sorted(p.name for p in tags_dir.iterdir()) == sorted(f"{n}.json" for n in GOOD_NAMES)


def test_a_tag_on_a_version_removed_while_tagging_is_withdrawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cleanup that removes the version between the check and the tag's write: the
    tag is deleted again and the error says so (deterministic: the cleanup runs
    inside the tag's write, just before the PUT)."""
    table = _local_table(tmp_path)
    store = table._state.conn.handler.store
    manifests = tmp_path / "t.lance" / "_versions"
    write = store.put_if_not_exists

    def write_then_cleanup(key: str, data: bytes) -> ObjectMeta:
        # the cleanup read the tags before this one was written: it removes 1..3
        cleanup_versions(open_table(table.uri), keep_versions=1)
        return write(key, data)

    monkeypatch.setattr(store, "put_if_not_exists", write_then_cleanup)
    with pytest.raises(lancetx.TagTargetRemovedError, match="a cleanup removed it while") as e:
        table.tags.create("late", 2)
    assert isinstance(e.value, lancetx.VersionNotFoundError) and e.value.version == 2
    assert not (tmp_path / "t.lance" / "_refs" / "tags" / "late.json").exists()
    assert len(list(manifests.iterdir())) == 1
    assert table.tags.list() == {}


def test_a_tag_moved_to_a_version_removed_meanwhile_is_put_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = _local_table(tmp_path, versions=5)
    table.tags.create("gold", 4)
    store = table._state.conn.handler.store
    write = store.put

    def write_then_cleanup(key: str, data: bytes) -> ObjectMeta:
        if key.endswith("gold.json") and b'"version": 2' in data:
            cleanup_versions(open_table(table.uri), keep_versions=1)  # removes 1..3, keeps 4
        return write(key, data)

    monkeypatch.setattr(store, "put", write_then_cleanup)
    with pytest.raises(lancetx.TagTargetRemovedError):
        table.tags.update("gold", 2)
    assert table.tags.get_version("gold") == 4
    assert lance.dataset(table.uri, version="gold").count_rows() == 4


def test_the_async_table_has_the_same_tags(tmp_path: Path) -> None:
    sync = _local_table(tmp_path)

    async def scenario() -> None:
        async with await lancetx.aio.open(sync.uri) as table:
            assert (await table.tags.create("a", 2)).version == 2
            await table.tags.update("a", 3)
            assert await table.tags.get_version("a") == 3
            assert list(await table.tags.list()) == ["a"]
            view = await table.checkout("a")
            assert (view.version, await view.count_rows()) == (3, 3)
            opened = await lancetx.aio.open(sync.uri, version="a")
            assert opened.version == 3
            with pytest.raises(lancetx.TagNotFoundError):
                await table.checkout("b")
            await table.tags.delete("a")
            assert await table.tags.list() == {}

    asyncio.run(scenario())


def test_of_many_creators_of_one_tag_exactly_one_wins(tmp_path: Path) -> None:
    """On a store with conditional PUT (local, S3 with If-None-Match) creating a tag is
    atomic: eight threads, each from its own Table, each naming another version."""
    table = _local_table(tmp_path, versions=8)
    barrier = threading.Barrier(8)
    outcomes: dict[int, str] = {}

    def create(version: int) -> None:
        mine = lancetx.open(table.uri)
        barrier.wait()
        try:
            mine.tags.create("race", version)
            outcomes[version] = "won"
        except lancetx.TagExistsError:
            outcomes[version] = "exists"

    threads = [threading.Thread(target=create, args=(v,)) for v in range(1, 9)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [v for v, outcome in outcomes.items() if outcome == "won"]
    assert len(outcomes) == 8 and len(winners) == 1
    assert table.tags.get_version("race") == winners[0]
    assert lance.dataset(table.uri).tags.get_version("race") == winners[0]


def test_a_tag_on_another_branch_is_listed_but_not_read_as_a_main_version(
    tmp_path: Path,
) -> None:
    """pylance can tag a version of a branch; lancetx commits one linear history, so
    reading version N of the main branch for it would read the wrong data."""
    table = _local_table(tmp_path)
    lance.dataset(table.uri).tags.create("main-tag", 2)
    document = _tag_document(tmp_path / "t.lance" / "_refs" / "tags" / "main-tag.json")
    document["branch"] = "dev"
    (tmp_path / "t.lance" / "_refs" / "tags" / "dev-tag.json").write_text(json.dumps(document))
    assert table.tags.get("dev-tag").branch == "dev"
    with pytest.raises(lancetx.TagOnBranchError, match="branch 'dev'"):
        table.checkout("dev-tag")
    with pytest.raises(lancetx.TagOnBranchError):
        table.tags.create("copy", "dev-tag")
    assert table.checkout("main-tag").version == 2
