"""Where the manifest of one version lives: what a listing, a commit handler or
an external manifest store hands to a reader."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

from lancetx.commit.format.naming import NamingScheme

#: The largest handover (a staged manifest, compressed) a claim carries in its
#: entry. Each KB of item is a DynamoDB write unit on the claim and again on the flip
#: (billed at the larger item), and one partition takes 1,000 units/s: 8 KiB keeps a
#: queued commit at ~18 units (~55 commits/s a table) and covers manifests of a few
#: hundred fragments; larger ones are read from the object store as before.
HANDOVER_LIMIT = 8 * 1024

#: Manifests this many times the limit are not compressed at all: no manifest packs
#: that well, and compressing a large one costs milliseconds per commit for nothing.
_HOPELESS_RATIO = 32


@dataclass(frozen=True)
class TransactionSummary:
    """What a version's transaction is, told by whoever claimed the version
    (lancetx stores it in the external store's entry, next to the manifest's path).

    Enough to judge ours against it when the conflict rules decide by the two
    operations' kinds alone (an Append against an Append), and to tell whether
    it is ours (same uuid or idempotency key) — without reading its manifest.
    ``operation`` is the spec's name (``"Append"``). ``ticket`` and
    ``claimed_at`` are not the transaction's: they place the claim in the table's
    commit queue (see :mod:`lancetx.externalstore.dynamodb.commit_queue`).
    """

    operation: str
    uuid: str
    idempotency_key: str | None = None
    #: The commit-queue ticket its writer held when it claimed the version, if it
    #: had taken one: claiming serves it (waiters watch the claims to learn whose
    #: turn it is).
    ticket: int | None = None
    #: When the claim was made (epoch seconds): waiters time turns by it, and a
    #: writer that lost the version tells contention from a stale parent by it.
    claimed_at: float | None = None


@dataclass(frozen=True)
class ManifestLocation:
    """Where the manifest of one version lives. ``size``/``etag`` are None when unknown.

    ``alternate_key`` is where the same bytes are found if ``key`` is gone: a
    staged manifest (``…manifest-{uuid}``) is deleted once it has been copied to
    its final name, so a reader that lost that race reads the final name.

    ``summary`` is the version's transaction in brief, when the store that
    located it holds one (entries claimed by lancetx do; pylance's do not).

    ``removed`` says the store that located it knows a cleanup removed this
    version's manifest on purpose (an external store's item marked so): a reader
    that does not find the manifest skips the version instead of reporting it
    missing.
    """

    version: int
    key: str
    scheme: NamingScheme
    size: int | None = None
    etag: str | None = None
    alternate_key: str | None = None
    summary: TransactionSummary | None = field(default=None, compare=False)
    removed: bool = field(default=False, compare=False)
    #: The staged manifest's bytes as its claim carried them (see :func:`pack_handover`),
    #: when the store that located it holds them: the next writer in the commit queue
    #: builds on them without reading the object.
    handover: bytes | None = field(default=None, compare=False, repr=False)

    def handed_over(self) -> bytes | None:
        """The manifest's bytes from :attr:`handover`, or None (none, or not these bytes)."""
        return unpack_handover(self.handover, self.size) if self.handover is not None else None


def pack_handover(manifest: bytes) -> bytes | None:
    """A staged manifest as a claim carries it to the writers waiting in the commit
    queue (compressed), or None when it is too large to be worth carrying."""
    if len(manifest) > _HOPELESS_RATIO * HANDOVER_LIMIT:
        return None
    packed = zlib.compress(manifest, 1)
    return packed if len(packed) <= HANDOVER_LIMIT else None


def unpack_handover(packed: bytes, size: int | None) -> bytes | None:
    """The manifest :func:`pack_handover` packed, or None when ``packed`` is not a
    manifest of ``size`` bytes (anything else, however it came, is ignored: the
    reader then reads the object, which the claim vouches for)."""
    if size is None or size <= 0 or len(packed) > HANDOVER_LIMIT:
        # No claim carries more: a larger attribute is another tool's (or a hostile
        # item's, up to DynamoDB's 400 KB), never inflated (deflate expands ~1000x).
        return None
    try:
        unpacker = zlib.decompressobj()
        data = unpacker.decompress(packed, size + 1)
    except zlib.error:
        return None
    return data if len(data) == size and unpacker.eof else None
