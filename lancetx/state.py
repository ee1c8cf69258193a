"""What a Table holds: its connection, the newest version it knows, and pylance at a version.

The newest known version (:attr:`TableState.parent`) is the one the Table opened or
last committed; verbs plan against it and the commit loop builds on it, so a writer
that commits back to back never re-reads what it just wrote. pylance datasets are
opened on the table's *data* URI (``s3://…`` for an ``s3+ddb://`` table) at an explicit
version lancetx resolved, so pylance never resolves "latest" on its own and never
talks to the version store.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lancetx.commit.engine.parents import Parent, load_parent
from lancetx.commit.errors import DatasetNotFoundError, ObjectNotFoundError, VersionNotFoundError
from lancetx.commit.format.manifest import ManifestFile, data_file_signature, serialized_for_pylance
from lancetx.commit.format.naming import DATA_DIR, join
from lancetx.externalstore.connect import TableConnection, connect
from lancetx.externalstore.errors import BadEntryError, ManifestMissingError, repair_command

# Opening a table loads neither pyarrow nor the commit engine (the front door's
# ``open`` is what every CLI call and Spark task pays): see ``tests/test_import_cost.py``.
if TYPE_CHECKING:
    import pyarrow as pa
    from lance import LanceDataset

    from lancetx.commit.engine.committer import Committed
    from lancetx.version_history import VersionInfo

log = logging.getLogger(__name__)

#: What resolving the latest version raises when its item points at a manifest that
#: is gone (wedged, deleted) or cannot be trusted (corrupt, another version's or
#: size): the newest version is broken, the versions before it are not.
BROKEN_HEAD_ERRORS: tuple[type[ManifestMissingError | BadEntryError], ...] = (
    ManifestMissingError,
    BadEntryError,
)

_reported_heads: set[tuple[str, int]] = set()
_reported_lock = threading.Lock()


def report_broken_head(uri: str, error: ManifestMissingError | BadEntryError) -> None:
    """Say once per process and broken version (a warning on this module's logger)
    that the newest version of ``uri`` cannot be read while an older one is read,
    naming the version and the command that repairs it."""
    with _reported_lock:
        if (uri, error.version) in _reported_heads:
            return
        _reported_heads.add((uri, error.version))
    log.warning(
        "the latest version (%d) of %s cannot be read (%s: %s); older versions are read as "
        "usual, and nothing can be committed until it is repaired: %s",
        error.version,
        uri,
        type(error).__name__,
        error,
        getattr(error, "repair_command", None) or repair_command(uri, error.version),
    )


#: Storage options that configure lancetx only; pylance must not see them.
_LANCETX_ONLY_PREFIXES = ("lancetx_",)


def pylance_options(options: Mapping[str, str]) -> dict[str, str]:
    """The storage options to hand pylance (lancetx's own switches removed)."""
    return {k: v for k, v in options.items() if not k.lower().startswith(_LANCETX_ONLY_PREFIXES)}


def nearest_versions(existing: list[int], version: int, around: int = 3) -> str:
    """What to tell someone asking for a version that does not exist: the versions there
    are, or the few nearest ones when they are many or not contiguous."""
    if not existing:
        return "the table has no versions"
    ordered = sorted(set(existing))
    if ordered == list(range(ordered[0], ordered[-1] + 1)) and len(ordered) <= 2 * around:
        listed = ", ".join(map(str, ordered))
        return f"the table has versions {listed}"
    below = [v for v in ordered if v < version][-around:]
    above = [v for v in ordered if v > version][:around]
    near = ", ".join(map(str, below + above))
    return f"nearest versions: {near} (oldest {ordered[0]}, latest {ordered[-1]})"


@dataclass
class TableState:
    """A table's connection and the newest version this process knows."""

    conn: TableConnection
    parent: Parent | None = None
    _datasets: dict[int, LanceDataset] = field(default_factory=dict, repr=False)
    #: Schema signature (fields, schema metadata, data format) of each cached dataset.
    _signatures: dict[int, bytes] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: Versions already read for history (a committed version never changes), so
    #: history only reads versions it has not seen.
    _infos: dict[int, VersionInfo] = field(default_factory=dict, repr=False)
    #: The newest version, when it could not be read the last time it was resolved
    #: (see :meth:`refresh_to_read_older`); the versions before it are readable.
    broken_head: int | None = None

    @classmethod
    def connect(cls, uri: str, storage_options: Mapping[str, str] | None) -> TableState:
        return cls(connect(uri, storage_options))

    @property
    def uri(self) -> str:
        return self.conn.uri

    @property
    def data_dir_key(self) -> str:
        """Object key of the table's ``data/`` directory (with a trailing slash)."""
        return join(self.conn.base, DATA_DIR) + "/"

    def refresh(self) -> Parent | None:
        """Resolve the latest version: one round trip to the version store, and one GET
        of its manifest unless it is the version already held."""
        latest = load_parent(self.conn.handler, self.conn.base, held=self.parent)
        self.remember(latest)
        self.broken_head = None
        return latest

    def refresh_to_read_older(self) -> bool:
        """Resolve the latest version before reading an older one: whether the table
        has any version. A latest version that cannot be read (wedged, its manifest
        missing or corrupt) does not stop the read: it is reported once
        (:func:`report_broken_head`) and remembered in :attr:`broken_head`."""
        try:
            return self.refresh() is not None
        except BROKEN_HEAD_ERRORS as exc:
            report_broken_head(self.uri, exc)
            self.broken_head = exc.version
            return True

    def remember(self, parent: Parent | Committed | None) -> None:
        """Record a version as the newest known (ignoring an older one)."""
        if parent is None:
            return
        if not isinstance(parent, Parent):  # a Committed: what a parent needs of it
            parent = Parent(parent.location, parent.manifest)
        with self._lock:
            if self.parent is None or parent.version >= self.parent.version:
                self.parent = parent

    def history(self, until: int | None = None) -> list[VersionInfo]:
        """Every version up to ``until`` (default: latest), oldest first. A committed
        version never changes, so each is read once per process (in parallel)."""
        from lancetx.version_history import load_versions

        handler, base = self.conn.handler, self.conn.base
        locations = handler.list_versions(base, 0)
        if until is not None:
            locations = [loc for loc in locations if loc.version <= until]
        with self._lock:
            missing = [loc for loc in locations if loc.version not in self._infos]
        loaded = load_versions(handler, base, missing, known=locations)
        with self._lock:
            self._infos.update((info.version, info) for info in loaded)
            # Versions a cleanup removed were left out by load_versions.
            return [self._infos[loc.version] for loc in locations if loc.version in self._infos]

    def walk_history(self, *, since: int = 0, until: int | None = None) -> Iterator[VersionInfo]:
        """Versions ``since+1 .. until`` (default: latest listed), newest first, read in
        parallel batches as the caller goes on (stop early, and older versions are never
        read); each version is read at most once per process."""
        from lancetx.version_history import HISTORY_PARALLELISM, load_versions

        handler, base = self.conn.handler, self.conn.base
        # From ``since`` itself: what the oldest one changed is measured against it.
        listed = handler.list_versions(base, max(since - 1, 0))
        locations = [
            loc for loc in listed if loc.version > since and (until is None or loc.version <= until)
        ]
        locations.sort(key=lambda loc: loc.version, reverse=True)
        for start in range(0, len(locations), HISTORY_PARALLELISM):
            batch = locations[start : start + HISTORY_PARALLELISM]
            with self._lock:
                missing = [loc for loc in batch if loc.version not in self._infos]
            loaded = load_versions(handler, base, missing, known=listed)
            with self._lock:
                self._infos.update((info.version, info) for info in loaded)
                found = [self._infos[loc.version] for loc in batch if loc.version in self._infos]
            yield from found

    def find_idempotency_key(self, key: str, *, since: int = 0) -> int | None:
        """The version committed with idempotency ``key``, or None: its key item
        (``s3+ddb://`` tables; however old the version, cleaned up or not), else the
        history after ``since``, every version of it, each read at most once per
        process (see :mod:`lancetx.keys`)."""
        from lancetx.keys import find_committed_key

        return find_committed_key(self.conn.handler, self.conn.base, key, since=since)

    def require_parent(self) -> Parent:
        parent = self.parent if self.parent is not None else self.refresh()
        if parent is None:
            raise DatasetNotFoundError(self.uri)
        return parent

    def parent_at(self, version: int) -> Parent:
        """The manifest of ``version`` (the cached one when it is the newest known)."""
        if self.parent is not None and self.parent.version == version:
            return self.parent
        try:
            found = load_parent(self.conn.handler, self.conn.base, version)
        except VersionNotFoundError:
            raise VersionNotFoundError(self.uri, version, self._nearest(version)) from None
        except ObjectNotFoundError:
            # The handler says "not found" only for a manifest known to be gone (a
            # cleanup removed it; a missing one it reports as such).
            raise VersionNotFoundError(
                self.uri, version, f"a cleanup removed it; {self._nearest(version)}"
            ) from None
        assert found is not None
        return found

    def read_failure(self, version: int, exc: Exception, *, advice: str) -> Exception:
        """What reading ``version`` through pylance failed with: ``exc``, or
        VersionNotFoundError naming ``version`` and saying ``advice`` when a cleanup
        removed it after this Table learned it (pylance's own error names only a
        manifest or data file not found). A version is never swapped for another
        here: a read-only view is pinned, and a Table reads the version it knows
        until it is refreshed."""
        from lancetx.commit.errors import LancetxError
        from lancetx.errors import (  # not at import: opening a table stays light
            pylance_gist,
            says_not_found,
        )

        # Only a "not found" can be a removed version's: any other failure (a bad
        # filter, a denied or throttled GET) is not looked into, at no request's cost.
        if (
            isinstance(exc, LancetxError)
            or not says_not_found(exc)
            or not self.version_gone(version)
        ):
            return exc
        return VersionNotFoundError(
            self.uri,
            version,
            f"a cleanup removed it after this Table loaded it (pylance: {pylance_gist(exc)}); "
            f"{advice}, or keep versions longer than your reads and writes take (cleanup's "
            f"older-than); {self._nearest(version)}",
        )

    def version_gone(self, version: int) -> bool:
        """Whether ``version`` is gone now (a cleanup removed it; never committed),
        asked afresh: a manifest in hand says nothing of the store. False when that
        cannot be told."""
        from lancetx.commit.errors import LancetxError

        try:
            load_parent(self.conn.handler, self.conn.base, version)
        except (VersionNotFoundError, ObjectNotFoundError):
            return True
        except LancetxError:
            return False
        return False

    def _nearest(self, version: int) -> str:
        locations = self.conn.handler.list_versions(self.conn.base, 0)
        return nearest_versions([loc.version for loc in locations if not loc.removed], version)

    def dataset(self, version: int, manifest: ManifestFile | None = None) -> LanceDataset:
        """pylance's dataset at ``version`` (opened once per version, sharing one session).

        The manifest of ``version`` if the caller holds it (or it is the newest known
        version's) is handed to pylance, which then does not GET it again."""
        with self._lock:
            cached = self._datasets.get(version)
            any_open = next(iter(self._datasets.values()), None)
            if manifest is None and self.parent is not None and self.parent.version == version:
                manifest = self.parent.manifest
        if cached is not None:
            return cached
        import lance

        if manifest is not None:
            ds = lance.LanceDataset(
                self.conn.data_uri,
                version=version,
                storage_options=self.pylance_storage_options(),
                serialized_manifest=serialized_for_pylance(manifest),
                session=any_open.session() if any_open is not None else None,
            )
        elif any_open is not None:
            ds = any_open.checkout_version(version)
        else:
            ds = lance.dataset(
                self.conn.data_uri,
                version=version,
                storage_options=self.pylance_storage_options(),
            )
        with self._lock:
            if len(self._datasets) >= 8:  # a writer moves forward; keep the newest few
                oldest = min(self._datasets)
                self._datasets.pop(oldest)
                self._signatures.pop(oldest, None)
            self._datasets[version] = ds
        return ds

    def dataset_to_write(self, parent: Parent) -> LanceDataset:
        """A pylance dataset to write new data files for ``parent``: any one already
        open whose schema and data format are ``parent``'s (data files do not depend on
        anything else), so back-to-back appends do not re-open each new version; else
        ``parent``'s, opened from the manifest in hand (no LIST, no manifest GET)."""
        wanted = data_file_signature(parent.manifest.manifest)
        with self._lock:
            for version, signature in sorted(self._signatures.items(), reverse=True):
                if signature == wanted and version in self._datasets:
                    return self._datasets[version]
        ds = self.dataset(parent.version, parent.manifest)
        with self._lock:
            self._signatures[parent.version] = wanted
        return ds

    def schema_of(self, parent: Parent) -> pa.Schema:
        """The Arrow schema of a version, from its manifest (no pylance, no read)."""
        from lancetx.commit.format.schema import fields_to_arrow_schema

        m = parent.manifest.manifest
        return fields_to_arrow_schema(list(m.fields), dict(m.schema_metadata))

    def pylance_storage_options(self) -> dict[str, str] | None:
        return pylance_options(self.conn.storage_options) or None


__all__ = [
    "BROKEN_HEAD_ERRORS",
    "TableState",
    "nearest_versions",
    "pylance_options",
    "report_broken_head",
]
