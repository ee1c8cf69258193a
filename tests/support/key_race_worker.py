"""A spawned process that commits with idempotency keys in lock-step with another one.

Each round both processes prepare their data (``commit_fragments``: the fragments are
written first, as a Spark task writes them; ``append``: the table is held open), meet
at a barrier and commit with the round's key at the same moment. Each returns, per
round, the version it was given and whether it was told ``deduplicated``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lance

import lancetx

#: How long a process waits for the other at a round's barrier (a dead partner
#: fails the test instead of hanging it).
BARRIER_TIMEOUT = 120.0


def race_rounds(
    uri: str,
    options: Mapping[str, str],
    data_uri: str,
    door: str,
    keys: list[str],
    name: str,
    barrier: Any,
    first_seq: int = 0,
) -> list[tuple[int, bool]]:
    """Commit one small batch per key through ``door`` (``commit_fragments`` or
    ``append``), each after meeting the other process at ``barrier``. The batch of
    ``keys[i]`` is tagged ``(name, first_seq + i)``."""
    from protocol_helpers import batch

    results: list[tuple[int, bool]] = []
    table = lancetx.open(uri, storage_options=dict(options)) if door == "append" else None
    for seq, key in enumerate(keys):
        data = batch(name, first_seq + seq, 3)
        if door == "commit_fragments":
            fragments = lance.fragment.write_fragments(
                data, data_uri, storage_options=dict(options)
            )
            barrier.wait(BARRIER_TIMEOUT)
            result = lancetx.commit_fragments(
                uri,
                fragments,
                schema=data.schema,
                storage_options=options,
                idempotency_key=key,
            )
            results.append((result.version, result.deduplicated))
        else:
            assert table is not None
            barrier.wait(BARRIER_TIMEOUT)
            table.append(data, idempotency_key=key)
            assert table.last_commit is not None
            results.append((table.last_commit.version, table.last_commit.deduplicated))
    return results
