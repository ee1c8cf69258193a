"""``lancetx-sync cleanup URI --keep-versions N | --older-than AGE``."""

from __future__ import annotations

from typing import Annotated

import typer

from lancetx.cli.options import TABLE, DryRun, JsonOutput, StorageOptions, UriArg, example


def register(app: typer.Typer) -> None:
    @app.command(
        epilog=example(
            f"lancetx-sync cleanup {TABLE} --older-than 30d --dry-run",
            f"lancetx-sync cleanup {TABLE} --keep-versions 10",
        )
    )
    def cleanup(
        uri: UriArg,
        keep_versions: Annotated[
            int | None,
            typer.Option("--keep-versions", min=1, help="Keep at least the newest N versions."),
        ] = None,
        older_than: Annotated[
            str | None,
            typer.Option("--older-than", help="Remove only versions older than this (30d, 12h)."),
        ] = None,
        items_older_than: Annotated[
            str,
            typer.Option(
                "--items-older-than",
                help="Delete a removed version's DynamoDB item only once the version is this "
                "old: until then the item stops writers holding an old parent from "
                "committing a version below the latest.",
            ),
        ] = "7d",
        dry_run: DryRun = False,
        storage_option: StorageOptions = None,
        json: JsonOutput = False,
    ) -> None:
        """Remove old versions (manifests, the files only they reference, and their
        DynamoDB items) with Lance's cleanup_old_versions rules: never the latest or a
        tagged version; files a kept version references stay. A removed version's item
        is deleted only once it is older than --items-older-than."""
        from lancetx.cli.output import (
            FINDINGS,
            emit_json,
            handled,
            parse_storage_options,
            progress,
            say,
            stdout_console,
        )
        from lancetx.ops.cleanup import cleanup_versions
        from lancetx.ops.gc import parse_age
        from lancetx.ops.table import open_table

        options = parse_storage_options(storage_option)
        if keep_versions is None and older_than is None:
            raise typer.BadParameter(
                "give --keep-versions N and/or --older-than AGE", param_hint="--keep-versions"
            )
        try:
            age = parse_age(older_than) if older_than is not None else None
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--older-than") from None
        try:
            fence = parse_age(items_older_than)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--items-older-than") from None
        labels = {"list": "listing objects", "read": "reading manifests", "delete": "deleting"}
        with handled("cleanup", json), progress(json, labels) as bar:
            report = cleanup_versions(
                open_table(uri, options),
                keep_versions=keep_versions,
                older_than=age,
                items_older_than=fence,
                dry_run=dry_run,
                progress=bar,
            )
        if json:
            emit_json("cleanup", report)
        else:
            console = stdout_console()
            verb = "would remove" if dry_run else "removed"
            say(
                console,
                f"{verb} versions {report.removed_versions or 'none'}; kept "
                f"{len(report.kept_versions)} (latest {report.latest_version}); "
                f"{len(report.files_deleted)} file(s), {len(report.items_deleted)} item(s); "
                f"{len(report.items_kept_as_fence)} item(s) kept until older than "
                f"{items_older_than}",
            )
            for error in report.errors:
                say(console, f"error: {error}")
        if not report.ok:
            raise typer.Exit(FINDINGS)
