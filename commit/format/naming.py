"""Where Lance keeps things inside a table directory, and how manifests are named.

Two manifest naming schemes share ``_versions/``:

* V1: ``{version}.manifest`` (``3.manifest``)
* V2: ``{u64::MAX - version:020}.manifest`` (``18446744073709551612.manifest``),
  so a lexical listing returns the newest version first.

A *staged* manifest (the external-store protocol's step 1) is the final name
followed by ``-{uuid4}``. Anything else in ``_versions/`` (for example pylance's
``latest_version_hint.json``) is not a manifest and is ignored.
"""

from __future__ import annotations

import enum
import re
import urllib.parse
import uuid as uuidlib
from dataclasses import dataclass

U64_MAX = 2**64 - 1
VERSIONS_DIR = "_versions"
TRANSACTIONS_DIR = "_transactions"
DELETIONS_DIR = "_deletions"
DATA_DIR = "data"
INDICES_DIR = "_indices"
MANIFEST_SUFFIX = ".manifest"

_V2_NAME_LEN = 20 + len(MANIFEST_SUFFIX)
_UUID_RE = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_STAGED_RE = re.compile(rf"^(?P<final>[0-9]+\.manifest)-(?P<uuid>{_UUID_RE})$")


class NamingScheme(enum.Enum):
    """How manifest file names encode the version."""

    V1 = "v1"
    V2 = "v2"

    def file_name(self, version: int) -> str:
        """The final manifest file name of ``version`` under this scheme."""
        if not 0 <= version <= U64_MAX:
            raise ValueError(f"version {version} is outside 0..2**64-1")
        if self is NamingScheme.V1:
            return f"{version}{MANIFEST_SUFFIX}"
        return f"{U64_MAX - version:020d}{MANIFEST_SUFFIX}"

    def parse_version(self, file_name: str) -> int:
        """The version encoded in a final manifest file name of this scheme."""
        stem = file_name[: -len(MANIFEST_SUFFIX)]
        number = int(stem)
        return number if self is NamingScheme.V1 else U64_MAX - number


def detect_scheme(file_name: str) -> NamingScheme | None:
    """The scheme of a final manifest file name, or None if it is not one.

    Mirrors Lance: a name ending in ``.manifest`` whose stem is 20 digits is V2,
    any other all-digit stem is V1. Staged names (``…manifest-{uuid}``) and
    other files return None.
    """
    if not file_name.endswith(MANIFEST_SUFFIX):
        return None
    stem = file_name[: -len(MANIFEST_SUFFIX)]
    if not stem.isdigit() or not stem.isascii():
        return None
    return NamingScheme.V2 if len(file_name) == _V2_NAME_LEN else NamingScheme.V1


def parse_manifest_name(file_name: str) -> tuple[int, NamingScheme] | None:
    """``(version, scheme)`` of a final manifest file name, or None."""
    scheme = detect_scheme(file_name)
    if scheme is None:
        return None
    return scheme.parse_version(file_name), scheme


@dataclass(frozen=True)
class StagedName:
    """A parsed staged manifest name: ``{final}-{uuid}``."""

    final_name: str
    version: int
    scheme: NamingScheme
    uuid: str


def parse_staged_name(file_name: str) -> StagedName | None:
    """Parse ``{final manifest name}-{uuid}``; None if ``file_name`` is not staged."""
    match = _STAGED_RE.match(file_name)
    if match is None:
        return None
    parsed = parse_manifest_name(match.group("final"))
    if parsed is None:
        return None
    version, scheme = parsed
    return StagedName(match.group("final"), version, scheme, match.group("uuid"))


def join(base: str, *parts: str) -> str:
    """Join key segments with ``/``; ``base`` may be empty (a table at the bucket root)."""
    segments = [base.rstrip("/")] if base else []
    segments.extend(p.strip("/") for p in parts)
    return "/".join(s for s in segments if s)


def manifest_key(base: str, version: int, scheme: NamingScheme) -> str:
    """Object key of the final manifest of ``version``."""
    return join(base, VERSIONS_DIR, scheme.file_name(version))


def staged_manifest_key(
    base: str, version: int, scheme: NamingScheme, uuid: str | None = None
) -> str:
    """Object key of a staged manifest: the final key plus ``-{uuid4}``."""
    token = uuid if uuid is not None else str(uuidlib.uuid4())
    return f"{manifest_key(base, version, scheme)}-{token}"


def transaction_file_name(read_version: int, uuid: str) -> str:
    """``{read_version}-{uuid}.txn``: what a manifest's ``transaction_file`` field holds."""
    return f"{read_version}-{uuid}.txn"


def transaction_key(base: str, file_name: str) -> str:
    """Object key of a transaction file named in a manifest."""
    return join(base, TRANSACTIONS_DIR, file_name)


def deletion_file_key(
    base: str, fragment_id: int, read_version: int, file_id: int, bitmap: bool
) -> str:
    """Object key of a deletion file: ``_deletions/{fragment}-{read_version}-{id}.arrow|.bin``."""
    ext = "bin" if bitmap else "arrow"
    return join(base, DELETIONS_DIR, f"{fragment_id}-{read_version}-{file_id}.{ext}")


def unsafe_relative_path(path: str) -> str | None:
    """Why ``path`` — a file name a manifest or transaction gives relative to a folder
    of the table (a data file's, relative to ``data/``) — could name an object
    outside that folder, or None when it cannot.

    Refused: an empty path, an absolute one, a URI, a backslash or NUL, and an
    empty, ``.`` or ``..`` segment (also percent-encoded: a store that decodes or
    normalizes keys would turn ``a/%2e%2e/b`` into a walk up the tree).
    """
    if not path:
        return "it is empty"
    if path.startswith("/"):
        return "it is absolute"
    if "://" in path or ":" in path.split("/", 1)[0]:
        return "it is a URI"
    if "\\" in path or "\x00" in path:
        return "it holds a backslash or NUL"
    for segment in path.split("/"):
        decoded = urllib.parse.unquote(segment)
        if decoded in ("", ".", "..") or "/" in decoded or "\\" in decoded:
            return f"it has a segment {segment!r}"
    return None


def unsafe_transaction_file_name(name: str) -> str | None:
    """Why ``name`` (a manifest's ``transaction_file``) is not a file name inside
    ``_transactions/``, or None when it is one."""
    problem = unsafe_relative_path(name)
    if problem is not None:
        return problem
    if "/" in name:
        return "it names a subfolder"
    return None
