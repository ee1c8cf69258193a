"""The CLI's manners: examples in every --help, exit code 2 for usage errors, progress
bars on a terminal only, the console script."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import make_table, run_cli
from typer.testing import CliRunner

from lancetx.cli.app import app
from lancetx.externalstore.embedded import EmbeddedAws

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
        ["frobnicate"],
    ],
)
def test_usage_errors_exit_2(args: list[str]) -> None:
    assert CliRunner().invoke(app, args).exit_code == 2


def test_the_console_script_runs() -> None:
    script = Path(sys.executable).parent / "lancetx-sync"
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "repair" in done.stdout


def _run_on_pty(aws: EmbeddedAws, *args: str) -> tuple[int, str]:
    """Run the CLI with stdout and stderr on a pseudo-terminal; return (code, output)."""
    env = {**os.environ, **aws.environ(), "TERM": "xterm-256color", "COLUMNS": "120"}
    env.pop("NO_COLOR", None)
    master, slave = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "lancetx.cli", *args],
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
        env=env,
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif process.poll() is not None:
            break
    os.close(master)
    return process.wait(timeout=30), b"".join(chunks).decode("utf-8", "replace")


def test_progress_bars_on_a_terminal_only(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    table = make_table(aws, bucket, ddb_table_name)
    label = "reading manifests"  # the bar's description; nothing else prints it

    code, shown = _run_on_pty(aws, "verify", table.uri)
    assert code == 0
    assert label in shown and "━" in shown

    code, as_json = _run_on_pty(aws, "verify", table.uri, "--json")
    assert code == 0
    assert label not in as_json and "━" not in as_json
    assert '"command": "verify"' in as_json

    piped = run_cli(aws, "verify", table.uri)
    assert piped.code == 0
    assert label not in piped.stdout + piped.stderr
