"""botocore's service data, kept on disk in Python's own fast format between processes.

The first boto3 client of a process costs ~80 ms, most of it botocore parsing JSON:
``endpoints.json`` (1.2 MB), the S3 and DynamoDB models and endpoint rule sets (3 MB
more, gzipped), through ``json.loads`` with an ``OrderedDict`` hook. pylance opens a
table in ~25 ms, so in a fresh process (a Spark worker, a CLI run) that parse was the
larger part of opening a table. :class:`CachingFileLoader` serves the same data from
a ``marshal`` copy (the format of ``.pyc`` files) written the first time a file is
read, which loads 3-4x faster, and answers botocore's listing of every service
directory (which it makes to check a service name) from a copy too; everything else
botocore does is unchanged.

A copy is keyed by the source file's path, size and modification time, Python's
version and the marshal format, so an upgraded botocore or another interpreter never
reads a stale copy. Copies are written atomically (a concurrent reader sees a whole
copy or none) and only ever by the user that runs lancetx, under
``$XDG_CACHE_HOME/lancetx/botocore`` (default ``~/.cache/lancetx/botocore``) or
``$LANCETX_AWS_MODEL_CACHE``; setting that variable to ``off`` turns the cache off.
When the directory cannot be written the loader simply parses the JSON, as botocore
does. Dicts come back as plain ``dict`` (ordered, like the ``OrderedDict`` botocore
builds).
"""

from __future__ import annotations

import hashlib
import logging
import marshal
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import botocore
from botocore.loaders import JSONFileLoader

log = logging.getLogger(__name__)

#: Environment variable: the cache directory, or ``off``.
CACHE_ENV = "LANCETX_AWS_MODEL_CACHE"
#: The extensions botocore tries, in its order.
_EXTENSIONS = (".json", ".json.gz")


def cache_dir() -> Path | None:
    """Where copies live (None: the cache is off)."""
    configured = os.environ.get(CACHE_ENV)
    if configured is not None:
        return None if configured.strip().lower() in ("off", "0", "false", "") else Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lancetx" / "botocore"


def _plain(value: Any) -> Any:
    # marshal takes dict and list, not their subclasses (botocore's OrderedDict).
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


class CachingFileLoader(JSONFileLoader):  # type: ignore[misc]
    """botocore's JSON file loader, reading each file through a marshal copy."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _copy_of(self, source: str) -> Path | None:
        try:
            stat = os.stat(source)
        except OSError:
            return None
        key = f"{source}\0{stat.st_size}\0{stat.st_mtime_ns}\0{sys.version}\0{marshal.version}"
        return self.directory / (hashlib.sha256(key.encode()).hexdigest() + ".marshal")

    def load_file(self, file_path: str) -> Any:
        """The data of ``file_path`` + ``.json`` (or ``.json.gz``), as botocore's loader."""
        source = next((file_path + e for e in _EXTENSIONS if os.path.isfile(file_path + e)), None)
        copy = self._copy_of(source) if source is not None else None
        if copy is not None:
            try:
                return marshal.loads(copy.read_bytes())
            except (OSError, EOFError, ValueError, TypeError):
                pass  # no copy yet (or an unreadable one): parse the JSON and write one
        data = super().load_file(file_path)
        if copy is not None and data is not None:
            _write(copy, data)
        return data


def _write(copy: Path, data: Any) -> None:
    """Write ``data``'s marshal copy atomically; a failure only costs the speed-up."""
    try:
        copy.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=copy.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(marshal.dumps(_plain(data)))
            os.replace(tmp, copy)
        except BaseException:
            os.unlink(tmp)
            raise
    except (OSError, ValueError) as exc:
        log.debug("not caching botocore data in %s: %s", copy.parent, exc)


class CachedServiceList:
    """``loader.list_available_services`` through a marshal copy.

    botocore lists every service directory on its search paths (~400 directories,
    ~2,700 ``stat`` calls) before loading any model, only to check that the name is
    known. The answer changes when a search path gains or loses a directory (which
    changes the path's modification time) or botocore is upgraded, so that is the key.
    """

    def __init__(self, loader: Any, directory: Path) -> None:
        self._loader = loader
        self._listing = loader.list_available_services
        self._directory = directory

    def __call__(self, type_name: str) -> list[str]:
        stamps = []
        for path in self._loader.search_paths:
            try:
                stamps.append(f"{path}\0{os.stat(path).st_mtime_ns}")
            except OSError:
                stamps.append(f"{path}\0-")
        key = "\0".join([type_name, botocore.__version__, sys.version, *stamps])
        copy = self._directory / (hashlib.sha256(key.encode()).hexdigest() + ".marshal")
        try:
            found = marshal.loads(copy.read_bytes())
            if isinstance(found, list):
                return found
        except (OSError, EOFError, ValueError, TypeError):
            pass
        services: list[str] = list(self._listing(type_name))
        _write(copy, services)
        return services


def install(botocore_session: Any) -> None:
    """Serve ``botocore_session``'s data files (and its list of services) through the
    cache, if it is on."""
    directory = cache_dir()
    if directory is None:
        return
    loader = botocore_session.get_component("data_loader")
    if isinstance(getattr(loader, "file_loader", None), JSONFileLoader):
        loader.file_loader = CachingFileLoader(directory)
        # An instance attribute, so botocore's own method (and its in-process cache)
        # stays what answers when the copy is missing.
        loader.list_available_services = CachedServiceList(loader, directory)


__all__ = ["CACHE_ENV", "CachedServiceList", "CachingFileLoader", "cache_dir", "install"]
