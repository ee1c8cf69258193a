"""Generated protobuf modules for the Lance table format (package lance.table / lance.file).

Modules (generated from the .proto files next to this one by ``tools/regenerate_protos.py``;
run ``make protos`` after editing a .proto, never edit the ``*_pb2`` files):

* ``file_pb2``        -- lance.file: Field, Schema, Encoding, Dictionary, Metadata, FileDescriptor
* ``table_pb2``       -- lance.table: Manifest, DataFragment, DataFile, DeletionFile,
  IndexMetadata, IndexSection, BasePath, MemWAL messages, ...
* ``transaction_pb2`` -- lance.table: Transaction and its operations
* ``rowids_pb2``      -- lance.table: RowIdSequence, U64Segment, RowDatasetVersionSequence

Nothing is imported here, so ``import lancetx.protos`` stays cheap.
"""
