"""Shared fixtures: one embedded moto server (S3 + DynamoDB over HTTP) per session.

Each test gets fresh bucket/table names, so tests never see each other's state.
Fake credentials are forced so nothing can reach real AWS.

``make test-localstack`` sets ``LANCETX_TEST_BACKEND=external``: then ``aws`` is
LocalStack's S3 + dynalite instead (``external_backend.py``), moto cannot be
imported, and only tests marked ``integration`` are meant to run.
"""

from __future__ import annotations

import os
import signal
import tempfile
import uuid
from collections.abc import Iterator

import boto3
import external_backend
import pytest
import suite_profile
import worker_scopes
from hypothesis import settings

from lancetx.commit.storage.aws_clients import clear_client_cache
from lancetx.demo.embedded import EmbeddedAws

# CI runs a fixed set of examples (a landing must not depend on a lucky seed);
# local runs keep exploring new ones.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

for _key, _value in {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}.items():
    os.environ[_key] = _value
for _key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
    os.environ.pop(_key, None)
# botocore's data copies (lancetx.commit.storage.aws_model_cache) go to a temporary
# directory, not the home of whoever runs the tests; subprocesses inherit it.
os.environ.setdefault(
    "LANCETX_AWS_MODEL_CACHE", os.path.join(tempfile.gettempdir(), "lancetx-tests-botocore")
)


if external_backend.selected():
    external_backend.install_moto_guard()

# Where the environment forbids bytecode files (PYTHONDONTWRITEBYTECODE, set on some
# CI images), every process a test starts (the CLI, spawned writers, Spark's Python
# workers) would compile lancetx and its dependencies from source again: they write it
# to a cache outside the tree instead.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
    os.environ.setdefault(
        "PYTHONPYCACHEPREFIX", os.path.join(tempfile.gettempdir(), "lancetx-tests-pycache")
    )

# A run started in the background of a non-interactive shell (`make test &`, nohup, a
# CI step's job control off) inherits SIGINT ignored, and every process a test starts
# would too: a test that sends Ctrl-C to a child would see it ignored. A handler of our
# own here makes children start with the default again (exec resets handlers).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """Under pytest-xdist (``make test`` runs two workers): every Spark test on one
    worker, so the run starts one Spark session (``tests/support/worker_scopes.py``)."""
    if config.getoption("dist") == "each":
        return None
    return worker_scopes.make_scheduler(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not suite_profile.is_long():
        later = pytest.mark.skip(reason="long profile only: LANCETX_TEST_PROFILE=long (.ci/run)")
        for item in items:
            if item.get_closest_marker("long_only"):
                item.add_marker(later)
    if suite_profile.long_pass_follows():
        left = pytest.mark.skip(
            reason=f"run at full size by the long pass ({suite_profile.LONG_PASS_FOLLOWS_VARIABLE})"
        )
        for item in items:
            if item.get_closest_marker("long"):
                item.add_marker(left)
    if external_backend.selected():
        skip = pytest.mark.skip(reason="needs the embedded server (marked embedded_only)")
        for item in items:
            if item.get_closest_marker("embedded_only"):
                item.add_marker(skip)


def pytest_report_header(config: pytest.Config) -> str:
    sizes = f"profile: {suite_profile.profile()} ({suite_profile.PROFILE_VARIABLE})"
    if external_backend.selected():
        aws = external_backend.ExternalAws.from_environ()
        return (
            f"backend: {aws.name} (S3 {aws.endpoint}, DynamoDB {aws.dynamodb_endpoint}); "
            f"moto: refused at import; {sizes}"
        )
    return f"backend: embedded moto server (S3 + DynamoDB on 127.0.0.1); {sizes}"


@pytest.fixture(autouse=True)
def _own_aws_clients() -> None:
    """Each test starts without the process's shared boto3 clients: event handlers a
    test registers on them (request logs, fault hooks) must not outlive it."""
    clear_client_cache()


@pytest.fixture(scope="session")
def aws() -> Iterator[EmbeddedAws]:
    """The session's embedded moto server (conditional S3 writes honoured), or the
    external servers of ``make test-localstack``."""
    if external_backend.selected():
        yield external_backend.ExternalAws.from_environ()  # type: ignore[misc]
        return
    with EmbeddedAws() as server:
        yield server


@pytest.fixture
def legacy_aws(aws: EmbeddedAws) -> Iterator[EmbeddedAws]:
    """The same server with S3 ignoring If-None-Match for the duration of a test."""
    aws.legacy_s3 = True
    try:
        yield aws
    finally:
        aws.legacy_s3 = False
        aws.set_interceptor(None)


@pytest.fixture
def s3_client(aws: EmbeddedAws):  # type: ignore[no-untyped-def]
    return boto3.client("s3", **aws.client_kwargs())


@pytest.fixture
def ddb_client(aws: EmbeddedAws):  # type: ignore[no-untyped-def]
    return boto3.client("dynamodb", **aws.client_kwargs("dynamodb"))


@pytest.fixture
def bucket(aws: EmbeddedAws, s3_client) -> str:  # type: ignore[no-untyped-def]
    """A fresh, empty bucket."""
    name = f"lancetx-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=name)
    return name


@pytest.fixture
def ddb_table_name() -> str:
    """A fresh DynamoDB table name (not created)."""
    return f"lancetx_{uuid.uuid4().hex[:12]}"
