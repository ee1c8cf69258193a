"""What an operator sees: the console script through a pipe prints whole keys, one row per
line; exit codes 0 / 1 / 2 mean clean / findings / usage; object names are text, never
rich markup; bars for long walks only, on a terminal only."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from cli_helpers import DdbTable, age_objects, make_table, run_cli, run_cli_on_pty

from lancetx.demo.embedded import EmbeddedAws

#: A table path long enough that its data files' keys pass 90 characters.
LONG_PATH = "warehouse/analytics/events_by_customer_and_region/year=2026/month=11/t.lance"


@pytest.fixture
def long_table(aws: EmbeddedAws, bucket: str, ddb_table_name: str) -> DdbTable:
    return make_table(aws, bucket, ddb_table_name, path=LONG_PATH, versions=3)


def _cli(aws: EmbeddedAws, *args: str) -> Any:
    return run_cli(aws, *args, console_script=True)


def test_piped_verify_shows_a_long_key_unbroken(aws: EmbeddedAws, long_table: DdbTable) -> None:
    victim = long_table.objects("data/")[0]
    assert len(victim) >= 90
    long_table.s3.delete_object(Bucket=long_table.bucket, Key=victim)
    found = _cli(aws, "verify", long_table.uri, "--deep")
    assert found.code == 1, found.stdout + found.stderr
    assert any(victim in line for line in found.stdout.splitlines()), found.stdout


def test_piped_gc_prints_one_object_per_line_with_its_key_whole(
    aws: EmbeddedAws, long_table: DdbTable
) -> None:
    orphans = [
        f"{LONG_PATH}/data/orphan-{i}-0123456789abcdef0123456789abcdef.lance" for i in (1, 2)
    ]
    for key in orphans:
        long_table.s3.put_object(Bucket=long_table.bucket, Key=key, Body=b"x" * 10)
    age_objects(long_table.bucket, orphans, timedelta(days=30))
    found = _cli(aws, "gc", long_table.uri, "--older-than", "7d")
    assert found.code == 0, found.stdout + found.stderr
    lines = found.stdout.splitlines()
    assert lines[0] == "Would delete"
    assert re.split(r"\s{2,}", lines[1]) == ["kind", "key", "bytes", "last modified"]
    rows = [re.split(r"\s{2,}", line) for line in lines[2:4]]
    assert sorted(row[1] for row in rows) == orphans
    assert all(row[0] == "data_file" and row[2] == "10" for row in rows)
    assert "2 object(s), 20 bytes reclaimable" in lines[4]
    assert not any(ch in found.stdout for ch in "┃│┏━")  # no box drawn around a pipe


@pytest.mark.parametrize("on_terminal", [False, True], ids=["piped", "terminal"])
def test_object_names_are_printed_as_text_never_as_markup(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str, on_terminal: bool
) -> None:
    table = make_table(aws, bucket, ddb_table_name)
    names = ["data/[/bold]x.lance", "data/[black on black]hidden.lance"]
    reordering = "data/\u202eecnal.exe"  # a right-to-left override: shown, not obeyed
    keys = [f"{table.path}/{name}" for name in [*names, reordering]]
    for key in keys:
        table.s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    age_objects(bucket, keys, timedelta(days=30))
    if on_terminal:
        code, out = run_cli_on_pty(aws, "gc", table.uri, "--older-than", "7d")
        out = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out)  # the terminal's colours
    else:
        done = _cli(aws, "gc", table.uri, "--older-than", "7d")
        code, out = done.code, done.stdout + done.stderr
    assert code == 0, out
    assert "MarkupError" not in out and "Traceback" not in out
    flat = out.replace("\r", "").replace("\n", "").replace("│", "").replace(" ", "")
    for name in names:
        assert name.replace(" ", "") in flat
    assert "\u202e" not in out and "data/\\u202eecnal.exe" in flat


def test_exit_codes_clean_findings_usage(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    table = make_table(aws, bucket, ddb_table_name, versions=5)
    clean = _cli(aws, "verify", table.uri)
    assert clean.code == 0, clean.stdout + clean.stderr

    repair = _cli(aws, "repair", table.uri, "--version", "999")
    assert repair.code == 2, repair.stdout + repair.stderr
    assert "nothing to repair" not in repair.stdout
    assert (
        "version 999" in repair.stderr and "the table has versions 1, 2, 3, 4, 5" in repair.stderr
    )
    as_json = _cli(aws, "repair", table.uri, "--version", "999", "--json")
    assert as_json.code == 2 and as_json.json["error"]["type"] == "VersionNotFoundError"

    for args in (["status", "s4://x/y"], ["gc", table.uri, "--older-than", "7x"]):
        done = _cli(aws, *args)
        assert done.code == 2, (args, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr

    table.s3.delete_object(Bucket=bucket, Key=table.objects("data/")[0])
    findings = _cli(aws, "verify", table.uri, "--deep")
    assert findings.code == 1, findings.stdout + findings.stderr


def test_doctor_and_status_read_well_piped(aws: EmbeddedAws, long_table: DdbTable) -> None:
    doctor = _cli(aws, "doctor", long_table.uri, "--dry-run")
    assert doctor.code in (0, 1), doctor.stderr
    rows = [re.split(r"\s{2,}", line) for line in doctor.stdout.splitlines()[2:]]
    assert len(rows) > 5 and all(len(row) >= 2 for row in rows)
    repeated = [row for row in rows if len(row) > 2 and row[2].startswith(row[0])]
    assert repeated == []
    assert any(row[0] == "s3:ListBucket" and LONG_PATH in row[2] for row in rows)

    status = _cli(aws, "status", long_table.uri)
    assert status.code == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines[0] == "Status"
    assert re.split(r"\s{2,}", lines[1]) == ["table", long_table.uri]  # no empty header row
    code, shown = run_cli_on_pty(aws, "status", long_table.uri)
    assert code == 0 and "┡" not in shown  # nor a header rule on a terminal


def test_cleanup_of_many_versions_shows_its_deletions(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """A bar per phase of a long cleanup, the deletions included (here drawn from the
    first item: LANCETX_PROGRESS_AFTER=0, so that a small table stands for a large one)."""
    table = make_table(aws, bucket, ddb_table_name, versions=4)
    code, shown = run_cli_on_pty(
        aws,
        "cleanup",
        table.uri,
        "--keep-versions",
        "1",
        "--items-older-than",
        "0s",
        extra_env={"LANCETX_PROGRESS_AFTER": "0"},
    )
    assert code == 0, shown
    assert "reading manifests" in shown and "deleting" in shown
