"""The CLI's manners: examples in every --help, exit code 2 for usage errors, progress
bars on a terminal only, the console script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import make_table, run_cli, run_cli_on_pty
from typer.testing import CliRunner

from lancetx.cli.app import app
from lancetx.demo.embedded import EmbeddedAws

COMMANDS = [
    "status",
    "verify",
    "repair",
    "gc",
    "cleanup",
    "onboard",
    "create-table",
    "doctor",
    "iam-policy",
    "migrate-to-conditional-put",
]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_shows_an_example_in_its_help(command: str) -> None:
    result = CliRunner().invoke(app, [command, "--help"])
    assert result.exit_code == 0
    assert "Examples:" in result.output
    assert f"$ lancetx-sync {command} " in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["status"],  # no URI
        ["gc", "s3+ddb://b/t?ddbTableName=T", "--older-than", "soon"],
        ["verify", "s3+ddb://b/t?ddbTableName=T", "-o", "no-equals-sign"],
        ["cleanup", "s3+ddb://b/t?ddbTableName=T"],  # neither --keep-versions nor --older-than
        [
            "cleanup",
            "s3+ddb://b/t?ddbTableName=T",
            "--keep-versions",
            "1",
            "--items-older-than",
            "x",
        ],
        ["gc", "s3+ddb://b/t?ddbTableName=T", "--delete", "--dry-run"],
        ["status", "s4://x/y"],  # not a table URI
        ["status", "s4://x/y", "--json"],
        ["verify", "s3+ddb://b/t.lance"],  # no ddbTableName
        ["onboard", "/tmp/not-a-ddb-table.lance"],  # needs an s3+ddb:// table
        ["frobnicate"],
    ],
)
def test_usage_errors_exit_2(args: list[str]) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output


def test_the_console_script_runs() -> None:
    script = Path(sys.executable).parent / "lancetx-sync"
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "repair" in done.stdout


def test_progress_bars_on_a_terminal_only(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """A walk of more than a few dozen objects draws bars on a terminal; never with
    --json, never piped; a short walk draws none."""
    table = make_table(aws, bucket, ddb_table_name, versions=15)  # 45 objects
    label = "listing objects"  # the bar's description; nothing else prints it

    code, shown = run_cli_on_pty(aws, "gc", table.uri, "--older-than", "1d")
    assert code == 0, shown
    assert label in shown and "━" in shown

    code, as_json = run_cli_on_pty(aws, "gc", table.uri, "--older-than", "1d", "--json")
    assert code == 0
    assert label not in as_json and "━" not in as_json
    assert '"command": "gc"' in as_json

    piped = run_cli(aws, "gc", table.uri, "--older-than", "1d")
    assert piped.code == 0
    assert label not in piped.stdout + piped.stderr

    code, short = run_cli_on_pty(aws, "verify", table.uri)  # 15 manifests: no bar
    assert code == 0, short
    assert "reading manifests" not in short and "━" not in short
