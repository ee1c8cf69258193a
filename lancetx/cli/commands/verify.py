"""``lancetx-sync verify URI [--deep]``."""

from __future__ import annotations

from typing import Annotated

import typer

from lancetx.cli.options import TABLE, JsonOutput, StorageOptions, UriArg, example


def register(app: typer.Typer) -> None:
    @app.command(
        epilog=example(f"lancetx-sync verify {TABLE}", f"lancetx-sync verify {TABLE} --deep --json")
    )
    def verify(
        uri: UriArg,
        deep: Annotated[
            bool, typer.Option("--deep", help="Also check data and deletion files exist.")
        ] = False,
        all_versions: Annotated[
            bool, typer.Option("--all-versions", help="With --deep: every version, not the latest.")
        ] = False,
        storage_option: StorageOptions = None,
        json: JsonOutput = False,
    ) -> None:
        """Check that every DynamoDB item and its manifest agree (path, size, version),
        versions are contiguous and transaction files exist; report each problem with
        its fix. Exit 1 if anything is wrong. Reads only."""
        from lancetx.cli.output import (
            FINDINGS,
            emit_json,
            handled,
            parse_storage_options,
            print_findings,
            progress,
            say,
            stdout_console,
        )
        from lancetx.ops.table import open_table
        from lancetx.ops.verify import verify_table

        options = parse_storage_options(storage_option)
        labels = {"list": "listing objects", "read": "reading manifests"}
        with handled("verify", json), progress(json, labels) as bar:
            report = verify_table(
                open_table(uri, options), deep=deep, all_versions=all_versions, progress=bar
            )
        if json:
            emit_json("verify", report)
        else:
            console = stdout_console()
            say(
                console,
                f"{report.uri}: {report.versions_checked} version(s) checked, "
                f"latest {report.latest_version}",
            )
            print_findings(console, report.findings)
        if not report.ok:
            raise typer.Exit(FINDINGS)
