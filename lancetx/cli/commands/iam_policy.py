"""``lancetx-sync iam-policy URI``."""

from __future__ import annotations

from typing import Annotated

import typer

from lancetx.cli.options import TABLE, JsonOutput, StorageOptions, UriArg, example


def register(app: typer.Typer) -> None:
    @app.command(
        "iam-policy",
        epilog=example(
            f"lancetx-sync iam-policy {TABLE} --role writer --account 123456789012 --region eu-west-1",
            f"lancetx-sync iam-policy {TABLE} --json",
        ),
    )
    def iam_policy(
        uri: UriArg,
        role: Annotated[
            str | None,
            typer.Option("--role", help="writer, reader or cli (default: all three, as JSON)."),
        ] = None,
        account: Annotated[str, typer.Option("--account", help="AWS account id.")] = "*",
        region: Annotated[str, typer.Option("--region", help="DynamoDB region.")] = "*",
        storage_option: StorageOptions = None,
        json: JsonOutput = False,
    ) -> None:
        """Print least-privilege IAM policy JSON for the table's writers, readers and
        this CLI. Makes no request."""
        import json as jsonlib
        import sys

        from lancetx.cli.output import emit_json, handled, parse_storage_options
        from lancetx.ops.iam_policy import iam_policies
        from lancetx.ops.table import open_table

        if role not in (None, "writer", "reader", "cli"):
            raise typer.BadParameter("expected writer, reader or cli", param_hint="--role")
        options = parse_storage_options(storage_option)
        with handled("iam-policy", json):
            policies = iam_policies(
                open_table(uri, options, validate=False), region=region, account=account
            )
        if role is not None:
            sys.stdout.write(jsonlib.dumps(getattr(policies, role), indent=2) + "\n")
        else:
            emit_json("iam-policy", policies)
