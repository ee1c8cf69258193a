"""Cold start, imports included: a fresh Python process that imports and opens a table.

Two systems on one embedded moto server, one ``s3+ddb://`` table each (same rows):

* ``lancetx``: ``import lancetx; lancetx.open(uri, storage_options=...).version``
* ``pylance``: ``import lance; lance.dataset(uri, storage_options=...).version``

Every run is a new interpreter (``sys.executable -c ...``), started by this process,
timed from spawn to exit (so interpreter start, imports, the open and interpreter
shutdown all count). The child reports when its import ended and when its open
ended (``time.perf_counter`` from its first line), so each run splits into
*import*, *open* and *rest* (interpreter start-up before the first line plus
shutdown after the last; ``import lancetx`` itself loads almost nothing, so lancetx's
imports show under *open*). The children cache bytecode (outside the source tree), as
an installed wheel does. Runs are paired and alternate (lancetx, pylance,
lancetx, …; the first of each pair alternates too), so a noisy shared machine
loads both systems alike; the ratio is of medians. *cpu* is the child's CPU time (user
+ system, all threads, from ``getrusage``), steadier than wall time on a loaded machine.
The load average (``uptime``) before and after the runs is printed and stored.

Also times the CLI: ``lancetx-sync --help`` and ``lancetx-sync status URI``
(fresh processes, ``--cli-runs`` each).

Run: ``python benchmarks/cold_start.py [--runs 15] [--cli-runs 5] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import lance
import pyarrow as pa
from _harness import (
    EmbeddedAws,
    environment,
    fmt,
    markdown_table,
    percentile,
    start_bench,
    unique_name,
    write_json,
)

import lancetx

CHILD = {
    "lancetx": (
        "import time, json, sys\n"
        "t0 = time.perf_counter()\n"
        "import lancetx\n"
        "t1 = time.perf_counter()\n"
        "v = lancetx.open(sys.argv[1], storage_options=json.loads(sys.argv[2])).version\n"
        "t2 = time.perf_counter()\n"
        "print(json.dumps({'import': t1 - t0, 'open': t2 - t1, 'version': v}))\n"
    ),
    "pylance": (
        "import time, json, sys\n"
        "t0 = time.perf_counter()\n"
        "import lance\n"
        "t1 = time.perf_counter()\n"
        "v = lance.dataset(sys.argv[1], storage_options=json.loads(sys.argv[2])).version\n"
        "t2 = time.perf_counter()\n"
        "print(json.dumps({'import': t1 - t0, 'open': t2 - t1, 'version': v}))\n"
    ),
}


def load() -> str:
    """The machine's load averages (1, 5, 15 min), as ``uptime`` prints them."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def children_cpu() -> float:
    """User + system CPU seconds of this process's finished children (all threads):
    steadier than wall time on a loaded machine."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def child_environ(pycache: str) -> dict[str, str]:
    """The children's environment: bytecode cached (in ``pycache``, outside the source
    tree), as an installed wheel's is: without it every run would compile lancetx's
    sources (an editable install has no ``.pyc`` files) and pylance's would not."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = pycache
    return env


def run_child(
    system: str, uri: str, options: dict[str, str], env: dict[str, str]
) -> dict[str, float]:
    cpu_before = children_cpu()
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", CHILD[system], uri, json.dumps(options)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    total = time.perf_counter() - start
    cpu = children_cpu() - cpu_before
    if result.returncode != 0:
        raise RuntimeError(f"{system} cold start failed:\n{result.stderr}")
    reported = json.loads(result.stdout)
    return {
        "total": total,
        "import": float(reported["import"]),
        "open": float(reported["open"]),
        "rest": total - float(reported["import"]) - float(reported["open"]),
        "cpu": cpu,
    }


def run_cli(args: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    result = subprocess.run(args, capture_output=True, text=True, check=False, env=env)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{result.stderr}")
    return seconds


def summary(values: list[float]) -> tuple[float, float]:
    return statistics.median(values) * 1000, percentile(values, 90) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="fresh processes per system")
    parser.add_argument("--cli-runs", type=int, default=5, help="per CLI call (0: skip)")
    parser.add_argument("--json", metavar="PATH", help="also write the raw numbers as JSON")
    args = parser.parse_args()

    rows = pa.table({"id": pa.array(range(1000), pa.int64())})
    load_before = load()
    with EmbeddedAws() as aws, tempfile.TemporaryDirectory(prefix="cold-start-pyc-") as pyc:
        child_env = child_environ(pyc)
        bench = start_bench(aws)
        uris = {
            "lancetx": bench.ddb_uri(unique_name("lancetx")),
            "pylance": bench.ddb_uri(unique_name("pylance")),
        }
        lancetx.write_table(uris["lancetx"], rows, storage_options=bench.options)
        lance.write_dataset(rows, uris["pylance"], storage_options=bench.options)
        runs: dict[str, list[dict[str, float]]] = {"lancetx": [], "pylance": []}
        for system in runs:  # one unmeasured run each: page cache, .pyc files
            run_child(system, uris[system], bench.options, child_env)
        for i in range(args.runs):
            order = ("lancetx", "pylance") if i % 2 == 0 else ("pylance", "lancetx")
            for system in order:
                runs[system].append(run_child(system, uris[system], bench.options, child_env))

        cli: dict[str, list[float]] = {}
        sync = shutil.which("lancetx-sync", path=os.path.dirname(sys.executable))
        if args.cli_runs and sync:
            env = child_env | aws.environ()
            calls = {
                "lancetx-sync --help": [sync, "--help"],
                "lancetx-sync status": [sync, "status", uris["lancetx"]],
            }
            for name, call in calls.items():
                run_cli(call, env)
                cli[name] = [run_cli(call, env) for _ in range(args.cli_runs)]
    load_after = load()

    table = []
    for part in ("total", "cpu", "import", "open", "rest"):
        lx = [r[part] for r in runs["lancetx"]]
        pl = [r[part] for r in runs["pylance"]]
        lx_med, lx_p90 = summary(lx)
        pl_med, pl_p90 = summary(pl)
        table.append(
            [part, fmt(lx_med), fmt(lx_p90), fmt(pl_med), fmt(pl_p90), fmt(lx_med / pl_med, 2)]
        )
    print(f"load average before: {load_before}, after: {load_after}; {args.runs} runs each\n")
    print(
        markdown_table(
            ["part", "lancetx ms (median)", "lancetx p90", "pylance ms", "pylance p90", "ratio"],
            table,
        )
    )
    if cli:
        print()
        print(
            markdown_table(
                ["CLI call", "ms (median)", "p90"],
                [[name, *(fmt(x) for x in summary(values))] for name, values in cli.items()],
            )
        )
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "cold_start",
                "environment": environment(),
                "load_before": load_before,
                "load_after": load_after,
                "runs": runs,
                "cli": cli,
            },
        )


if __name__ == "__main__":
    main()
