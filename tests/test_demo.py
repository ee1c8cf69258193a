"""The README's first command, ``make demo``, and the plain-Python demo it supersedes.

test_readme checks that the README opens with ``make demo`` and ``make test``;
this checks that ``make demo`` runs the Spark demo, and runs the plain-Python
demo (``python -m lancetx.demo.race``, smaller than its default) and
checks what it reports: an in-process moto server, a table written by pylance
and lancetx, a linear history and every acknowledged row.
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


def test_make_demo_runs_the_spark_demo() -> None:
    # The Spark job itself runs in tests/spark/test_spark_examples.py on the shared session.
    assert _demo_recipe() == ["$(BIN)/python -m lancetx.demo.spark"]


def test_demo_runs_and_reports_a_linear_complete_history() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lancetx.demo.race",
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


def _dry_run(target: str, tmp_path: Path) -> list[str]:
    """The commands ``make TARGET`` would run for a venv that does not exist yet."""
    done = subprocess.run(
        # --no-print-directory: under an outer make (CI's `make test`) a nested make
        # would frame its output with "Entering/Leaving directory" lines.
        ["make", "--no-print-directory", "-n", target, f"VENV={tmp_path / 'venv'}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.splitlines()


def test_make_demo_installs_only_what_the_demo_runs_and_says_so(tmp_path: Path) -> None:
    demo = _dry_run("demo", tmp_path)
    installs = [line for line in demo if " pip install " in line]
    assert len(installs) == 2, demo
    assert "--upgrade pip" in installs[0]  # the venv's pip first
    assert installs[1].endswith("-e '.[spark,embedded]'")
    assert not any(".[dev]" in line for line in demo)
    said = [line for line in demo if line.startswith("echo ")]
    assert len(said) == 1 and "[spark,embedded]" in said[0] and "minutes" in said[0]
    assert demo[-1].endswith("python -m lancetx.demo.spark")

    test = _dry_run("venv", tmp_path)
    installs = [line for line in test if " pip install " in line]
    assert "--upgrade pip" in installs[0] and installs[1].endswith("-e '.[dev]'")


def test_lancetx_demo_help_names_itself() -> None:
    script = Path(sys.executable).parent / "lancetx-demo"
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "make demo" not in done.stdout
    assert "lancetx-demo" in done.stdout.split("options:")[0].split("\n", 1)[1]


def test_make_demo_cluster_runs_the_demo_on_a_standalone_cluster(tmp_path: Path) -> None:
    # CI runs the target itself (.ci/run); the cluster tests run its cluster class.
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("demo-cluster:"))
    assert lines[start] == "demo-cluster: $(DEMO_STAMP)"
    assert lines[start + 1].strip() == "$(BIN)/python -m lancetx.demo.cluster"
    assert "make demo-cluster" in (ROOT / ".ci" / "run").read_text()
    assert _dry_run("demo-cluster", tmp_path)[-1].endswith("python -m lancetx.demo.cluster")
