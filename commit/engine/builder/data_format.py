"""The data storage version: inferred from the data files, checked against the
table's and the writer's, replaced on Overwrite."""

from __future__ import annotations

from collections.abc import Iterable

from lancetx.commit.engine.builder.common import (
    DEFAULT_DATA_STORAGE_VERSION,
    LANCE_FILE_FORMAT,
    VERSION_ORDER,
    file_version,
    normalize_storage_version,
)
from lancetx.commit.engine.builder.state import BuildState
from lancetx.protos import table_pb2

DataFragment = table_pb2.DataFragment


def apply_data_format(state: BuildState) -> None:
    manifest = state.manifest
    requested: str | None = None
    if state.requested_storage_version is not None:
        requested = normalize_storage_version(state.requested_storage_version)
        if requested is None:
            raise state.fail(f"Unknown Lance storage version: {state.requested_storage_version}")

    inferred = infer_file_version(state, manifest.fragments)
    if state.previous is None:
        # data_storage_format_from_files
        if inferred is not None:
            if requested is not None and requested != inferred:
                raise state.fail(
                    f"User requested data storage version ({requested}) does not match "
                    f"version in data files ({inferred})"
                )
            version = inferred
        else:
            version = requested or DEFAULT_DATA_STORAGE_VERSION
        manifest.data_format.file_format = LANCE_FILE_FORMAT
        manifest.data_format.version = version
    elif state.op_key == "overwrite" and requested is not None:
        manifest.data_format.file_format = LANCE_FILE_FORMAT
        manifest.data_format.version = requested

    # check_storage_version (commit_transaction)
    current = normalize_storage_version(manifest.data_format.version)
    if current is None:
        raise state.unsupported(f"data storage version {manifest.data_format.version!r}")
    if inferred is None:
        return
    if current == "0.1":
        if VERSION_ORDER[inferred] > VERSION_ORDER[current]:
            manifest.data_format.version = inferred
    elif inferred != current:
        hint = (
            " (pass data_storage_version to replace the table's format with an Overwrite)"
            if state.op_key == "overwrite"
            else ""
        )
        raise state.fail(
            f"The operation added files with version {inferred}. However, the data storage "
            f"version is {current}{hint}"
        )


def infer_file_version(state: BuildState, fragments: Iterable[DataFragment]) -> str | None:
    found: str | None = None
    for frag in fragments:
        for df in frag.files:
            version = file_version(df)
            if version is None:
                raise state.fail(
                    f"data file {df.path} of fragment {frag.id} has unknown Lance storage "
                    f"version {df.file_major_version}.{df.file_minor_version}",
                    [frag.id],
                )
            if found is None:
                found = version
            elif version != found:
                raise state.fail(
                    f"All data files must have the same version.  Detected both {found} and {version}",
                    [frag.id],
                )
    return found
