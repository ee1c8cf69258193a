"""``lancetx-sync create-table NAME``."""

from __future__ import annotations

from typing import Annotated

import typer

from lancetx.cli.options import DryRun, JsonOutput, StorageOptions, example


def register(app: typer.Typer) -> None:
    @app.command(
        "create-table",
        epilog=example(
            "lancetx-sync create-table lance_manifests -o aws_region=eu-west-1",
            "lancetx-sync create-table lance_manifests --read-capacity 50 --write-capacity 50 "
            "--tag team=data --pitr",
        ),
    )
    def create_table(
        name: Annotated[str, typer.Argument(metavar="NAME", help="DynamoDB table name.")],
        read_capacity: Annotated[
            int | None, typer.Option("--read-capacity", min=1, help="Provisioned RCUs.")
        ] = None,
        write_capacity: Annotated[
            int | None, typer.Option("--write-capacity", min=1, help="Provisioned WCUs.")
        ] = None,
        tag: Annotated[
            list[str] | None, typer.Option("--tag", metavar="KEY=VALUE", help="A tag (repeatable).")
        ] = None,
        pitr: Annotated[
            bool, typer.Option("--pitr", help="Enable point-in-time recovery.")
        ] = False,
        timeout: Annotated[
            float, typer.Option("--timeout", help="Seconds to wait for ACTIVE.")
        ] = 300.0,
        dry_run: DryRun = False,
        storage_option: StorageOptions = None,
        json: JsonOutput = False,
    ) -> None:
        """Create a DynamoDB table in Lance's manifest layout (HASH base_uri S, RANGE
        version N), on-demand unless capacities are given; wait until ACTIVE; stamp
        the lancetx store layout. An existing table of that layout is accepted."""
        from lancetx.cli.output import (
            emit_json,
            handled,
            parse_storage_options,
            say,
            stdout_console,
        )
        from lancetx.ops.create_table import create_manifest_table, manifest_table_client

        options = parse_storage_options(storage_option)
        tags = parse_storage_options(tag)
        with handled("create-table", json):
            client = manifest_table_client(options)
            report = create_manifest_table(
                client,
                name,
                read_capacity=read_capacity,
                write_capacity=write_capacity,
                tags=tags,
                point_in_time_recovery=pitr,
                timeout=timeout,
                dry_run=dry_run,
            )
        if json:
            emit_json("create-table", report)
            return
        console = stdout_console()
        if dry_run:
            say(console, f"would send CreateTable {report.request}")
        else:
            state = "created" if report.created else "already existed"
            say(
                console,
                f"table {name} {state}: {report.status}, {report.billing_mode}, "
                f"store layout {report.schema_version}"
                + (", point-in-time recovery on" if pitr else ""),
            )
