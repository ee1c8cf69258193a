"""``lancetx-sync gc URI --older-than 7d``."""

from __future__ import annotations

from typing import Annotated

import typer

from lancetx.cli.options import TABLE, JsonOutput, StorageOptions, UriArg, example


def register(app: typer.Typer) -> None:
    @app.command(
        epilog=example(
            f"lancetx-sync gc {TABLE} --older-than 7d            # dry run: what and how many bytes",
            f"lancetx-sync gc {TABLE} --older-than 7d --delete",
        )
    )
    def gc(
        uri: UriArg,
        older_than: Annotated[
            str,
            typer.Option(
                "--older-than",
                help="Only objects older than this (7d, 12h, 30m, 45s). It must exceed how "
                "long a writer may take between writing a file and committing it; below 10m "
                "(the commit budget plus a margin) it is refused.",
            ),
        ] = "7d",
        force_unsafe_threshold: Annotated[
            bool,
            typer.Option(
                "--force-unsafe-threshold",
                help="Accept an --older-than below the minimum (only when no writer can be "
                "committing). Files younger than the commit budget (5m), and those a "
                "transaction file younger than 10m names, are kept regardless.",
            ),
        ] = False,
        delete: Annotated[
            bool, typer.Option("--delete", help="Delete (the default is a dry run).")
        ] = False,
        dry_run: Annotated[
            bool, typer.Option("--dry-run", help="Only report (the default).")
        ] = False,
        storage_option: StorageOptions = None,
        json: JsonOutput = False,
    ) -> None:
        """Delete orphan staged manifests, transaction files of failed attempts, and data
        and deletion files no version references (failed Spark tasks), older than the
        threshold. Dry run unless --delete; never deletes what a version committed
        after the scan started references."""
        from lancetx.cli.output import (
            FINDINGS,
            emit_json,
            handled,
            parse_storage_options,
            print_table,
            progress,
            say,
            stdout_console,
            usage_error,
        )
        from lancetx.ops.gc import (
            COMMIT_BUDGET,
            MINIMUM_OLDER_THAN,
            collect_garbage,
            format_age,
            parse_age,
            unsafe_threshold_error,
        )
        from lancetx.ops.table import open_table

        options = parse_storage_options(storage_option)
        try:
            age = parse_age(older_than)
            if age < MINIMUM_OLDER_THAN and not force_unsafe_threshold:
                raise unsafe_threshold_error(age)
        except ValueError as exc:  # UnsafeThresholdError too: a usage error, exit 2
            raise typer.BadParameter(str(exc), param_hint="--older-than") from None
        if delete and dry_run:
            usage_error("--delete and --dry-run exclude each other", as_json=json, command="gc")
        labels = {"list": "listing objects", "read": "reading manifests", "delete": "deleting"}
        with handled("gc", json), progress(json, labels) as bar:
            report = collect_garbage(
                open_table(uri, options),
                older_than=age,
                dry_run=not delete,
                progress=bar,
                force_unsafe_threshold=force_unsafe_threshold,
            )
        if json:
            emit_json("gc", report)
        else:
            console = stdout_console()
            if report.candidates:
                print_table(
                    console,
                    "Would delete" if report.dry_run else "Deleted",
                    ["kind", "key", "bytes", "last modified"],
                    [[c.kind, c.key, c.size, c.last_modified] for c in report.candidates],
                )
            say(
                console,
                f"{len(report.candidates)} object(s), {report.bytes_reclaimable} bytes "
                + ("reclaimable (dry run; add --delete)" if report.dry_run else "reclaimed"),
            )
            if age < MINIMUM_OLDER_THAN:
                console.print(
                    "kept regardless of --older-than: objects younger than "
                    f"{format_age(COMMIT_BUDGET)}, and transaction files younger than "
                    f"{format_age(MINIMUM_OLDER_THAN)} with the files they name"
                )
            for error in report.errors:
                say(console, f"not deleted: {error}")
        if not report.ok:
            raise typer.Exit(FINDINGS)
