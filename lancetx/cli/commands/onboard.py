"""``lancetx-sync onboard URI``."""

from __future__ import annotations

import typer

from lancetx.cli.options import TABLE, DryRun, JsonOutput, StorageOptions, UriArg, example


def register(app: typer.Typer) -> None:
    @app.command(
        epilog=example(f"lancetx-sync onboard {TABLE} --dry-run", f"lancetx-sync onboard {TABLE}")
    )
    def onboard(
        uri: UriArg,
        dry_run: DryRun = False,
        storage_option: StorageOptions = None,
        json: JsonOutput = False,
    ) -> None:
        """Record every existing version of a table (written by pylance, plain s3://, or
        before DynamoDB was used) in DynamoDB, so that no claim can land on one."""
        from lancetx.cli.output import (
            emit_json,
            handled,
            parse_storage_options,
            progress,
            say,
            stdout_console,
        )
        from lancetx.ops.onboard import onboard_table
        from lancetx.ops.table import open_table

        options = parse_storage_options(storage_option)
        labels = {"list": "listing _versions/", "record": "recording versions"}
        with handled("onboard", json), progress(json, labels) as bar:
            report = onboard_table(open_table(uri, options), dry_run=dry_run, progress=bar)
        if json:
            emit_json("onboard", report)
            return
        verb = "would record" if dry_run else "recorded"
        say(
            stdout_console(),
            f"{report.manifests_found} manifest(s), {report.already_recorded} already recorded; "
            f"{verb} {len(report.recorded)}: {report.recorded or 'none'}",
        )
