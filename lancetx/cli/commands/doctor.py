"""``lancetx-sync doctor URI``."""

from __future__ import annotations

from typing import Annotated

import typer

from lancetx.cli.options import TABLE, DryRun, JsonOutput, StorageOptions, UriArg, example


def register(app: typer.Typer) -> None:
    @app.command(
        epilog=example(
            f"lancetx-sync doctor {TABLE}",
            f"lancetx-sync doctor {TABLE} --role writer",
            f"lancetx-sync doctor {TABLE} --dry-run --json",
        )
    )
    def doctor(
        uri: UriArg,
        role: Annotated[
            str,
            typer.Option(
                "--role",
                help="Judge the permissions of this role (the credentials in use should be "
                "its): writer, reader, operator (lancetx-sync) or doctor.",
            ),
        ] = "operator",
        dry_run: DryRun = False,
        storage_option: StorageOptions = None,
        json: JsonOutput = False,
    ) -> None:
        """Check the setup: DynamoDB key schema and layout stamp, every permission the
        --role needs on this table's own keys and objects (probed; each ok or denied),
        whether the bucket honours If-None-Match, clock skew, and another bucket's
        table sharing this path and DynamoDB table. DynamoDB write probes write nothing
        (their condition cannot hold); writer, operator and doctor put and delete a
        probe object under _lancetx_probe/ (one left behind is named; gc collects it);
        --dry-run sends no write at all."""
        from lancetx.cli.output import (
            FINDINGS,
            emit_json,
            handled,
            parse_storage_options,
            stdout_console,
            table,
        )
        from lancetx.ops.doctor import DOCTOR_ROLES, run_doctor
        from lancetx.ops.table import open_table

        if role not in DOCTOR_ROLES:
            raise typer.BadParameter(
                f"expected one of {', '.join(DOCTOR_ROLES)}", param_hint="--role"
            )
        options = parse_storage_options(storage_option)
        with handled("doctor", json):
            report = run_doctor(
                open_table(uri, options, validate=False), probe_writes=not dry_run, role=role
            )
        if json:
            emit_json("doctor", report)
        else:
            stdout_console().print(
                table(
                    f"doctor {report.uri} (role {report.role})",
                    ["check", "status", "detail", "fix"],
                    [[c.name, c.status, c.detail, c.fix] for c in report.checks],
                )
            )
        if not report.ok:
            raise typer.Exit(FINDINGS)
