"""Lance's tag files, ``_refs/tags/{name}.json``: names, keys, contents.

A tag names one version of the table so that it stays readable by name and a
cleanup keeps it (:mod:`lancetx.commit.format.retention`). pylance 14 writes a tag
as pretty-printed JSON (two-space indent) with the fields ``branch`` (null for
the main branch), ``version``, ``createdAt`` and ``updatedAt`` (RFC 3339, UTC,
``Z``), ``manifestSize`` (bytes of the tagged version's manifest) and
``metadata`` (a string map); older files may lack the timestamps and the
metadata. :func:`encode_tag` writes exactly those fields, so pylance reads
lancetx's tags and the other way round.

Lance's rule for a tag name (:func:`tag_name_problem`): not empty; only
alphanumeric characters, ``.``, ``-`` and ``_``; no leading or trailing dot, no
``..``, not ending in ``.lock``. Python's ``str.isalnum`` stands for Rust's
``char::is_alphanumeric`` (they agree but for a few combining marks).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from lancetx.commit.errors import ObjectNotFoundError
from lancetx.commit.format import naming
from lancetx.commit.format.retention import (
    TAGS_DIR,
    tag_document,
    tag_file_name,
    tags_prefix,
)
from lancetx.commit.storage.limits import TAG, read_capped
from lancetx.commit.storage.objectstore import ObjectStore

#: Lance's name of the main branch (a tag on it has ``"branch": null`` or ``"main"``).
MAIN_BRANCH = "main"

__all__ = [
    "MAIN_BRANCH",
    "TagContents",
    "decode_tag",
    "encode_tag",
    "list_tag_contents",
    "read_tag",
    "tag_key",
    "tag_name_problem",
]


@dataclass(frozen=True)
class TagContents:
    """What one tag file holds (pylance 14's fields)."""

    version: int
    manifest_size: int
    branch: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)

    @property
    def on_main(self) -> bool:
        """Whether the tag names a version of the main branch (lancetx's only one)."""
        return self.branch is None or self.branch == MAIN_BRANCH


def tag_name_problem(name: str) -> str | None:
    """Why ``name`` is not a valid Lance tag name, or None if it is."""
    if not name:
        return "a tag name cannot be empty"
    bad = sorted({c for c in name if not (c.isalnum() or c in ".-_")})
    if bad:
        shown = ", ".join(repr(c) for c in bad)
        return f"it contains {shown}; a tag name may hold only letters, digits, '.', '-' and '_'"
    if name.startswith("."):
        return "a tag name cannot begin with a dot"
    if name.endswith("."):
        return "a tag name cannot end with a dot"
    if name.endswith(".lock"):
        return "a tag name cannot end with '.lock'"
    if ".." in name:
        return "a tag name cannot contain two consecutive dots"
    return None


def tag_key(base: str, name: str) -> str:
    """The object key of tag ``name`` of the table at ``base`` (a valid name)."""
    return naming.join(base, TAGS_DIR, f"{name}.json")


def _timestamp(value: datetime) -> str:
    # RFC 3339 in UTC with nanosecond digits and "Z", as pylance writes it.
    utc = value.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond * 1000:09d}Z"


def _parse_timestamp(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    head, dot, rest = text.partition(".")
    if dot:  # Python takes at most 6 fractional digits
        digits = "".join(c for c in rest[:9] if c.isdigit())
        text = f"{head}.{digits[:6].ljust(6, '0')}{rest[len(digits) :]}"
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def encode_tag(contents: TagContents) -> bytes:
    """The tag file's bytes, field for field as pylance 14 writes them."""
    document: dict[str, object] = {
        "branch": contents.branch,
        "version": contents.version,
    }
    if contents.created_at is not None:
        document["createdAt"] = _timestamp(contents.created_at)
    if contents.updated_at is not None:
        document["updatedAt"] = _timestamp(contents.updated_at)
    document["manifestSize"] = contents.manifest_size
    document["metadata"] = dict(contents.metadata)
    return json.dumps(document, indent=2).encode()


def decode_tag(uri: str, data: bytes) -> TagContents:
    """Parse a tag file (``uri`` names it in errors). Raises TagFileError for one
    that is not JSON naming a version."""
    document, version = tag_document(uri, data)
    size = document.get("manifestSize")
    branch = document.get("branch")
    metadata = document.get("metadata")
    return TagContents(
        version=version,
        manifest_size=size if isinstance(size, int) and not isinstance(size, bool) else 0,
        branch=branch if isinstance(branch, str) else None,
        created_at=_parse_timestamp(document.get("createdAt")),
        updated_at=_parse_timestamp(document.get("updatedAt")),
        metadata={str(k): str(v) for k, v in metadata.items()}
        if isinstance(metadata, dict)
        else {},
    )


def read_tag(store: ObjectStore, base: str, name: str) -> TagContents:
    """Tag ``name``'s contents (one GET). Raises ObjectNotFoundError when there is
    no such tag, TagFileError for an unreadable one."""
    key = tag_key(base, name)
    return decode_tag(store.uri(key), read_capped(store, key, TAG))


def list_tag_contents(store: ObjectStore, base: str) -> dict[str, TagContents]:
    """Every tag of the table at ``base``, by name (one LIST, one GET per tag).
    A tag deleted between the LIST and its GET is left out."""
    prefix = tags_prefix(base)
    found: dict[str, TagContents] = {}
    for meta in store.list(prefix):
        name = tag_file_name(prefix, meta.key)
        if name is None:
            continue
        try:
            data = read_capped(store, meta.key, TAG)
        except ObjectNotFoundError:
            continue
        found[name] = decode_tag(store.uri(meta.key), data)
    return dict(sorted(found.items()))
