"""Who wrote a manifest: the ``writer_version`` lancetx records.

Lance stamps every manifest with ``WriterVersion{library, version, prerelease,
build_metadata}`` (``rust/lance-table/src/format/manifest.rs``): ``version`` is a
plain ``major.minor.patch`` so old readers can parse it, and the pre-release and
build parts go to their own fields. Readers use it to work around bugs of
particular Lance releases, and only when ``library == "lance"``
(``WriterVersion::lance_lib_version`` returns None otherwise;
``must_recalculate_fragment_bitmap`` in ``rust/lance/src/io/commit.rs``: "We
assume a different library is not affected by the bug"). So lancetx names itself
honestly: ``library="lancetx"`` and the installed package's version.
"""

from __future__ import annotations

import re

from lancetx.commit.package_version import NOT_INSTALLED, installed_version
from lancetx.protos import table_pb2

#: The ``library`` lancetx writes into ``Manifest.writer_version``.
LIBRARY_NAME = "lancetx"

_VERSION_RE = re.compile(r"^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:\.\d+)*(.*)$")


def library_version() -> str:
    """The installed lancetx distribution's version (``0.0.0`` when not installed)."""
    found = installed_version()
    return "0.0.0" if found == NOT_INSTALLED else found


def split_version(full: str) -> tuple[str, str | None, str | None]:
    """``(major.minor.patch, prerelease, build_metadata)`` of a PEP 440 or semver string.

    ``0.1.0`` → ``("0.1.0", None, None)``; ``1.2.0rc1+g1234`` →
    ``("1.2.0", "rc1", "g1234")``; ``2.0.0-beta.1`` → ``("2.0.0", "beta.1", None)``.
    Missing minor/patch parts are 0. An unparsable string gives ``("0.0.0", full, None)``
    so the plain part always parses as semver.
    """
    core, _, build = full.strip().partition("+")
    match = _VERSION_RE.match(core)
    if match is None:
        return "0.0.0", full or None, None
    major, minor, patch, rest = match.groups()
    plain = f"{int(major)}.{int(minor or 0)}.{int(patch or 0)}"
    prerelease = rest.lstrip(".-_") or None
    return plain, prerelease, build or None


def writer_version() -> table_pb2.Manifest.WriterVersion:
    """The ``WriterVersion`` message for manifests lancetx builds."""
    plain, prerelease, build = split_version(library_version())
    out = table_pb2.Manifest.WriterVersion(library=LIBRARY_NAME, version=plain)
    if prerelease is not None:
        out.prerelease = prerelease
    if build is not None:
        out.build_metadata = build
    return out


__all__ = ["LIBRARY_NAME", "library_version", "split_version", "writer_version"]
