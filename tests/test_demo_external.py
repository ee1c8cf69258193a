"""``lancetx-demo --external``: the demo workload on servers named by environment variables alone.

Under ``make test-localstack`` those are LocalStack's S3 and dynalite; otherwise the
session's embedded server, reached the same way (no storage options anywhere).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid

import pytest

from lancetx.demo.embedded import EmbeddedAws

pytestmark = pytest.mark.integration


def test_demo_workload_runs_from_environment_variables_alone(aws: EmbeddedAws) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DYNAMODB_"))}
    env.update(aws.environ())
    bucket = f"lancetx-demo-{uuid.uuid4().hex[:8]}"
    table = f"lancetx_demo_{uuid.uuid4().hex[:8]}"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lancetx.demo.race",
            "--external",
            "--bucket",
            bucket,
            "--ddb-table",
            table,
            "--lancetx-writers",
            "3",
            "--appends",
            "2",
            "--rows",
            "10",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert f"S3 at {aws.endpoint}, DynamoDB at {aws.dynamodb_endpoint}" in out, out
    assert "moto" not in out
    # setup + 3 lancetx writers x 2 + 1 pylance writer x 2 = 9 commits
    assert "9 commits from 5 writers" in out, out
    assert "pylance sees versions 1..9: linear, no gap" in out, out
    assert "pylance counts 90 rows; acknowledged 90: all present" in out, out
    table_rows = [line.split() for line in out.splitlines() if re.match(r"^\s+\d+\s+\w+", line)]
    assert {row[2] for row in table_rows} == {"lance", "lancetx"}, out
