"""Cold start, imports included: a fresh Python process that imports and opens a table.

The issue's two programs, exactly, each run as ``python -c PROGRAM`` in a new
interpreter, on the same kind of table (same rows):

* ``lancetx``: ``import lancetx; lancetx.open(URI).version``
* ``pylance``: ``import lance; lance.dataset(URI).version``

Two tables each: an ``s3+ddb://`` table on the embedded moto server (the children
find the server and the fake credentials in their environment, ``AWS_ENDPOINT_URL``
and the others, as a deployment configures its clients: no ``storage_options``) and
a local path. A run is timed in the parent from spawn to exit (interpreter start-up,
imports, the open, interpreter shutdown); *cpu* is the child's user + system CPU
(all threads, ``getrusage``), steadier than wall time on a loaded machine. Runs are
paired and alternate (lancetx then pylance, then pylance then lancetx, …) after one
unmeasured run of each (page cache, bytecode), so a noisy shared machine loads both
alike; a ratio is of the two medians from one run. ``python -c pass`` is timed the same
way, as the floor both share.

With ``perf`` on the machine (``--perf``, the default when it is found) each program
also runs ``--perf-runs`` times under ``perf stat -e instructions,cycles``: the
instructions a cold start executes do not depend on the machine's load, so they show
what a cut saved even when wall times are noisy (cycles do depend on it, less than
wall time does).

The children cache bytecode (in a temporary directory: ``PYTHONPYCACHEPREFIX``), as
an installed wheel does; without it every run would compile lancetx's sources (an
editable install ships no ``.pyc``) and not pylance's. They run in an empty working
directory, so ``import lancetx`` finds the installed package, not a source tree.

``--lancetx-python LABEL=PATH`` (repeatable) adds another interpreter whose
``import lancetx`` is another lancetx (e.g. a venv of the code before a change): its
runs are paired with the others', so *before* and *after* come from one run.

Also the CLI: ``lancetx-sync --help`` and ``lancetx-sync status URI`` on the
``s3+ddb://`` table (``--cli-runs`` fresh processes each, alternating between the
interpreters given).

Run: ``python benchmarks/cold_start.py [--runs 21] [--cli-runs 9] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence

import lance
import pyarrow as pa
from _harness import (
    EmbeddedAws,
    by_operation,
    counting,
    environment,
    fmt,
    markdown_table,
    percentile,
    start_bench,
    unique_name,
    write_json,
)

import lancetx

#: The issue's programs; ``{uri}`` is the table's (a Python string literal).
PROGRAMS = {
    "lancetx": "import lancetx; lancetx.open({uri}).version",
    "pylance": "import lance; lance.dataset({uri}).version",
}
#: The floor every program pays: an interpreter that starts and exits.
FLOOR = "pass"


def load() -> str:
    """The machine's load averages (1, 5, 15 min), as ``uptime`` prints them."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def child_environ(pycache: str, aws_environ: Mapping[str, str]) -> dict[str, str]:
    """The children's environment: the embedded server and fake credentials (as a
    deployment's environment would hold them), bytecode cached outside the source tree.
    Nothing that would tell botocore to skip a look-up a user's process makes."""
    drop = {"PYTHONDONTWRITEBYTECODE", "AWS_EC2_METADATA_DISABLED", "PYTHONPATH"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(aws_environ)
    env["PYTHONPYCACHEPREFIX"] = pycache
    return env


def timed(args: Sequence[str], env: Mapping[str, str], cwd: str) -> dict[str, float]:
    """Wall and CPU seconds of one fresh process, from spawn to exit."""
    cpu_before = children_cpu()
    start = time.perf_counter()
    done = subprocess.run(
        list(args), capture_output=True, text=True, check=False, env=dict(env), cwd=cwd
    )
    wall = time.perf_counter() - start
    cpu = children_cpu() - cpu_before
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{done.stderr}")
    return {"wall": wall, "cpu": cpu}


def perf_counts(
    args: Sequence[str], env: Mapping[str, str], cwd: str, perf: str
) -> dict[str, float]:
    """Instructions and cycles (all threads) of one fresh process, from ``perf stat``."""
    with tempfile.NamedTemporaryFile("r", suffix=".perf") as out:
        done = subprocess.run(
            [perf, "stat", "-x", ",", "-e", "instructions,cycles", "-o", out.name, *args],
            capture_output=True,
            text=True,
            check=False,
            env=dict(env),
            cwd=cwd,
        )
        if done.returncode != 0:
            raise RuntimeError(f"perf stat {' '.join(args)} failed:\n{done.stderr}")
        counts: dict[str, float] = {}
        for line in out.read().splitlines():
            fields = line.split(",")
            if len(fields) > 2 and fields[2] in ("instructions", "cycles"):
                counts[fields[2]] = float(fields[0])
    return counts


def median_ms(values: Sequence[float]) -> float:
    return statistics.median(values) * 1000


def p90_ms(values: Sequence[float]) -> float:
    return percentile(values, 90) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21, help="fresh processes per program")
    parser.add_argument("--cli-runs", type=int, default=9, help="per CLI call (0: skip)")
    parser.add_argument("--perf-runs", type=int, default=5, help="perf stat runs per program")
    parser.add_argument("--no-perf", action="store_true", help="skip perf stat")
    parser.add_argument(
        "--lancetx-python",
        action="append",
        default=[],
        metavar="LABEL=PATH",
        help="another interpreter whose lancetx to measure beside this one's",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the raw numbers as JSON")
    args = parser.parse_args()

    pythons = {"lancetx": sys.executable}
    for item in args.lancetx_python:
        label, _, path = item.partition("=")
        pythons[f"lancetx {label}"] = path
    perf = None if args.no_perf else shutil.which("perf")

    rows = pa.table({"id": pa.array(range(1000), pa.int64())})
    load_before = load()
    with (
        EmbeddedAws() as aws,
        tempfile.TemporaryDirectory(prefix="cold-start-") as scratch,
    ):
        pycache, cwd, local = (os.path.join(scratch, d) for d in ("pyc", "cwd", "local"))
        for d in (pycache, cwd, local):
            os.makedirs(d)
        env = child_environ(pycache, aws.environ())
        bench = start_bench(aws)
        # One table per system and kind, written by that system.
        uris = {
            ("lancetx", "s3+ddb"): bench.ddb_uri(unique_name("lancetx")),
            ("pylance", "s3+ddb"): bench.ddb_uri(unique_name("pylance")),
            ("lancetx", "local"): os.path.join(local, "lancetx.lance"),
            ("pylance", "local"): os.path.join(local, "pylance.lance"),
        }
        for kind in ("s3+ddb", "local"):
            options = bench.options if kind == "s3+ddb" else None
            lancetx.write_table(uris["lancetx", kind], rows, storage_options=options)
            lance.write_dataset(rows, uris["pylance", kind], storage_options=options)

        # What each program runs: (label, kind) -> argv.
        programs: dict[tuple[str, str], list[str]] = {}
        for kind in ("s3+ddb", "local"):
            for label, python in pythons.items():
                code = PROGRAMS["lancetx"].format(uri=repr(uris["lancetx", kind]))
                programs[label, kind] = [python, "-c", code]
            code = PROGRAMS["pylance"].format(uri=repr(uris["pylance", kind]))
            programs["pylance", kind] = [sys.executable, "-c", code]
        programs["python -c pass", "-"] = [sys.executable, "-c", FLOOR]

        # Requests per open, as the server saw them (one open each).
        requests: dict[str, dict[str, int]] = {}
        with counting(aws) as counter:
            for (label, kind), argv in programs.items():
                if kind == "s3+ddb":
                    counter.take()
                    timed(argv, env, cwd)
                    requests[label] = dict(by_operation(counter.take()))

        for argv in programs.values():  # one unmeasured run each: page cache, .pyc files
            timed(argv, env, cwd)
        runs: dict[str, list[dict[str, float]]] = {f"{k[0]} | {k[1]}": [] for k in programs}
        order = list(programs)
        for i in range(args.runs):
            # Alternate the order: each program runs first as often as last.
            for key in order if i % 2 == 0 else reversed(order):
                runs[f"{key[0]} | {key[1]}"].append(timed(programs[key], env, cwd))

        counts: dict[str, list[dict[str, float]]] = {}
        if perf is not None and args.perf_runs:
            counts = {f"{k[0]} | {k[1]}": [] for k in programs}
            for i in range(args.perf_runs):
                for key in order if i % 2 == 0 else reversed(order):
                    counts[f"{key[0]} | {key[1]}"].append(
                        perf_counts(programs[key], env, cwd, perf)
                    )

        cli: dict[str, list[dict[str, float]]] = {}
        if args.cli_runs:
            calls: dict[str, list[str]] = {}
            for label, python in pythons.items():
                sync = os.path.join(os.path.dirname(python), "lancetx-sync")
                calls[f"{label}: lancetx-sync --help"] = [sync, "--help"]
                calls[f"{label}: lancetx-sync status"] = [sync, "status", uris["lancetx", "s3+ddb"]]
            for argv in calls.values():
                timed(argv, env, cwd)
            cli = {name: [] for name in calls}
            names = list(calls)
            for i in range(args.cli_runs):
                for name in names if i % 2 == 0 else reversed(names):
                    cli[name].append(timed(calls[name], env, cwd))
    load_after = load()

    print(f"load average before: {load_before}, after: {load_after}; {args.runs} runs each\n")
    table = []
    for kind in ("s3+ddb", "local"):
        pylance = runs[f"pylance | {kind}"]
        for label in [*pythons, "pylance"]:
            mine = runs[f"{label} | {kind}"]
            wall = [r["wall"] for r in mine]
            cpu = [r["cpu"] for r in mine]
            table.append(
                [
                    kind,
                    label,
                    fmt(median_ms(wall)),
                    fmt(p90_ms(wall)),
                    fmt(median_ms(cpu)),
                    fmt(median_ms(wall) / median_ms([r["wall"] for r in pylance]), 2),
                    fmt(median_ms(cpu) / median_ms([r["cpu"] for r in pylance]), 2),
                ]
            )
    floor = runs["python -c pass | -"]
    table.append(
        [
            "-",
            "python -c pass",
            fmt(median_ms([r["wall"] for r in floor])),
            fmt(p90_ms([r["wall"] for r in floor])),
            fmt(median_ms([r["cpu"] for r in floor])),
            "",
            "",
        ]
    )
    print(
        markdown_table(
            ["table", "program", "wall ms (median)", "p90", "cpu ms", "wall ratio", "cpu ratio"],
            table,
        )
    )
    if counts:
        print()
        rows_perf = []
        for key, values in counts.items():
            label, kind = key.split(" | ")
            inst = statistics.median(v["instructions"] for v in values)
            cycles = statistics.median(v["cycles"] for v in values)
            ref = counts.get(f"pylance | {kind}")
            ratio = fmt(inst / statistics.median(v["instructions"] for v in ref), 2) if ref else ""
            cyc_ratio = fmt(cycles / statistics.median(v["cycles"] for v in ref), 2) if ref else ""
            rows_perf.append([kind, label, fmt(inst / 1e6), ratio, fmt(cycles / 1e6), cyc_ratio])
        print(
            markdown_table(
                [
                    "table",
                    "program",
                    "instructions (M, median)",
                    "ratio",
                    "cycles (M)",
                    "ratio",
                ],
                rows_perf,
            )
        )
    print()
    print(
        markdown_table(
            ["program", "requests per open (s3+ddb)"],
            [
                [label, ", ".join(f"{op} {n}" for op, n in sorted(ops.items())) or "none"]
                for label, ops in requests.items()
            ],
        )
    )
    if cli:
        print()
        print(
            markdown_table(
                ["CLI call", "wall ms (median)", "p90", "cpu ms"],
                [
                    [
                        name,
                        fmt(median_ms([r["wall"] for r in values])),
                        fmt(p90_ms([r["wall"] for r in values])),
                        fmt(median_ms([r["cpu"] for r in values])),
                    ]
                    for name, values in cli.items()
                ],
            )
        )
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "cold_start",
                "environment": environment(),
                "programs": PROGRAMS,
                "pythons": pythons,
                "load_before": load_before,
                "load_after": load_after,
                "runs": runs,
                "perf": counts,
                "requests": requests,
                "cli": cli,
            },
        )


if __name__ == "__main__":
    main()
