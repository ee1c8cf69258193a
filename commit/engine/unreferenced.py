"""The one rule for deleting files a writer wrote, and the one place that applies it.

A commit writes objects before it claims its version: pylance's data files, our
transaction file, deletion files a rebase merged, a staged manifest. Once the claim
may have landed, a version may refer to them, and deleting one makes that version
(and every later one built on it) unreadable. So:

* **Delete** only what is *provably unreferenced*: the claim was refused (DynamoDB's
  condition failed, the service refused the request outright), was never sent (the
  commit failed while planning, checking conflicts or building), was settled as not
  landed by reading the entry back, or the commit was *deduplicated* (an earlier
  commit holds the key: the files this attempt wrote are referenced by nothing; the
  caller removes from the list whatever the version found does reference).
* **Keep** everything else: an unknown outcome (:class:`CommitStateUnknownError`),
  any other ``BaseException`` — ``KeyboardInterrupt``, ``SystemExit``,
  ``GeneratorExit``, ``asyncio.CancelledError``, a bug — raised while a claim may be
  in flight, a lost answer. Then the files are logged and recorded on the error,
  with what settles the outcome: the version, the transaction uuid, the idempotency
  key and the external store's entry ``(base_uri, version)``. Files no version
  references are collected later by ``lancetx-sync gc``.

The commit loop raises only :class:`CommitStateUnknownError` when a claim may have
landed; any other :class:`~lancetx.commit.errors.LancetxError` it raises means that
nothing it claimed landed (a handler must report every doubt as an unknown outcome,
which :mod:`lancetx.externalstore.protocol` does). That contract is what
:func:`may_delete` relies on.

Every door asks here: the commit loop (transaction and deletion files), the verbs
(:mod:`lancetx.committing`), the streaming writer, ``commit_many`` and the Spark data
source. Doors whose data files belong to the caller (``commit_fragments``,
``Table.commit``, ``commit_many``) never delete those; they say so in the same words.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field, replace

from lancetx.commit.errors import CommitStateUnknownError, LancetxError

log = logging.getLogger(__name__)

#: Files named in full in a message; the rest are counted.
SHOWN_FILES = 5

#: The attribute an interrupted exception carries (see :func:`kept_on`).
_ATTRIBUTE = "_lancetx_kept"

__all__ = [
    "SHOWN_FILES",
    "Claim",
    "Kept",
    "keep",
    "keep_unsettled",
    "kept_on",
    "may_delete",
    "note_claim",
    "release",
    "why_kept",
]


@dataclass(frozen=True)
class Claim:
    """What settles whether a commit landed: the version claimed (None when the
    commit stopped before its loop chose one), the transaction, its idempotency key,
    and the external store's entry ``(base_uri, version)`` when there is one."""

    table_uri: str | None = None
    version: int | None = None
    transaction_uuid: str | None = None
    idempotency_key: str | None = None
    #: The external store's ``base_uri`` of the table (the DynamoDB hash key).
    entry_base: str | None = None
    #: What was claimed, when it is not one version of one table (``commit_many``).
    what: str | None = None

    def merged(self, other: Claim) -> Claim:
        """This claim with the fields it lacks taken from ``other``."""
        return replace(
            self,
            table_uri=self.table_uri or other.table_uri,
            version=self.version if self.version is not None else other.version,
            transaction_uuid=self.transaction_uuid or other.transaction_uuid,
            idempotency_key=self.idempotency_key or other.idempotency_key,
            entry_base=self.entry_base or other.entry_base,
            what=self.what or other.what,
        )

    def describe(self) -> str:
        """'version 7 of 's3+ddb://…' (transaction …)', as far as it is known."""
        if self.what is not None:
            return self.what
        what = f"version {self.version}" if self.version is not None else "a new version"
        where = f" of {self.table_uri!r}" if self.table_uri else ""
        txn = f" (transaction {self.transaction_uuid})" if self.transaction_uuid else ""
        return f"{what}{where}{txn}"

    def how_to_settle(self) -> str:
        """How a user finds out whether it landed."""
        ways = []
        if self.transaction_uuid:
            ways.append(
                f"a version whose transaction_uuid is {self.transaction_uuid} in "
                "Table.history() means it landed"
            )
        if self.idempotency_key:
            ways.append(
                f"Table.find_idempotency_key({self.idempotency_key!r}) returns the version "
                "that holds the key (calling again with the same key never commits twice)"
            )
        if self.entry_base is not None and self.version is not None:
            ways.append(
                f"the external store's item (base_uri={self.entry_base!r}, "
                f"version={self.version}) is the claim itself (`lancetx-sync status` shows it)"
            )
        return "; ".join(ways) if ways else "re-open the table and look at its newest versions"


@dataclass
class Kept:
    """Files kept because the claim that would reference them may have landed."""

    claim: Claim = field(default_factory=Claim)
    files: list[str] = field(default_factory=list)
    #: Files of the caller's (never deleted by lancetx whatever happens).
    callers: int = 0

    def message(self, reason: str) -> str:
        parts = [f"{self.claim.describe()} may have landed ({reason})"]
        if self.files:
            shown = ", ".join(self.files[:SHOWN_FILES])
            more = (
                f" and {len(self.files) - SHOWN_FILES} more"
                if len(self.files) > SHOWN_FILES
                else ""
            )
            parts.append(f"kept the {len(self.files)} file(s) it wrote: {shown}{more}")
        if self.callers:
            parts.append(
                f"the {self.callers} data file(s) passed in are the caller's: lancetx deleted "
                "none of them; do not delete them before the outcome is settled"
            )
        parts.append(f"to settle it: {self.claim.how_to_settle()}")
        parts.append(
            "files no version references are removed later by `lancetx-sync gc`; never delete "
            "them by hand before the outcome is settled"
        )
        return "; ".join(parts)


def may_delete(error: BaseException | None) -> bool:
    """Whether a commit that ended with ``error`` (None: refused, never sent, settled
    as not landed, or deduplicated) provably left its claim unlanded, so the files it
    wrote that no found version references may be deleted."""
    if error is None:
        return True
    if isinstance(error, CommitStateUnknownError):
        return False
    # Any other error of ours from a commit means nothing was claimed (the commit
    # loop's contract). Anything else — a signal, a cancellation, GeneratorExit,
    # a bug — may have stopped us while a claim was in flight: nobody knows.
    return isinstance(error, LancetxError)


def note_claim(error: BaseException, claim: Claim) -> None:
    """Record on ``error`` the claim it may have interrupted (fields already known win)."""
    kept = kept_on(error)
    if kept is None:
        kept = Kept(claim)
        _attach(error, kept)
    else:
        kept.claim = kept.claim.merged(claim)


def kept_on(error: BaseException) -> Kept | None:
    """What was kept because of ``error`` (None when nothing was recorded)."""
    kept = getattr(error, _ATTRIBUTE, None)
    return kept if isinstance(kept, Kept) else None


def _attach(error: BaseException, kept: Kept) -> None:
    try:
        setattr(error, _ATTRIBUTE, kept)
    except (AttributeError, TypeError):  # an exception type with __slots__
        log.debug("cannot record kept files on %r", error)


def why_kept(error: BaseException) -> str:
    """The reason an error keeps files, in a few words."""
    if isinstance(error, CommitStateUnknownError):
        return "its outcome is unknown"
    if isinstance(error, KeyboardInterrupt):
        return "interrupted (KeyboardInterrupt) while its claim may have been in flight"
    if isinstance(error, GeneratorExit):
        return "its commit was abandoned (GeneratorExit) while its claim may have been in flight"
    return (
        f"{type(error).__name__} was raised while its claim may have been in flight"
        if not isinstance(error, LancetxError)
        else f"{type(error).__name__}"
    )


def release(
    files: Iterable[str],
    error: BaseException | None,
    *,
    delete: Callable[[str], None],
    describe: Callable[[str], str] = str,
    claim: Claim | None = None,
    callers: int = 0,
) -> bool:
    """Apply the rule to ``files`` a commit wrote (keys for ``delete``): delete them
    when :func:`may_delete` says so (best effort: an orphan is harmless, gc collects
    it), else keep them, log which and why, and record them on ``error`` with what
    settles the outcome (``CommitStateUnknownError.kept_files`` and its message; a
    note on any other exception). ``callers``: how many data files of the caller's the commit carried
    (never deleted; named in the message). Returns True when the files were deleted.
    """
    keys = sorted(set(files))
    if may_delete(error):
        for key in keys:
            try:
                delete(key)
            except LancetxError as exc:
                log.warning("could not delete unreferenced %s (%s)", describe(key), exc)
        return True
    assert error is not None
    keep(error, [describe(k) for k in keys], claim=claim, callers=callers)
    return False


def keep(
    error: BaseException,
    files: Collection[str],
    *,
    claim: Claim | None = None,
    callers: int = 0,
) -> None:
    """Record ``files`` (full URIs) as kept on ``error`` and say so once: a log warning
    now, and the error's message (or, for an exception that is not ours, a note shown
    with its traceback)."""
    kept = kept_on(error)
    if kept is None:
        kept = Kept(claim or Claim())
        _attach(error, kept)
    elif claim is not None:
        # The innermost layer (the commit loop) knows the version: what is known wins.
        kept.claim = kept.claim.merged(claim)
    added = [f for f in files if f not in kept.files]
    kept.files.extend(added)
    if not added and callers <= kept.callers:
        return  # nothing new to say (an outer layer applying the rule to the same files)
    kept.callers = max(kept.callers, callers)
    text = kept.message(why_kept(error))
    log.warning("%s", text)
    if isinstance(error, CommitStateUnknownError):
        error.kept_files = tuple(kept.files)
        error.kept_message = text
    else:
        _set_note(error, f"lancetx: {text}")


def keep_unsettled(files: Collection[str], claim: Claim, reason: str, *, callers: int = 0) -> None:
    """Say that ``files`` are kept for a commit whose outcome this code cannot know
    and that raised nothing here (e.g. Spark's ``abort()`` after ``commit()`` failed,
    in another process)."""
    if files or callers:
        log.warning("%s", Kept(claim, list(files), callers).message(reason))


def _set_note(error: BaseException, text: str) -> None:
    """One lancetx note per exception, replaced as layers add what they kept."""
    notes = getattr(error, "__notes__", None)
    if isinstance(notes, list):
        for i, note in enumerate(notes):
            if isinstance(note, str) and note.startswith("lancetx: "):
                notes[i] = text
                return
    with contextlib.suppress(AttributeError, TypeError):
        error.add_note(text)
