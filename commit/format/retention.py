"""Which versions a cleanup removed, told apart from versions that are missing.

A cleanup (pylance's ``cleanup_old_versions`` or ``lancetx-sync cleanup``) never
removes the latest version or a tagged one (``_refs/tags/{name}.json``, whose
``version`` field names it), and removes only old versions: what it keeps besides
the latest and the tagged ones is a contiguous run of versions ending at the
latest. lancetx's cleanup keeps it that way at every moment, deleting manifests
oldest first. So a committed version whose manifest is gone is **removed** when
it lies below the table's *cleanup horizon* — the oldest untagged version that
still has a final manifest — and **missing** above it (deleted by hand, lost): a
problem to report, never to skip.

The DynamoDB items of removed versions stay for a while (a cleanup keeps them as
fences against writers holding an old parent), so every reader of history meets
them: :func:`removed_versions` is what lets it skip them.

The tag files are Lance's: JSON with (pylance 14) ``branch``, ``version``,
``createdAt``, ``updatedAt``, ``manifestSize`` and ``metadata``; only ``version``
matters here. A tag on a branch names a version of that branch; it is counted
anyway (keeping one version too many is harmless).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from lancetx.commit.errors import FormatError, LancetxError
from lancetx.commit.format import naming
from lancetx.commit.format.listing import iter_manifest_locations
from lancetx.commit.storage.limits import TAG, read_capped
from lancetx.commit.storage.objectstore import ObjectStore

log = logging.getLogger(__name__)

#: Where Lance keeps tags, relative to the table.
TAGS_DIR = "_refs/tags"

__all__ = [
    "TAGS_DIR",
    "Tag",
    "TagFileError",
    "cleanup_horizon",
    "read_tags",
    "removed_versions",
    "tag_document",
    "tag_file_name",
    "tag_file_version",
    "tags_prefix",
]


class TagFileError(FormatError):
    """A ``_refs/tags/*.json`` file that does not name a version: which version it
    keeps is unknown, so nothing that depends on it may be deleted."""

    kind = "tag file"


@dataclass(frozen=True)
class Tag:
    """One tag: its name, the version it keeps, and its object key."""

    name: str
    version: int
    key: str


def tags_prefix(base: str) -> str:
    """The listing prefix of the table's tags (ends with ``/``)."""
    return naming.join(base, TAGS_DIR) + "/"


def read_tags(store: ObjectStore, base: str) -> list[Tag]:
    """Every tag of the table at ``base`` (one LIST, one GET per tag).

    Raises TagFileError for a tag file that is not JSON naming a version, and
    ObjectTooLargeError (before reading it) for one over the tag cap."""
    prefix = tags_prefix(base)
    tags: list[Tag] = []
    for meta in store.list(prefix):
        name = tag_file_name(prefix, meta.key)
        if name is None:
            continue
        # Capped (lancetx_max_tag_bytes): a tag is a few dozen bytes of JSON.
        version = tag_file_version(store.uri(meta.key), read_capped(store, meta.key, TAG))
        tags.append(Tag(name, version, meta.key))
    return tags


def tag_file_name(prefix: str, key: str) -> str | None:
    """The tag's name of a key listed under :func:`tags_prefix` (None: not a tag file)."""
    name = key[len(prefix) :]
    if "/" in name or not name.endswith(".json"):
        return None
    return name[: -len(".json")]


def tag_file_version(uri: str, body: bytes) -> int:
    """The version a tag file's contents name (TagFileError naming ``uri`` if none)."""
    return tag_document(uri, body)[1]


def tag_document(uri: str, body: bytes) -> tuple[dict[str, Any], int]:
    """A tag file's JSON object and the version it names. Raises TagFileError
    (naming ``uri``) for one that is not a JSON object naming a version."""
    try:
        document = json.loads(body)
    except ValueError as exc:
        raise TagFileError(uri, f"not JSON ({exc})") from None
    if not isinstance(document, dict):
        raise TagFileError(uri, "not a JSON object")
    version = document.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise TagFileError(uri, f"its 'version' is {version!r}, not a version number")
    return document, version


def cleanup_horizon(finals: Iterable[int], tagged: Collection[int]) -> int | None:
    """The oldest untagged version among ``finals`` (versions with a final manifest),
    or the newest one if every one is tagged; None without any. Committed versions
    below it without a manifest were removed by a cleanup."""
    versions = sorted(set(finals))
    if not versions:
        return None
    untagged = [v for v in versions if v not in tagged]
    return untagged[0] if untagged else versions[-1]


def removed_versions(store: ObjectStore, base: str, versions: Iterable[int]) -> set[int]:
    """Of ``versions`` — committed versions whose final manifest a reader did not find —
    those a cleanup removed (see the module docstring). One LIST of ``_versions/``
    and one of the tags (plus a GET per tag).

    A tag file that cannot be read is left out with a warning: the horizon is then
    at most as high as the true one, so fewer versions count as removed and the
    reader reports the rest as missing rather than skipping them."""
    wanted = set(versions)
    if not wanted:
        return set()
    finals = {location.version for location in iter_manifest_locations(store, base)}
    try:
        tagged = {tag.version for tag in read_tags(store, base)}
    except LancetxError as exc:
        log.warning("cannot read the tags of %s (%s); counting none", store.uri(base), exc)
        tagged = set()
    horizon = cleanup_horizon(finals, tagged)
    if horizon is None:
        return set()
    return {v for v in wanted if v < horizon and v not in finals}
