"""The installed lancetx distribution's version, looked up once per process.

The package's ``__version__``, the manifests' ``writer_version`` and the AWS clients'
User-Agent all read it from here, so opening an ``s3+ddb://`` or ``s3://`` table asks
for it. ``importlib.metadata`` would find it, but importing it loads ``email``,
``zipfile``, ``csv`` and more (about as much CPU as the rest of the lookup), and a
lookup scans every entry of ``sys.path`` (~0.7 ms). So the distribution's
``.dist-info`` directory is looked for directly, in ``sys.path`` order as
``importlib.metadata`` does, and its ``METADATA`` read; anything unusual (a zipped
path entry, no such directory, a file without a version) is left to
``importlib.metadata`` (``tests/test_import_cost.py`` checks both agree).
"""

from __future__ import annotations

import os
import sys
from functools import lru_cache

#: What :func:`installed_version` says when lancetx runs from a source tree that was
#: never installed.
NOT_INSTALLED = "0.0.0+unknown"

#: The distribution's name as its ``.dist-info`` directory spells it (lower case).
_DIST_PREFIX = "lancetx-"


@lru_cache(maxsize=1)
def installed_version() -> str:
    """The installed distribution's version, or :data:`NOT_INSTALLED`."""
    found = _version_from_dist_info()
    if found is not None:
        return found
    # importlib.metadata (email, zipfile, csv …) is imported only where the direct
    # lookup found nothing: ``import lancetx`` and opening a table do not.
    from importlib import metadata

    try:
        return metadata.version("lancetx")
    except metadata.PackageNotFoundError:
        return NOT_INSTALLED


def _version_from_dist_info() -> str | None:
    """The ``Version`` of the first ``lancetx-*.dist-info`` on ``sys.path``, or None
    (then :mod:`importlib.metadata` decides)."""
    for entry in sys.path:
        path = entry or "."
        try:
            names = os.listdir(path)
        except OSError:  # a zip file, a missing directory: importlib.metadata knows
            continue
        infos = [n for n in names if _is_ours(n, ".dist-info")]
        if not infos:
            if any(_is_ours(n, ".egg-info") for n in names):
                return None
            continue
        if len(infos) != 1:
            return None  # several installs in one directory: as importlib.metadata picks
        return _metadata_version(os.path.join(path, infos[0], "METADATA"))
    return None


def _is_ours(name: str, suffix: str) -> bool:
    """Whether ``name`` is lancetx's ``<name>-<version><suffix>`` (a normalized name has
    no dash, so ``lancetx-x-1.0`` is another distribution's)."""
    if not (name.lower().startswith(_DIST_PREFIX) and name.endswith(suffix)):
        return False
    version = name[len(_DIST_PREFIX) : -len(suffix)]
    return bool(version) and "-" not in version


def _metadata_version(path: str) -> str | None:
    """The ``Version:`` header of a ``METADATA`` file (its headers end at a blank line)."""
    try:
        with open(path, encoding="utf-8") as metadata:
            for line in metadata:
                if not line.strip():
                    break
                name, sep, value = line.partition(":")
                if sep and name.strip().lower() == "version" and value.strip():
                    return value.strip()
    except OSError:
        return None
    return None


__all__ = ["NOT_INSTALLED", "installed_version"]
