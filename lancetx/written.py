"""Data files written outside lancetx for one commit, and lancetx's rule for deleting them.

A writer that cannot hold a :class:`~lancetx.Table` while it writes (a Spark executor,
a worker process) writes fragments with pylance into the table's data directory and
hands them to :func:`lancetx.commit_fragments`. Those data files are the caller's:
lancetx never deletes them. :class:`WrittenFiles` lets the caller apply the same rule
every lancetx door applies to its own files (:mod:`lancetx.commit.engine.unreferenced`):

* **delete** them only when no version can reference them: the commit was never sent
  (:meth:`WrittenFiles.delete`), it failed in a way that proves its claim did not land,
  or an earlier commit with the same idempotency key was found instead
  (:meth:`WrittenFiles.release`, :meth:`WrittenFiles.drop_unreferenced`);
* **keep** them otherwise (an unknown outcome, ``KeyboardInterrupt``, a worker killed):
  the error then names the files and what settles the outcome (the idempotency key),
  and ``lancetx-sync gc`` removes them later if no version references them.

:func:`check_schema` checks before writing that Lance can hold a schema at all.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lancetx.commit.engine.unreferenced import Claim, keep_unsettled, release
from lancetx.commit.errors import LancetxError
from lancetx.commit.storage.objectstore import ObjectStore

if TYPE_CHECKING:
    import pyarrow as pa

    from lancetx.table import Table

log = logging.getLogger(__name__)


def check_schema(schema: pa.Schema) -> None:
    """Raise SchemaConversionError (naming the column) if Lance cannot hold a column of
    ``schema``; nothing is read or written. :meth:`lancetx.Table.check_fragment_schema`
    also checks the columns against an existing table."""
    from lancetx.commit.format.schema import arrow_schema_to_fields

    arrow_schema_to_fields(schema)


@dataclass(frozen=True)
class WrittenFiles:
    """Data files written for one commit to ``table_uri``, outside lancetx.

    ``paths`` are the data files' paths as the fragments record them (relative to the
    ``data/`` directory under ``data_uri``, :attr:`lancetx.Table.data_uri`);
    ``idempotency_key`` is the commit's key, which settles whether it landed (named in
    every message that keeps the files). Plain, picklable data: build it where the
    files were written, apply the rule where the commit's outcome is known.
    """

    table_uri: str
    data_uri: str
    paths: tuple[str, ...]
    idempotency_key: str | None = None
    #: Not in the repr: it holds credentials.
    storage_options: Mapping[str, str] = field(default_factory=dict, repr=False)

    def _store(self) -> tuple[ObjectStore, str]:
        from lancetx.commit.storage.stores import open_object_store

        store, base = open_object_store(self.data_uri, dict(self.storage_options), legacy=True)
        return store, (f"{base}/data/" if base else "data/")

    def uris(self) -> list[str]:
        """The files' full URIs (as messages name them)."""
        root = self.data_uri.rstrip("/")
        return [f"{root}/data/{p}" for p in self.paths]

    def _claim(self) -> Claim:
        return Claim(table_uri=self.table_uri, idempotency_key=self.idempotency_key)

    def delete(self, paths: Sequence[str] | None = None) -> list[str]:
        """Delete the files (or only ``paths`` of them) unconditionally: for files no
        commit was ever sent for (a write task that failed, a job aborted before its
        commit). Best effort: returns the paths that could not be deleted (an orphan is
        harmless; ``lancetx-sync gc`` removes it)."""
        chosen = list(self.paths if paths is None else paths)
        if not chosen:
            return []
        store, prefix = self._store()
        left: list[str] = []
        for path in chosen:
            try:
                store.delete(prefix + path)
            except LancetxError as exc:
                log.warning("could not delete %s (%s)", store.uri(prefix + path), exc)
                left.append(path)
        return left

    def release(self, error: BaseException | None) -> bool:
        """The commit of these files failed with ``error``: delete them if ``error``
        proves its claim did not land (any LancetxError but an unknown outcome), else
        keep them, log which and why, and record them on ``error`` with what settles
        the outcome (its message, or a note on an exception that is not lancetx's).
        Returns True when the files were deleted."""
        if not self.paths:
            return True
        store, prefix = self._store()
        root = self.data_uri.rstrip("/")
        return release(
            [prefix + p for p in self.paths],
            error,
            delete=store.delete,
            describe=lambda key: f"{root}/data/{key[len(prefix) :]}",
            claim=self._claim(),
        )

    def keep_unsettled(self, reason: str) -> None:
        """Say (a log warning) that the files are kept for a commit whose outcome this
        code cannot know and which raised nothing here, e.g. a job's ``abort()`` after
        its commit failed in another process: ``reason`` says why, the message says what
        settles the outcome."""
        keep_unsettled(self.uris(), self._claim(), reason)

    def drop_unreferenced(self, table: Table, version: int) -> None:
        """The commit was found already made, as ``version`` (a re-run with the same
        idempotency key): delete the files that version does not reference (this run's
        own; none when ``version`` is this very run's lost-answer commit). If
        ``version`` cannot be read any more (a cleanup removed it), nothing is deleted:
        which files it referred to cannot be told."""
        try:
            found = table._state.parent_at(version)
        except LancetxError as exc:
            log.warning(
                "%s: idempotency key %r is committed as version %d, which cannot be read "
                "(%s); the %d data file(s) written for it this time are kept",
                self.table_uri,
                self.idempotency_key,
                version,
                exc,
                len(self.paths),
            )
            return
        referenced = {
            f.path for fragment in found.manifest.manifest.fragments for f in fragment.files
        }
        unreferenced = [p for p in self.paths if p not in referenced]
        left = self.delete(unreferenced)
        if left:
            log.warning(
                "%s: could not remove %d unreferenced data file(s)", self.table_uri, len(left)
            )


__all__ = ["WrittenFiles", "check_schema"]
