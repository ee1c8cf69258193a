"""Audit (issue 2, scope 2): the README's first command, ``make demo``, works.

test_readme checks that the README opens with ``make demo`` and ``make test``;
this runs what ``make demo`` runs (in a fresh interpreter, smaller than the
default so it stays quick) and checks what it reports: an in-process moto
server, a table written by pylance and lancetx, read back through our reader
with its versions printed, a linear history and every acknowledged row.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _demo_recipe() -> list[str]:
    """The commands of the Makefile's ``demo`` target."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("demo:"))
    recipe = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    return recipe


def test_make_demo_runs_the_demo_module() -> None:
    assert _demo_recipe() == ["$(BIN)/python -m lancetx.externalstore.demo"]


def test_demo_runs_and_reports_a_linear_complete_history() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lancetx.externalstore.demo",
            "--lancetx-writers",
            "2",
            "--appends",
            "2",
            "--rows",
            "10",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert re.search(r"embedded S3 \+ DynamoDB \(moto\) at http://127\.0\.0\.1:\d+", out), out
    # setup + 2 lancetx writers x 2 + 1 pylance writer x 2 = 7 commits
    assert "7 commits from 4 writers" in out, out
    assert "pylance sees versions 1..7: linear, no gap" in out, out
    assert "pylance counts 70 rows; acknowledged 70: all present" in out, out
    table = [line.split() for line in out.splitlines() if re.match(r"^\s+\d+\s+\w+", line)]
    assert [int(row[0]) for row in table] == list(range(1, 8)), out  # read back by our reader
    assert {row[2] for row in table} == {"lance", "lancetx"}, out
    assert [int(row[3]) for row in table] == [10 * v for v in range(1, 8)], out
