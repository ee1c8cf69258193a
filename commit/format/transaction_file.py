"""Transaction files: ``_transactions/{read_version}-{uuid}.txn``.

A transaction file holds one ``lance.table.Transaction`` message as plain
protobuf (no length prefix, unlike the sections of a manifest file). The
manifest of the version it produced names it in ``transaction_file``, relative
to ``_transactions/``. Lance writes one on every commit attempt, so files of
lost attempts may exist that no manifest names.

Since Lance 1.0 the transaction is also stored inline in the manifest file;
:func:`read_transaction_of` prefers that copy, as Lance's ``read_transaction`` does.
"""

from __future__ import annotations

from google.protobuf.message import DecodeError

from lancetx.commit.errors import TransactionFileError
from lancetx.commit.format import naming
from lancetx.commit.format.manifest import ManifestFile
from lancetx.commit.storage.limits import TRANSACTION, read_capped
from lancetx.commit.storage.objectstore import ObjectStore
from lancetx.protos import transaction_pb2


def transaction_file_name(txn: transaction_pb2.Transaction) -> str:
    """The file name Lance gives ``txn``: ``{read_version}-{uuid}.txn``."""
    if not txn.uuid:
        raise ValueError("a transaction needs a uuid before it can be written")
    return naming.transaction_file_name(txn.read_version, txn.uuid)


def write_transaction_file(store: ObjectStore, base: str, txn: transaction_pb2.Transaction) -> str:
    """Write ``txn`` to ``_transactions/`` under ``base``; return the file name
    to put in ``Manifest.transaction_file``.

    A plain (overwriting) PUT, as in Lance: the name embeds the transaction's
    uuid, so a retry of the same attempt rewrites identical bytes.
    """
    if txn.WhichOneof("operation") is None:
        raise ValueError("a transaction needs an operation before it can be written")
    name = transaction_file_name(txn)
    store.put(naming.transaction_key(base, name), txn.SerializeToString())
    return name


def decode_transaction(data: bytes, *, path: str) -> transaction_pb2.Transaction:
    """Decode transaction-file bytes; raise TransactionFileError naming ``path``.

    Protobuf parsing accepts many byte strings, so the message must also carry
    an operation (Lance refuses a transaction without one).
    """
    txn = transaction_pb2.Transaction()
    try:
        txn.ParseFromString(data)
    except DecodeError as exc:
        raise TransactionFileError(
            path, f"does not decode as a lance.table.Transaction protobuf ({exc})"
        ) from None
    if txn.WhichOneof("operation") is None:
        raise TransactionFileError(
            path,
            f"decodes to a lance.table.Transaction without an operation ({len(data)} bytes); "
            "the file is corrupt or not a transaction file",
        )
    return txn


def read_transaction_file(
    store: ObjectStore, base: str, file_name: str
) -> transaction_pb2.Transaction:
    """Read ``_transactions/{file_name}`` under ``base``.

    Raises ObjectNotFoundError if it is absent and TransactionFileError if it
    does not decode (TransactionTooLargeError, before reading it, if it is over the
    store's cap on transaction files), or if ``file_name`` (a manifest's word) could
    name an object outside ``_transactions/`` (``..``, a subfolder, absolute): nothing
    is read then.
    """
    problem = naming.unsafe_transaction_file_name(file_name)
    if problem is not None:
        raise TransactionFileError(
            store.uri(naming.join(base, naming.TRANSACTIONS_DIR)),
            f"the manifest names transaction file {file_name!r} ({problem}); not read",
        )
    key = naming.transaction_key(base, file_name)
    return decode_transaction(read_capped(store, key, TRANSACTION), path=store.uri(key))


def read_transaction_of(
    store: ObjectStore, base: str, manifest_file: ManifestFile
) -> transaction_pb2.Transaction | None:
    """The transaction that produced ``manifest_file``'s version.

    The inline copy in the manifest file first, then the file named by
    ``transaction_file``; None when the version has neither (tables written
    before Lance kept transactions).
    """
    if manifest_file.transaction is not None:
        return manifest_file.transaction
    if manifest_file.manifest.transaction_file:
        return read_transaction_file(store, base, manifest_file.manifest.transaction_file)
    return None


__all__ = [
    "decode_transaction",
    "read_transaction_file",
    "read_transaction_of",
    "transaction_file_name",
    "write_transaction_file",
]
