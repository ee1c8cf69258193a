"""``lancetx-sync status URI``."""

from __future__ import annotations

from typing import Any

import typer

from lancetx.cli.options import TABLE, JsonOutput, StorageOptions, UriArg, example


def register(app: typer.Typer) -> None:
    @app.command(
        epilog=example(f"lancetx-sync status {TABLE}", f"lancetx-sync status {TABLE} --json")
    )
    def status(
        uri: UriArg, storage_option: StorageOptions = None, json: JsonOutput = False
    ) -> None:
        """Latest version, unfinalized versions, item count, naming scheme, committers,
        onboarding state, last commit time and message, tags. Reads only."""
        from lancetx.cli.output import (
            emit_json,
            handled,
            parse_storage_options,
            print_table,
            progress,
            say,
            stdout_console,
        )
        from lancetx.ops.status import table_status
        from lancetx.ops.table import open_table

        options = parse_storage_options(storage_option)
        with handled("status", json), progress(json, {"list": "listing _versions/"}) as bar:
            report = table_status(open_table(uri, options), bar)
        if json:
            emit_json("status", report)
            return
        console = stdout_console()
        rows: list[list[Any]] = [
            ["table", report.uri],
            ["DynamoDB table", report.dynamodb_table],
            ["latest version", report.latest_version],
            ["items", report.item_count],
            ["unfinalized versions", ", ".join(map(str, report.staged_versions)) or "none"],
            ["naming scheme", report.naming_scheme],
            ["manifests in store", report.manifests_in_store],
            ["staged objects in store", report.staged_objects_in_store],
            ["committers", ", ".join(f"{k}: {v}" for k, v in report.committers.items())],
            ["onboarded", report.onboarded],
            ["last commit", report.last_commit_time],
            ["last operation", report.last_operation],
            ["last message", report.last_commit_message],
            ["store schema", report.store_schema_version],
            ["moved to", report.moved_to],
            ["tags", ", ".join(f"{k}: {v}" for k, v in report.tags.items()) or "none"],
        ]
        print_table(console, "Status", ["", ""], rows, header=False)
        for note in report.notes:
            say(console, f"note: {note}")
