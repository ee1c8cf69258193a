"""The ``lancetx-sync`` application: one typer app, a command per module."""

from __future__ import annotations

import logging
import os

import typer

from lancetx.cli.commands import (
    cleanup,
    create_table,
    doctor,
    gc,
    iam_policy,
    migrate,
    onboard,
    repair,
    status,
    verify,
)

app = typer.Typer(
    name="lancetx-sync",
    help="Inspect, verify and repair Lance tables whose commits go through DynamoDB "
    "(s3+ddb://). Exit codes: 0 ok, 1 findings or failed, 2 usage.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)

for module in (
    status,
    verify,
    repair,
    gc,
    cleanup,
    onboard,
    create_table,
    doctor,
    iam_policy,
    migrate,
):
    module.register(app)


def main() -> None:
    """Console-script entry point."""
    from lancetx.commit.storage.secrets import install_log_redaction

    level = os.environ.get("LANCETX_LOG_LEVEL", "WARNING").upper()
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    # At DEBUG botocore prints each request, session token included: every record
    # passes the redaction first (secrets from options, config and environment).
    install_log_redaction()
    app()
