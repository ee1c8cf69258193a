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
            f"lancetx-sync iam-policy {TABLE} --account 123456789012 --region eu-west-1 --json",
            f"lancetx-sync iam-policy {TABLE} --role reader --any-account "
            "--kms-key arn:aws:kms:eu-west-1:123456789012:key/KEY-ID",
        ),
    )
    def iam_policy(
        uri: UriArg,
        role: Annotated[
            str | None,
            typer.Option(
                "--role",
                help="writer, reader, operator (lancetx-sync), doctor or admin (create-table); "
                "default: all, as one JSON document. 'cli' is an old name of operator.",
            ),
        ] = None,
        account: Annotated[
            str | None, typer.Option("--account", help="AWS account id owning the DynamoDB table.")
        ] = None,
        region: Annotated[
            str | None, typer.Option("--region", help="The DynamoDB table's region.")
        ] = None,
        any_account: Annotated[
            bool,
            typer.Option(
                "--any-account",
                help="Allow the DynamoDB table of this name in every account (and, without "
                "--region, every region) instead of one.",
            ),
        ] = False,
        kms_key: Annotated[
            str | None,
            typer.Option(
                "--kms-key",
                help="ARN of the KMS key encrypting the bucket (SSE-KMS): kms:Decrypt for "
                "reading roles, kms:GenerateDataKey for writing ones.",
            ),
        ] = None,
        storage_option: StorageOptions = None,
        json: JsonOutput = False,
    ) -> None:
        """Print least-privilege IAM policy JSON per role: each role's objects under the
        table's prefix and its own DynamoDB partition keys (dynamodb:LeadingKeys), the
        shared layout stamp read-only. Makes no request."""
        import json as jsonlib
        import sys

        from lancetx.cli.output import emit_json, handled, parse_storage_options
        from lancetx.ops.iam_policy import OPERATOR, ROLES, iam_policies
        from lancetx.ops.table import open_table

        chosen = OPERATOR if role == "cli" else role
        if chosen is not None and chosen not in ROLES:
            raise typer.BadParameter(f"expected one of {', '.join(ROLES)}", param_hint="--role")
        if not any_account and (account is None or region is None):
            raise typer.BadParameter(
                "give --account and --region of the DynamoDB table (or --any-account)",
                param_hint="--account/--region",
            )
        options = parse_storage_options(storage_option)
        with handled("iam-policy", json):
            policies = iam_policies(
                open_table(uri, options, validate=False),
                account=account,
                region=region,
                any_account=any_account,
                kms_key=kms_key,
                roles=ROLES if chosen is None else (chosen,),
            )
        if chosen is not None and not json:
            sys.stdout.write(jsonlib.dumps(policies.policies[chosen], indent=2) + "\n")
        else:
            emit_json(
                "iam-policy",
                {
                    "uri": policies.uri,
                    "account": policies.account,
                    "region": policies.region,
                    "kms_key": policies.kms_key,
                    **policies.policies,
                },
            )
