"""Options every command shares, spelled once."""

from __future__ import annotations

from typing import Annotated

import typer

UriArg = Annotated[
    str,
    typer.Argument(
        metavar="URI",
        help="Table URI: s3+ddb://bucket/path?ddbTableName=TABLE (as pylance takes it).",
        show_default=False,
    ),
]
StorageOptions = Annotated[
    list[str] | None,
    typer.Option(
        "--storage-option",
        "-o",
        metavar="KEY=VALUE",
        help="A pylance storage option (repeatable), e.g. -o aws_region=eu-west-1. "
        "AWS_* and DYNAMODB_ENDPOINT environment variables apply as in the library.",
        show_default=False,
    ),
]
JsonOutput = Annotated[
    bool,
    typer.Option("--json", help="Print one JSON document with stable keys; no progress bars."),
]
DryRun = Annotated[
    bool,
    typer.Option("--dry-run", help="Show what would change; write nothing."),
]

TABLE = "'s3+ddb://bucket/events.lance?ddbTableName=manifests'"


def example(*lines: str) -> str:
    """An epilog showing example command lines (rendered under --help)."""
    # "\b" keeps click from re-wrapping the paragraph.
    return "Examples:\n\n\b\n" + "\n".join(f"  $ {line}" for line in lines)
