"""``lancetx-sync migrate-to-conditional-put URI``."""

from __future__ import annotations

import typer

from lancetx.cli.options import TABLE, DryRun, JsonOutput, StorageOptions, UriArg, example


def register(app: typer.Typer) -> None:
    @app.command(
        "migrate-to-conditional-put",
        epilog=example(
            f"lancetx-sync migrate-to-conditional-put {TABLE} --dry-run",
            f"lancetx-sync migrate-to-conditional-put {TABLE}",
        ),
    )
    def migrate_to_conditional_put(
        uri: UriArg,
        dry_run: DryRun = False,
        storage_option: StorageOptions = None,
        json: JsonOutput = False,
    ) -> None:
        """Move a table off DynamoDB once its bucket honours If-None-Match: probe the
        bucket, finalize every version, record the move in DynamoDB (lancetx refuses
        s3+ddb:// commits afterwards), and print what pylance users must change.
        Stop all writers first."""
        from lancetx.cli.output import (
            FINDINGS,
            emit_json,
            handled,
            parse_storage_options,
            print_findings,
            say,
            stdout_console,
        )
        from lancetx.ops.migrate import migrate_to_conditional_put as migrate
        from lancetx.ops.table import open_table

        options = parse_storage_options(storage_option)
        with handled("migrate-to-conditional-put", json):
            report = migrate(open_table(uri, options), dry_run=dry_run)
        if json:
            emit_json("migrate-to-conditional-put", report)
        else:
            console = stdout_console()
            say(console, f"conditional-PUT probe: {report.probe_detail}")
            if report.conditional_put is not True:
                console.print("[red]not migrated[/]: keep using s3+ddb:// on this bucket")
            elif report.blocking:
                print_findings(console, report.blocking, title="Repair these first")
            else:
                verb = "would finalize" if dry_run else "finalized"
                say(console, f"{verb} versions {report.finalized or 'none'}")
                if report.moved:
                    say(console, f"migrated: the table is now {report.new_uri}")
                say(console, "pylance users must:")
                for change in report.pylance_changes:
                    console.print(f"  - {change}", markup=False)
        if not report.ok:
            raise typer.Exit(FINDINGS)
