"""Tags: names for versions, stored as Lance stores them (``Table.tags``).

A tag is the file ``_refs/tags/{name}.json`` of the table, in pylance 14's format
(:mod:`lancetx.commit.format.tags`): pylance sees the tags lancetx creates, and
lancetx sees pylance's. A tagged version stays readable by name
(``table.checkout("v1")``, ``lancetx.open(uri, version="v1")``) and every cleanup
— lancetx's and pylance's — keeps it and everything it references.

Tags are not commits: creating, moving or deleting one writes only its file, and
is allowed on a read-only :meth:`~lancetx.Table.checkout` view too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from lancetx.arguments import checked_methods
from lancetx.commit.errors import ObjectExistsError, ObjectNotFoundError, VersionNotFoundError
from lancetx.commit.format.retention import removed_versions
from lancetx.commit.format.tags import (
    TagContents,
    decode_tag,
    encode_tag,
    list_tag_contents,
    read_tag,
    tag_key,
    tag_name_problem,
)
from lancetx.commit.storage.objectstore import ObjectMeta, ObjectStore
from lancetx.errors import (
    InvalidTagNameError,
    TagExistsError,
    TagNotFoundError,
    TagOnBranchError,
    TagTargetRemovedError,
)
from lancetx.state import TableState, nearest_versions

__all__ = ["AsyncTags", "TagInfo", "Tags"]


@dataclass(frozen=True)
class TagInfo:
    """One tag: its name, the version it names, and what its file records.

    ``branch`` is None for the main branch (the only one lancetx writes);
    ``manifest_size`` is the size in bytes of that version's manifest."""

    name: str
    version: int
    branch: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    manifest_size: int = 0
    metadata: Mapping[str, str] = field(default_factory=dict)


def _info(name: str, contents: TagContents) -> TagInfo:
    return TagInfo(
        name=name,
        version=contents.version,
        branch=contents.branch,
        created_at=contents.created_at,
        updated_at=contents.updated_at,
        manifest_size=contents.manifest_size,
        metadata=dict(contents.metadata),
    )


@checked_methods
class Tags:
    """The tags of one table: ``table.tags.create("v1", 3)``, ``.update``, ``.delete``,
    ``.list()``, ``.get``. ``version`` arguments take a version number or the name
    of another tag (as pylance's do)."""

    def __init__(self, state: TableState) -> None:
        self._state = state

    @property
    def _store(self) -> ObjectStore:
        return self._state.conn.handler.store

    @property
    def _base(self) -> str:
        return self._state.conn.base

    @property
    def _uri(self) -> str:
        return self._state.uri

    # ------------------------------------------------------------------ reads

    def list(self) -> dict[str, TagInfo]:
        """Every tag, by name (sorted). One LIST and one GET per tag."""
        contents = list_tag_contents(self._store, self._base)
        return {name: _info(name, c) for name, c in contents.items()}

    def get(self, name: str) -> TagInfo:
        """Tag ``name``. Raises TagNotFoundError (listing the tags there are) or
        InvalidTagNameError."""
        self._check_name(name)
        try:
            return _info(name, read_tag(self._store, self._base, name))
        except ObjectNotFoundError:
            raise self._not_found(name) from None

    def get_version(self, name: str) -> int:
        """The version tag ``name`` names (see :meth:`get`)."""
        return self.get(name).version

    def resolve(self, name: str) -> int:
        """The version of the main branch tag ``name`` names, to read it: as
        :meth:`get_version`, and TagOnBranchError for a tag pylance wrote on
        another branch."""
        info = self.get(name)
        if info.branch is not None and info.branch != "main":
            raise TagOnBranchError(self._uri, name, info.branch, info.version)
        return info.version

    # ----------------------------------------------------------------- writes

    def create(self, name: str, version: int | str) -> TagInfo:
        """Tag ``version`` (a number, or another tag's name) as ``name``.

        Raises InvalidTagNameError (Lance's rules), TagExistsError,
        VersionNotFoundError (a version that never existed, or that a cleanup
        removed), TagNotFoundError (``version`` names an unknown tag).

        Race with a cleanup: the version is checked before the tag is written and
        again right after. If a cleanup removed it in between, the tag just
        written is deleted again and TagTargetRemovedError is raised, so no tag
        ever names a removed version unnoticed. (lancetx's cleanup also reads the
        tags again after removing manifests and puts back any version tagged
        meanwhile.)

        On a store without conditional PUT (a legacy S3 bucket) "already exists"
        is checked by reading: two ``create`` calls of one name at the very same
        moment may both pass that check; the tag file then holds the later one,
        and the earlier caller gets TagExistsError when its read-back shows it.
        """
        self._check_name(name)
        number = self._version_number(version)
        meta = self._manifest_of(number)
        now = datetime.now(UTC)
        data = encode_tag(TagContents(number, meta.size, None, now, now))
        key = tag_key(self._base, name)
        if self._store.capabilities.conditional_put:
            try:
                self._store.put_if_not_exists(key, data)
            except ObjectExistsError:
                raise TagExistsError(self._uri, name, self._version_or_none(name)) from None
        else:
            if self._exists(key):
                raise TagExistsError(self._uri, name, self._version_or_none(name))
            self._store.put(key, data)
            if self._read_or_none(key) != data:  # another creator's write came after ours
                raise TagExistsError(self._uri, name, self._version_or_none(name))
        self._confirm(name, key, data, number, previous=None)
        return self.get(name)

    def update(self, name: str, version: int | str) -> TagInfo:
        """Move tag ``name`` to ``version`` (a number or another tag's name),
        keeping its creation time and metadata. Raises TagNotFoundError for an
        unknown tag, and what :meth:`create` raises about the version (with the
        same race check: if a cleanup removes the new version meanwhile, the tag
        is put back as it was)."""
        self._check_name(name)
        key = tag_key(self._base, name)
        previous = self._read_or_none(key)
        if previous is None:
            raise self._not_found(name)
        old = decode_tag(self._store.uri(key), previous)
        number = self._version_number(version)
        meta = self._manifest_of(number)
        data = encode_tag(
            TagContents(
                number,
                meta.size,
                old.branch,
                old.created_at,
                datetime.now(UTC),
                old.metadata,
            )
        )
        self._store.put(key, data)
        self._confirm(name, key, data, number, previous=previous)
        return self.get(name)

    def delete(self, name: str) -> None:
        """Delete tag ``name`` (its version may then be removed by a cleanup).
        Raises TagNotFoundError for an unknown tag."""
        self._check_name(name)
        key = tag_key(self._base, name)
        if not self._exists(key):
            raise self._not_found(name)
        self._store.delete(key)

    # ---------------------------------------------------------------- helpers

    def _check_name(self, name: str) -> None:
        problem = tag_name_problem(name)
        if problem is not None:
            raise InvalidTagNameError(self._uri, name, problem)

    def _not_found(self, name: str) -> TagNotFoundError:
        existing = {n: c.version for n, c in list_tag_contents(self._store, self._base).items()}
        return TagNotFoundError(self._uri, name, existing)

    def _version_number(self, version: int | str) -> int:
        if isinstance(version, str):
            return self.resolve(version)
        return version

    def _exists(self, key: str) -> bool:
        try:
            self._store.head(key)
        except ObjectNotFoundError:
            return False
        return True

    def _read_or_none(self, key: str) -> bytes | None:
        try:
            return self._store.get(key)
        except ObjectNotFoundError:
            return None

    def _version_or_none(self, name: str) -> int | None:
        try:
            return read_tag(self._store, self._base, name).version
        except ObjectNotFoundError:
            return None

    def _manifest_of(self, version: int) -> ObjectMeta:
        """The final manifest of ``version``; VersionNotFoundError saying whether it
        never existed, a cleanup removed it, or its manifest is missing."""
        handler, base = self._state.conn.handler, self._base
        removed = "a cleanup removed it; tag a version that still exists (Table.history())"
        try:
            location = handler.resolve_version(base, version)
        except (VersionNotFoundError, ObjectNotFoundError):
            # Without an item (a table not on DynamoDB, or its items deleted too):
            # a version below the oldest one left was removed by a cleanup.
            if version >= 1 and version in removed_versions(self._store, base, [version]):
                raise VersionNotFoundError(self._uri, version, removed) from None
            existing = [loc.version for loc in handler.list_versions(base, 0)]
            raise VersionNotFoundError(
                self._uri, version, nearest_versions(existing, version)
            ) from None
        for key in (location.key, location.alternate_key):
            if key is None:
                continue
            try:
                return self._store.head(key)
            except ObjectNotFoundError:
                continue
        if location.removed or version in removed_versions(self._store, base, [version]):
            detail = removed
        else:
            detail = (
                f"it was committed but its manifest {self._store.uri(location.key)} is "
                "missing; run lancetx-sync verify"
            )
        raise VersionNotFoundError(self._uri, version, detail)

    def _confirm(
        self, name: str, key: str, data: bytes, version: int, *, previous: bytes | None
    ) -> None:
        """After writing tag ``name``: make sure its version was not removed meanwhile
        (see :meth:`create`); if it was, withdraw the write — only while the tag
        file still holds our bytes — and raise TagTargetRemovedError."""
        try:
            self._manifest_of(version)
        except VersionNotFoundError:
            if self._read_or_none(key) == data:
                if previous is None:
                    self._store.delete(key)
                else:
                    self._store.put(key, previous)
            raise TagTargetRemovedError(self._uri, name, version) from None


@checked_methods
class AsyncTags:
    """:class:`Tags` for asyncio (``await table.tags.create("v1", 3)``): the same
    calls, run on a worker thread."""

    def __init__(self, tags: Tags) -> None:
        self._tags = tags

    async def list(self) -> dict[str, TagInfo]:
        """See :meth:`Tags.list`."""
        return await asyncio.to_thread(self._tags.list)

    async def get(self, name: str) -> TagInfo:
        """See :meth:`Tags.get`."""
        return await asyncio.to_thread(self._tags.get, name)

    async def get_version(self, name: str) -> int:
        """See :meth:`Tags.get_version`."""
        return await asyncio.to_thread(self._tags.get_version, name)

    async def create(self, name: str, version: int | str) -> TagInfo:
        """See :meth:`Tags.create`."""
        return await asyncio.to_thread(self._tags.create, name, version)

    async def update(self, name: str, version: int | str) -> TagInfo:
        """See :meth:`Tags.update`."""
        return await asyncio.to_thread(self._tags.update, name, version)

    async def delete(self, name: str) -> None:
        """See :meth:`Tags.delete`."""
        await asyncio.to_thread(self._tags.delete, name)
