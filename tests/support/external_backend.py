"""S3 and DynamoDB served by other processes, for ``make test-localstack``.

With ``LANCETX_TEST_BACKEND=external`` the ``aws`` fixture yields an
:class:`ExternalAws` instead of the embedded moto server: S3 at
``LANCETX_TEST_S3_ENDPOINT`` (LocalStack in host mode) and DynamoDB at
``LANCETX_TEST_DYNAMODB_ENDPOINT`` (dynalite). Only tests marked
``integration`` run there; they use the same fixtures and methods as against
moto. What only the embedded server can do — intercept requests to inject
faults, or make S3 ignore ``If-None-Match`` — skips the test that asks for it,
saying why. moto is refused at import, so a passing run cannot have used it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from typing import Any

import pytest

FAKE_ACCESS_KEY = "testing"
FAKE_SECRET_KEY = "testing"
REGION = "us-east-1"


def selected() -> bool:
    """Whether this test run targets external servers."""
    return os.environ.get("LANCETX_TEST_BACKEND", "embedded") == "external"


class RefuseMoto(importlib.abc.MetaPathFinder):
    """Makes ``import moto`` fail: a run against external servers must not use it."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] == "moto":
            raise ImportError("moto is refused: this run targets external S3 and DynamoDB")
        return None


class ExternalAws:
    """The embedded server's test interface, for S3 and DynamoDB on separate servers."""

    def __init__(self, s3_endpoint: str, dynamodb_endpoint: str, name: str) -> None:
        self.endpoint = s3_endpoint
        self.dynamodb_endpoint = dynamodb_endpoint
        self.name = name
        self._legacy_s3 = False

    @classmethod
    def from_environ(cls) -> ExternalAws:
        try:
            s3 = os.environ["LANCETX_TEST_S3_ENDPOINT"]
            ddb = os.environ["LANCETX_TEST_DYNAMODB_ENDPOINT"]
        except KeyError as missing:
            raise pytest.UsageError(
                f"LANCETX_TEST_BACKEND=external needs {missing.args[0]} (see localstack/README.md)"
            ) from None
        return cls(s3, ddb, os.environ.get("LANCETX_TEST_BACKEND_NAME", "external servers"))

    @property
    def legacy_s3(self) -> bool:
        return self._legacy_s3

    @legacy_s3.setter
    def legacy_s3(self, value: bool) -> None:
        # The s3+ddb:// path never sends a conditional header, so it behaves the same
        # whether or not the server would honour one; tests that need a server that
        # ignores them are not marked integration.
        self._legacy_s3 = value

    def set_interceptor(self, interceptor: object) -> None:
        if interceptor is not None:
            pytest.skip("needs the embedded server's request interceptor (fault injection)")

    def implements_transactions(self) -> bool:
        """Whether the DynamoDB server implements TransactWriteItems (dynalite does
        not): an empty request is refused as invalid by a server that has it, and as
        an unknown operation by one that does not."""
        import boto3
        from botocore.config import Config
        from botocore.exceptions import ClientError

        client = boto3.client(
            "dynamodb",
            config=Config(parameter_validation=False, retries={"max_attempts": 1}),
            **self.client_kwargs("dynamodb"),
        )
        try:
            client.transact_write_items(TransactItems=[])
        except ClientError as exc:
            return exc.response.get("Error", {}).get("Code") != "UnknownOperationException"
        return True

    def client_kwargs(self, service: str = "s3") -> dict[str, Any]:
        return {
            "endpoint_url": self.dynamodb_endpoint if service == "dynamodb" else self.endpoint,
            "region_name": REGION,
            "aws_access_key_id": FAKE_ACCESS_KEY,
            "aws_secret_access_key": FAKE_SECRET_KEY,
        }

    def pylance_storage_options(self) -> dict[str, str]:
        return {
            "aws_endpoint": self.endpoint,
            "dynamodb_endpoint": self.dynamodb_endpoint,
            "allow_http": "true",
            "aws_access_key_id": FAKE_ACCESS_KEY,
            "aws_secret_access_key": FAKE_SECRET_KEY,
            "aws_region": REGION,
        }

    def environ(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "DYNAMODB_ENDPOINT": self.dynamodb_endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": FAKE_ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": FAKE_SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
        }


def implements_transactions(aws: object) -> bool:
    """Whether the test run's DynamoDB implements TransactWriteItems (the embedded
    server does)."""
    return not isinstance(aws, ExternalAws) or aws.implements_transactions()


def install_moto_guard() -> None:
    if not any(isinstance(f, RefuseMoto) for f in sys.meta_path):
        sys.meta_path.insert(0, RefuseMoto())
