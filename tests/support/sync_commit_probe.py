"""A sync user's program, run as a subprocess by ``test_packaging.py``.

``python sync_commit_probe.py S3_ENDPOINT DYNAMODB_ENDPOINT BUCKET DDB_TABLE [--block-async]``

Creates the bucket and the DynamoDB table, has pylance create a table through
``s3+ddb://``, appends one batch through lancetx's sync commit loop, and prints
one JSON line: the committed version, the row count pylance reads back, and
which asyncio AWS packages ended up imported. With ``--block-async`` any import
of aioboto3 / aiobotocore / aiohttp raises first, as if they were not installed.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import sys
from collections.abc import Sequence

ASYNC_PACKAGES = ("aioboto3", "aiobotocore", "aiohttp")


class _RefuseAsyncPackages(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] in ASYNC_PACKAGES:
            raise ImportError(f"{fullname} is blocked: the sync API must not import it")
        return None


def main(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("--")]
    if "--block-async" in argv:
        sys.meta_path.insert(0, _RefuseAsyncPackages())
    s3_endpoint, ddb_endpoint, bucket, ddb_table = args

    import boto3
    import lance
    import pyarrow as pa

    import lancetx
    from lancetx.commit.engine.committer import commit_transaction, load_parent
    from lancetx.commit.engine.operations import Append, Transaction
    from lancetx.commit.format.fragments import fragment_from_pylance
    from lancetx.externalstore.connect import connect
    from lancetx.externalstore.dynamodb.store import create_table

    creds = {
        "region_name": "us-east-1",
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
    }
    boto3.client("s3", endpoint_url=s3_endpoint, **creds).create_bucket(Bucket=bucket)
    create_table(boto3.client("dynamodb", endpoint_url=ddb_endpoint, **creds), ddb_table)
    options = {
        "aws_endpoint": s3_endpoint,
        "dynamodb_endpoint": ddb_endpoint,
        "allow_http": "true",
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
        "aws_region": "us-east-1",
    }
    uri = f"s3+ddb://{bucket}/probe.lance?ddbTableName={ddb_table}"
    lance.write_dataset(pa.table({"x": [0]}), uri, storage_options=options)

    conn = connect(uri, options)
    parent = load_parent(conn.handler, conn.base)
    assert parent is not None
    files = lance.fragment.write_fragments(
        pa.table({"x": [1, 2]}), conn.data_uri, storage_options=options
    )
    txn = Transaction(
        read_version=parent.version,
        operation=Append(fragments=tuple(fragment_from_pylance(f) for f in files)),
    )
    done = commit_transaction(conn.handler, conn.base, txn, parent=parent)
    rows = lance.dataset(uri, storage_options=options).count_rows()
    loaded = sorted(m for m in sys.modules if m.partition(".")[0] in ASYNC_PACKAGES)
    print(
        json.dumps(
            {
                "version": done.version,
                "rows": rows,
                "async_modules": loaded,
                "lancetx": lancetx.__version__,
                "boto3": boto3.__version__,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
