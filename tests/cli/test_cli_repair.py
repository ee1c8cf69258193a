"""``lancetx-sync status / verify / repair`` on the states they exist for.

Subprocess runs (as users run the CLI) for the main path of each state; the
variants (several candidates, --force, a missing final manifest) call the same
functions in-process, which is what the CLI is a thin layer over.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from cli_helpers import DdbTable, make_table, read_versions, run_cli, wedge_with_pylance
from protocol_helpers import batch, pylance_append

from lancetx.demo.embedded import EmbeddedAws
from lancetx.ops.repair import repair_table
from lancetx.ops.table import open_table
from lancetx.ops.verify import verify_table


def _stage(table: DdbTable, version_index: int = -1, *, flip_item: bool = True) -> str:
    """Make the newest version look like its writer crashed after the claim: its manifest
    only under a staged name; with ``flip_item`` the item points at it too."""
    finals = [k for k in table.objects("_versions/") if k.endswith(".manifest")]
    final = sorted(finals)[0]  # V2 names: the newest sorts first
    staged = f"{final}-{uuid.uuid4()}"
    table.s3.copy_object(
        Bucket=table.bucket, Key=staged, CopySource={"Bucket": table.bucket, "Key": final}
    )
    table.s3.delete_object(Bucket=table.bucket, Key=final)
    if flip_item:
        item = table.items()[version_index]
        item["path"] = {"S": staged}
        table.ddb.put_item(TableName=table.ddb_table, Item=item)
    return staged


def test_repair_rebuilds_a_version_a_pylance_writer_wedged(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    table = make_table(legacy_aws, bucket, ddb_table_name, "db/events.lance")
    before = read_versions(table.uri, table.options)
    lost, staged = wedge_with_pylance(table)

    found = run_cli(legacy_aws, "verify", table.uri, "--json")
    assert found.code == 1, found.stderr
    (finding,) = found.json["findings"]
    assert finding["kind"] == "wedged_version" and finding["version"] == 3
    assert finding["path"] == staged
    assert finding["fix"] == f"lancetx-sync repair '{table.uri}' --version 3"

    objects = table.objects()
    listed = run_cli(legacy_aws, "repair", table.uri, "--json")  # no pick: nothing changes
    assert listed.code == 1
    assert listed.json["actions"] == []
    assert [c["key"] for c in listed.json["candidates"]["3"]] == [lost]
    assert listed.json["candidates"]["3"][0]["usable"] is True
    assert table.objects() == objects and table.items()[-1]["path"]["S"] == staged

    done = run_cli(
        legacy_aws, "repair", table.uri, "--version", "3", "--yes", "--json", via_env=False
    )
    assert done.code == 0, done.stdout + done.stderr
    (action,) = done.json["actions"]
    assert action["kind"] == "rematerialize" and action["done"] is True

    assert run_cli(legacy_aws, "verify", table.uri, "--json").json["ok"] is True
    after = read_versions(table.uri, table.options)
    assert {v: after[v] for v in before} == before
    assert after[3] == sorted(before[2] + [("lost", 0, i) for i in range(3)])
    status = run_cli(legacy_aws, "status", table.uri, "--json")
    assert status.code == 0
    assert status.json["latest_version"] == 3 and status.json["staged_versions"] == []


def test_repair_finalizes_a_version_whose_writer_stopped_after_its_claim(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    table = make_table(aws, bucket, ddb_table_name)
    before = read_versions(table.uri, table.options)
    staged = _stage(table)

    status = run_cli(aws, "status", table.uri, "--json")
    assert status.code == 0
    assert status.json["staged_versions"] == [2]
    assert status.json["item_count"] == 2 and status.json["committers"] == {"lancedb": 2}
    assert any("lancetx-sync repair" in note for note in status.json["notes"])

    objects = table.objects()
    planned = run_cli(aws, "repair", table.uri, "--dry-run", "--json")
    assert planned.code == 0
    assert [(a["kind"], a["version"], a["done"]) for a in planned.json["actions"]] == [
        ("finalize", 2, False)
    ]
    assert table.objects() == objects  # a dry run writes nothing

    done = run_cli(aws, "repair", table.uri, "--json")
    assert done.code == 0
    assert [(a["kind"], a["done"]) for a in done.json["actions"]] == [("finalize", True)]
    assert staged not in table.objects()
    assert table.items()[-1]["path"]["S"].endswith(".manifest")
    assert verify_table(open_table(table.uri, table.options)).ok
    assert read_versions(table.uri, table.options) == before


def test_repair_never_guesses_between_candidates(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    table = make_table(legacy_aws, bucket, ddb_table_name)
    lost, _ = wedge_with_pylance(table)
    # A second unreferenced transaction with the same read version: as plausible as the lost one.
    decoy = lost.rsplit("/", 1)[0] + f"/2-{uuid.uuid4()}.txn"
    table.s3.copy_object(
        Bucket=table.bucket, Key=decoy, CopySource={"Bucket": table.bucket, "Key": lost}
    )
    objects, items = table.objects(), table.items()

    ops = open_table(table.uri, table.options)
    refused = repair_table(ops, yes=True)
    assert not refused.ok and refused.actions == []
    assert sorted(c.key for c in refused.candidates[3]) == sorted([lost, decoy])
    assert (table.objects(), table.items()) == (objects, items)

    picked = repair_table(ops, version=3, transaction=lost.rsplit("/", 1)[1])
    assert picked.ok and [a.kind for a in picked.actions] == ["rematerialize"]
    assert verify_table(ops).ok
    assert [r for r in read_versions(table.uri, table.options)[3] if r[0] == "lost"] == [
        ("lost", 0, i) for i in range(3)
    ]


def test_repair_force_removes_only_the_newest_item_after_a_backup(
    legacy_aws: EmbeddedAws, bucket: str, ddb_table_name: str, tmp_path: Path
) -> None:
    table = make_table(legacy_aws, bucket, ddb_table_name)
    before = read_versions(table.uri, table.options)
    lost, staged = wedge_with_pylance(table)
    table.s3.delete_object(Bucket=table.bucket, Key=lost)  # no candidate left

    ops = open_table(table.uri, table.options)
    without = repair_table(ops, version=3, backup_dir=str(tmp_path))
    assert not without.ok and without.candidates[3] == [] and len(table.items()) == 3

    forced = repair_table(ops, version=3, force=True, backup_dir=str(tmp_path))
    assert forced.ok
    (action,) = forced.actions
    assert action.kind == "remove_item" and action.backup_file is not None
    saved = json.loads(Path(action.backup_file).read_text())
    assert saved["Item"]["version"] == {"N": "3"} and saved["Item"]["path"] == {"S": staged}
    assert [int(i["version"]["N"]) for i in table.items()] == [1, 2]
    assert verify_table(ops).ok
    assert read_versions(table.uri, table.options) == before
    pylance_append(table.uri, table.options, batch("next", 0, 2))  # writable again
    assert len(read_versions(table.uri, table.options)) == 3


def test_repair_restores_a_missing_final_manifest_from_its_staged_copy(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    table = make_table(aws, bucket, ddb_table_name)
    before = read_versions(table.uri, table.options)
    _stage(table, flip_item=False)  # the item still names the final manifest, which is gone
    ops = open_table(table.uri, table.options)
    assert [f.kind for f in verify_table(ops).findings] == ["missing_final"]

    report = repair_table(ops)
    assert report.ok and [a.kind for a in report.actions] == ["restore_final"]
    assert verify_table(ops).ok
    assert read_versions(table.uri, table.options) == before
