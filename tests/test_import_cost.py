"""What a fresh process imports: ``import lancetx``, ``lancetx.open`` and the CLI load only
what they use (every CLI call and every Spark task pays its imports anew). No timing:
each test runs a new interpreter and checks which modules it loaded, so a top-level
import that brings a heavy module back fails here whatever the machine's load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
from cli_helpers import make_table

import lancetx
from lancetx.demo.embedded import EmbeddedAws

#: Loaded by no path below: the async SDK, Spark, the CLI's own libraries.
NEVER = ("aioboto3", "aiobotocore", "pyspark", "pyspark_lancetx", "rich", "lancetx.aio")

#: Not loaded by ``import lancetx`` (each is loaded on first use of a name that needs it).
NOT_ON_IMPORT = (
    *NEVER,
    "typer",
    "botocore",
    "boto3",
    "pyarrow",
    "numpy",
    "lance",
    "google.protobuf",
    "asyncio",
    "importlib.metadata",
    "lancetx.errors",
    "lancetx.table",
    "lancetx.committing",
    "lancetx.commit.engine",
    "lancetx.commit.engine.committer",
    "lancetx.externalstore.connect",
    "lancetx.externalstore.dynamodb",
)

#: Not loaded by opening a table (``lancetx.open(uri).version``): the CLI, pylance
#: (reads load it when they need it), the operator tools, multi-table commits; the
#: data plane's Python side (pyarrow, numpy: a version is read from its manifest),
#: asyncio (the open is sync), the commit engine that builds and claims manifests,
#: the verbs and what only they use.
NOT_ON_OPEN = (
    *NEVER,
    "typer",
    "lance",
    "pyarrow",
    "numpy",
    "asyncio",
    "statistics",
    "lancetx.cli",
    "lancetx.ops",
    "lancetx.multi_table",
    "lancetx.externalstore.multi_table",
    "lancetx.committing",
    "lancetx.verbs",
    "lancetx.writer",
    "lancetx.convert",
    "lancetx.tags",
    "lancetx.history",
    "lancetx.commit.engine.committer",
    "lancetx.commit.engine.builder.driver",
    "lancetx.commit.engine.builder.common",
    "lancetx.commit.engine.builder.ops",
    "lancetx.commit.engine.rebase",
    "lancetx.commit.engine.turns",
    "lancetx.commit.format.schema",
    # the engine that checks and builds commits: its operations and conflict rules
    # (opening reads a version: ``commit/engine/parents.py``)
    "lancetx.commit.engine.loading",
    "lancetx.commit.engine.operations",
    "lancetx.commit.engine.conflicts",
    "lancetx.commit.engine.conflict_terms",
    "lancetx.commit.engine.conflict_conditions",
    "lancetx.commit.engine.contention",
    "lancetx.commit.engine.builder",
    "lancetx.commit.format.fragments",
    "lancetx.commit.format.rowids",
    # the error tree (the front door imports it when it raises one of its errors)
    "lancetx.errors",
    # what a first use loads: a Gather's thread pool (and its exit hook), lean GETs,
    # importlib.metadata's lookup of lancetx's version
    "concurrent.futures.thread",
    "lancetx.commit.storage.s3_lean",
    "pyroaring",
)

#: Not loaded by opening a local table either: nothing of AWS (botocore is imported
#: by an S3 table's store), the DynamoDB store, the external store's protocol.
NOT_ON_LOCAL_OPEN = (
    *NOT_ON_OPEN,
    "botocore",
    "boto3",
    "urllib3",
    "lancetx.commit.storage.s3store",
    "lancetx.commit.storage.aws_clients",
    "lancetx.externalstore.dynamodb",
    "lancetx.externalstore.commit_handler",
    "lancetx.externalstore.protocol",
    "importlib.metadata",
)

#: Not loaded by ``lancetx-sync status``: the data plane (a status reads DynamoDB
#: items, manifests and listings; Arrow deletion files are read by those who read them).
NOT_ON_STATUS = (
    "aioboto3",
    "aiobotocore",
    "pyspark",
    "pyspark_lancetx",
    "lancetx.aio",
    "pyarrow",
    "numpy",
    "lance",
    "asyncio",
    "lancetx.committing",
)

#: Not loaded by ``lancetx-sync --help``: nothing of the data plane or AWS.
NOT_ON_HELP = (
    *NEVER,
    "botocore",
    "boto3",
    "pyarrow",
    "lance",
    "lancetx.table",
    "lancetx.commit.engine",
    "lancetx.externalstore.connect",
)


def loaded_by(code: str, *args: str, env: dict[str, str] | None = None) -> set[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    script = textwrap.dedent(code) + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def heavy_in(loaded: set[str], names: tuple[str, ...]) -> list[str]:
    """The names in ``names`` that ``loaded`` holds (a package counts with any submodule)."""
    return sorted(n for n in names if any(m == n or m.startswith(f"{n}.") for m in loaded))


def assert_none_loaded(loaded: set[str], names: tuple[str, ...]) -> None:
    found = heavy_in(loaded, names)
    assert not found, f"loaded what it should not: {', '.join(found)}"


def test_import_lancetx_loads_none_of_the_heavy_modules() -> None:
    loaded = loaded_by("import lancetx")
    assert_none_loaded(loaded, NOT_ON_IMPORT)


def test_every_exported_name_still_imports_from_the_package() -> None:
    loaded = loaded_by(
        "import lancetx\n"
        "missing = [n for n in lancetx.__all__ if n not in dir(lancetx)]\n"
        "assert not missing, missing\n"
        "from lancetx import *  # noqa: F403\n"
        "from lancetx import LancetxError, Table, open, __version__\n"
        "assert issubclass(LancetxError, Exception) and Table.__name__ == 'Table'\n"
        "assert isinstance(__version__, str) and __version__\n"
        "try:\n"
        "    lancetx.NoSuchName\n"
        "except AttributeError as exc:\n"
        "    assert 'NoSuchName' in str(exc)\n"
        "else:\n"
        "    raise AssertionError('lancetx.NoSuchName did not raise AttributeError')\n"
    )
    assert "lancetx.table" in loaded
    # the same objects as the modules they come from: one class per error, not a copy
    from lancetx.errors import LancetxError
    from lancetx.table import Table

    assert lancetx.LancetxError is LancetxError
    assert lancetx.Table is Table


def test_opening_a_table_loads_only_what_the_open_uses(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    table = make_table(aws, bucket, ddb_table_name)
    loaded = loaded_by(
        """
        import json, sys, threading
        import lancetx
        assert lancetx.open(sys.argv[1], storage_options=json.loads(sys.argv[2])).version == 2
        # nothing started that the interpreter would wait for at exit
        others = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
        assert not others, others
        """,
        table.uri,
        json.dumps(table.options),
    )
    assert_none_loaded(loaded, NOT_ON_OPEN)


def test_opening_a_table_from_the_environment_loads_only_what_the_open_uses(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    """The issue's program exactly (``import lancetx; lancetx.open(uri).version``): the
    endpoint and credentials come from the environment, as a deployment's do."""
    table = make_table(aws, bucket, ddb_table_name)
    loaded = loaded_by(
        "import sys, lancetx\nassert lancetx.open(sys.argv[1]).version == 2\n",
        table.uri,
        env={**os.environ, **aws.environ()},
    )
    assert_none_loaded(loaded, NOT_ON_OPEN)


def test_opening_a_local_table_loads_nothing_of_aws(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    lancetx.write_table(uri, pa.table({"id": [1, 2, 3]}))
    loaded = loaded_by(
        """
        import sys, threading
        import lancetx
        assert lancetx.open(sys.argv[1]).version == 1
        others = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
        assert not others, others
        """,
        uri,
    )
    assert_none_loaded(loaded, NOT_ON_LOCAL_OPEN)


def test_opening_a_table_reads_lancetx_version_as_importlib_metadata_does() -> None:
    """The User-Agent's version is read from lancetx's ``.dist-info`` without
    importlib.metadata (an S3 table's store asks for it when it builds its clients)."""
    from importlib import metadata

    from lancetx.commit.package_version import installed_version

    installed_version.cache_clear()
    try:
        assert installed_version() == metadata.version("lancetx")
    finally:
        installed_version.cache_clear()


def test_cli_status_loads_none_of_the_data_plane(
    aws: EmbeddedAws, bucket: str, ddb_table_name: str
) -> None:
    table = make_table(aws, bucket, ddb_table_name)
    loaded = loaded_by(
        """
        import sys
        sys.argv = ["lancetx-sync", "status", *sys.argv[1:]]
        from lancetx.cli.app import main
        try:
            main()
        except SystemExit as exc:
            assert exc.code in (0, None), exc.code
        """,
        table.uri,
        env={**os.environ, **aws.environ()},
    )
    assert "lancetx.ops.status" in loaded
    assert_none_loaded(loaded, NOT_ON_STATUS)


def test_cli_help_loads_neither_aws_nor_the_data_plane() -> None:
    loaded = loaded_by(
        """
        import sys
        sys.argv = ["lancetx-sync", "--help"]
        from lancetx.cli.app import main
        try:
            main()
        except SystemExit as exc:
            assert exc.code in (0, None), exc.code
        """
    )
    assert "typer" in loaded
    assert_none_loaded(loaded, NOT_ON_HELP)
