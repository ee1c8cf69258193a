"""The installed lancetx distribution's version, looked up once per process.

Looking a distribution up (``importlib.metadata``) scans every entry of ``sys.path``
(~0.7 ms); the package's ``__version__``, the manifests' ``writer_version`` and the
AWS clients' User-Agent all read it from here.
"""

from __future__ import annotations

from functools import lru_cache

#: What :func:`installed_version` says when lancetx runs from a source tree that was
#: never installed.
NOT_INSTALLED = "0.0.0+unknown"


@lru_cache(maxsize=1)
def installed_version() -> str:
    """The installed distribution's version, or :data:`NOT_INSTALLED`."""
    # importlib.metadata (email, zipfile, csv …) is imported only when a version is
    # asked for: ``import lancetx`` does not
    from importlib import metadata

    try:
        return metadata.version("lancetx")
    except metadata.PackageNotFoundError:
        return NOT_INSTALLED


__all__ = ["NOT_INSTALLED", "installed_version"]
