"""``lancetx-sync repair URI``."""

from __future__ import annotations

from typing import Annotated

import typer

from lancetx.cli.options import TABLE, DryRun, JsonOutput, StorageOptions, UriArg, example


def register(app: typer.Typer) -> None:
    @app.command(
        epilog=example(
            f"lancetx-sync repair {TABLE} --dry-run",
            f"lancetx-sync repair {TABLE} --version 7            # list the candidates",
            f"lancetx-sync repair {TABLE} --version 7 --transaction 6-<uuid>.txn",
            f"lancetx-sync repair {TABLE} --version 7 --force    # newest only; item backed up",
        )
    )
    def repair(
        uri: UriArg,
        version: Annotated[
            int | None, typer.Option("--version", help="Repair only this version.")
        ] = None,
        transaction: Annotated[
            str | None,
            typer.Option(
                "--transaction",
                help="For a wedged version: the candidate transaction file to rebuild it from.",
            ),
        ] = None,
        yes: Annotated[
            bool,
            typer.Option(
                "--yes", "-y", help="For a wedged version: use the only usable candidate."
            ),
        ] = False,
        force: Annotated[
            bool,
            typer.Option(
                "--force",
                help="With no usable candidate: delete the newest version's item after "
                "saving it to a backup file.",
            ),
        ] = False,
        backup_dir: Annotated[
            str, typer.Option("--backup-dir", help="Where --force saves removed items.")
        ] = ".",
        dry_run: DryRun = False,
        storage_option: StorageOptions = None,
        json: JsonOutput = False,
    ) -> None:
        """Finalize staged versions, restore a missing final manifest from its staged
        copy, rebuild a wedged version from its parent plus the transaction file you
        pick (never guessed), or with --force remove the newest version's item."""
        from lancetx.cli.output import (
            FINDINGS,
            emit_json,
            handled,
            parse_storage_options,
            print_findings,
            print_table,
            progress,
            stdout_console,
        )
        from lancetx.ops.repair import repair_table
        from lancetx.ops.table import open_table

        options = parse_storage_options(storage_option)
        labels = {"list": "listing objects", "read": "reading manifests"}
        with handled("repair", json), progress(json, labels) as bar:
            report = repair_table(
                open_table(uri, options),
                version=version,
                transaction=transaction,
                yes=yes,
                force=force,
                dry_run=dry_run,
                backup_dir=backup_dir,
                progress=bar,
            )
        if json:
            emit_json("repair", report)
        else:
            console = stdout_console()
            if report.actions:
                print_table(
                    console,
                    "Dry run: would do" if dry_run else "Done",
                    ["version", "action", "detail"],
                    [[a.version, a.kind, a.detail] for a in report.actions],
                )
            for wedged, candidates in report.candidates.items():
                print_table(
                    console,
                    f"Candidate transactions for wedged version {wedged}",
                    ["transaction file", "read version", "operation", "usable", "problem"],
                    [
                        [c.name, c.read_version, c.operation, c.usable, c.problem]
                        for c in candidates
                    ],
                )
            if report.unresolved:
                print_findings(console, report.unresolved, title="Not repaired")
            elif not report.actions:
                console.print("[green]nothing to repair[/]")
        if not report.ok:
            raise typer.Exit(FINDINGS)
