"""botocore's service data, kept on disk in Python's own fast format between processes.

The first boto3 client of a process costs ~80 ms, most of it botocore parsing JSON:
``endpoints.json`` (1.2 MB), the S3 and DynamoDB models and endpoint rule sets (3 MB
more, gzipped), through ``json.loads`` with an ``OrderedDict`` hook. pylance opens a
table in ~25 ms, so in a fresh process (a Spark worker, a CLI run) that parse was the
larger part of opening a table. :class:`CachingFileLoader` serves the same data from
a ``marshal`` copy (the format of ``.pyc`` files) written the first time a file is
read, which loads 3-4x faster, and answers botocore's listing of every service
directory (which it makes to check a service name) from a copy too. Service models
are kept as lancetx's clients use them (only the operations lancetx and botocore call
on them, no documentation: see :mod:`.aws_service_models`); everything else botocore does is
unchanged.

A copy is keyed by the source file's path, size and modification time, Python's
version, the marshal format and what the service models keep, so an upgraded
botocore, another interpreter or another list of operations never reads a stale
copy. Copies are written atomically (a concurrent reader sees a whole
copy or none) and only ever by the user that runs lancetx, under
``$XDG_CACHE_HOME/lancetx/botocore`` (default ``~/.cache/lancetx/botocore``) or
``$LANCETX_AWS_MODEL_CACHE``; setting that variable to ``off`` turns the cache off
(and with it the trimming: clients then have botocore's whole models).
When the directory cannot be written the loader simply parses the JSON, as botocore
does. Dicts come back as plain ``dict`` (ordered, like the ``OrderedDict`` botocore
builds).

``endpoints.json`` holds the endpoints of every AWS service (~300) in every partition;
botocore loads all of it for the first client, to look up one service. With the cache
on, the session's endpoint resolver (:class:`TrimmedEndpointResolver`) starts from a
copy holding only the services lancetx's clients and credentials use
(:data:`ENDPOINT_SERVICES`), every partition's own data intact, and loads the whole
file the first time it is asked about any other service: it answers every question
as botocore's resolver does, only sooner.
"""

from __future__ import annotations

import hashlib
import logging
import marshal
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import botocore
from botocore.loaders import JSONFileLoader
from botocore.regions import EndpointResolver

from lancetx.commit.storage.aws_service_models import (
    CLIENT_OPERATIONS,
    explain_missing_operation,
    trim_digest,
    trim_service_model,
)

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
    """botocore's JSON file loader, reading each file through a marshal copy.

    Service models (``service-2``) come as lancetx's clients use them (see
    :mod:`.aws_service_models`), whether read from a copy or parsed.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _copy_of(self, source: str, *also: str | None) -> Path | None:
        key = ""
        for path in (source, *also):
            if path is None:
                key += "\0-"
                continue
            try:
                stat = os.stat(path)
            except OSError:
                return None
            key += f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\0"
        key += f"{sys.version}\0{marshal.version}\0{trim_digest()}"
        return self.directory / (hashlib.sha256(key.encode()).hexdigest() + ".marshal")

    def load_file(self, file_path: str) -> Any:
        """The data of ``file_path`` + ``.json`` (or ``.json.gz``), as botocore's loader."""
        source = _source_of(file_path)
        path = Path(file_path)
        service_model = path.name == _SERVICE_MODEL
        # A service model is trimmed against its endpoint rule set (the same directory):
        # its copy is keyed by both files.
        rule_set_path = str(path.parent / _RULE_SET) if service_model else None
        rule_set_source = _source_of(rule_set_path) if rule_set_path is not None else None
        copy = (
            self._copy_of(source, *([rule_set_source] if service_model else []))
            if source is not None
            else None
        )
        if copy is not None:
            try:
                return marshal.loads(copy.read_bytes())
            except (OSError, EOFError, ValueError, TypeError):
                pass  # no copy yet (or an unreadable one): parse the JSON and write one
        data = super().load_file(file_path)
        if isinstance(data, dict) and service_model:
            # botocore's layout: <data path>/<service>/<API version>/service-2
            rule_set = (
                self.load_file(rule_set_path)
                if rule_set_path is not None and rule_set_source is not None
                else None
            )
            data = trim_service_model(path.parent.parent.name, _plain(data), rule_set)
        if copy is not None and data is not None:
            _write(copy, data)
        return data


#: botocore's names of a service model file and of its endpoint rule set.
_SERVICE_MODEL = "service-2"
_RULE_SET = "endpoint-rule-set-1"


def _source_of(file_path: str | None) -> str | None:
    """The file botocore's loader reads for ``file_path`` (None: none exists)."""
    if file_path is None:
        return None
    return next((file_path + e for e in _EXTENSIONS if os.path.isfile(file_path + e)), None)


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


#: The services whose endpoints the trimmed endpoint data keeps: lancetx's clients, and
#: STS, which botocore's credential providers call for an assumed role.
ENDPOINT_SERVICES = ("dynamodb", "s3", "sts")
#: botocore's name of its endpoint data (``endpoints.json``).
_ENDPOINTS = "endpoints"


def trim_endpoints(data: dict[str, Any], services: Iterable[str]) -> dict[str, Any]:
    """``endpoints.json``'s ``data`` with only ``services`` under each partition's
    ``services`` (every other field of a partition and of the file as it is)."""
    keep = set(services)
    partitions = []
    for partition in data["partitions"]:
        trimmed = dict(partition)
        trimmed["services"] = {
            name: value for name, value in partition.get("services", {}).items() if name in keep
        }
        partitions.append(trimmed)
    return {**data, "partitions": partitions}


class TrimmedEndpointResolver(EndpointResolver):
    """botocore's endpoint resolver, started on the endpoint data of ``services`` only.

    Asked about any other service it first replaces that data with the whole file
    (``load_full``), once, so its answers are always botocore's. Questions about
    partitions and regions need no service and are answered from the partitions'
    own data, which the trimmed copy keeps whole.
    """

    def __init__(
        self,
        trimmed: dict[str, Any],
        services: Iterable[str],
        load_full: Callable[[], dict[str, Any]],
        uses_builtin_data: bool = False,
    ) -> None:
        super().__init__(trimmed, uses_builtin_data=uses_builtin_data)
        self.services = frozenset(services)
        self._load_full: Callable[[], dict[str, Any]] | None = load_full
        self._lock = threading.Lock()

    @property
    def trimmed(self) -> bool:
        """Whether the resolver still holds the trimmed data."""
        return self._load_full is not None

    def _cover(self, service_name: str) -> None:
        if service_name in self.services or self._load_full is None:
            return
        with self._lock:
            if self._load_full is not None:
                self._endpoint_data = self._load_full()
                self._load_full = None

    def get_service_endpoints_data(self, service_name: str, *args: Any, **kwargs: Any) -> Any:
        self._cover(service_name)
        return super().get_service_endpoints_data(service_name, *args, **kwargs)

    def get_available_endpoints(self, service_name: str, *args: Any, **kwargs: Any) -> Any:
        self._cover(service_name)
        return super().get_available_endpoints(service_name, *args, **kwargs)

    def construct_endpoint(self, service_name: str, *args: Any, **kwargs: Any) -> Any:
        self._cover(service_name)
        return super().construct_endpoint(service_name, *args, **kwargs)


def _endpoints_source(loader: Any) -> tuple[str, str] | None:
    """Where botocore's loader would read ``endpoints`` from: (the path it reports,
    the file), the first search path holding the file, as
    ``loader.load_data_with_path`` searches."""
    for path in loader.search_paths:
        if not os.path.isdir(path):
            continue
        candidate = os.path.join(path, _ENDPOINTS)
        for extension in _EXTENSIONS:
            if os.path.isfile(candidate + extension):
                return candidate, candidate + extension
    return None


def _trimmed_copy(directory: Path, source: str, services: Iterable[str]) -> Path | None:
    try:
        stat = os.stat(source)
    except OSError:
        return None
    key = "\0".join(
        [
            "trimmed-endpoints",
            source,
            str(stat.st_size),
            str(stat.st_mtime_ns),
            ",".join(sorted(services)),
            botocore.__version__,
            sys.version,
            str(marshal.version),
        ]
    )
    return directory / (hashlib.sha256(key.encode()).hexdigest() + ".marshal")


def endpoint_resolver_factory(
    botocore_session: Any, directory: Path, services: Iterable[str] = ENDPOINT_SERVICES
) -> Callable[[], EndpointResolver]:
    """What builds ``botocore_session``'s endpoint resolver: a
    :class:`TrimmedEndpointResolver` from the trimmed copy (written from the whole
    data the first time), or botocore's own when the data cannot be found."""
    kept = tuple(sorted(set(services)))

    def create() -> EndpointResolver:
        loader = botocore_session.get_component("data_loader")
        found = _endpoints_source(loader)
        if found is None:  # botocore's behaviour (and its error), unchanged
            endpoints, path = loader.load_data_with_path(_ENDPOINTS)
            return EndpointResolver(endpoints, uses_builtin_data=loader.is_builtin_path(path))
        path, source = found

        def load_full() -> dict[str, Any]:
            data, _ = loader.load_data_with_path(_ENDPOINTS)
            return _as_dict(data)

        copy = _trimmed_copy(directory, source, kept)
        trimmed: Any = None
        if copy is not None:
            try:
                trimmed = marshal.loads(copy.read_bytes())
            except (OSError, EOFError, ValueError, TypeError):
                trimmed = None
        if not isinstance(trimmed, dict) or "partitions" not in trimmed:
            trimmed = trim_endpoints(load_full(), kept)
            if copy is not None:
                _write(copy, trimmed)
        return TrimmedEndpointResolver(
            trimmed, kept, load_full, uses_builtin_data=loader.is_builtin_path(path)
        )

    return create


def _as_dict(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise TypeError(f"botocore's endpoint data is a {type(data).__name__}, not a dict")
    return data


def install(botocore_session: Any) -> bool:
    """Serve ``botocore_session``'s data files (and its list of services) through the
    cache, if it is on: its clients are then built from trimmed service models (see
    :mod:`.aws_service_models`), and its endpoint resolver starts from the endpoints
    of :data:`ENDPOINT_SERVICES` only. Returns whether the models are trimmed."""
    directory = cache_dir()
    if directory is None:
        return False
    loader = botocore_session.get_component("data_loader")
    if not isinstance(getattr(loader, "file_loader", None), JSONFileLoader):
        return False
    loader.file_loader = CachingFileLoader(directory)
    # An instance attribute, so botocore's own method (and its in-process cache)
    # stays what answers when the copy is missing.
    loader.list_available_services = CachedServiceList(loader, directory)
    internal = getattr(botocore_session, "_internal_components", None)
    if internal is not None and hasattr(internal, "lazy_register_component"):
        # botocore registers its own resolver the same way (lazily, as an internal
        # component); this one replaces it before any client asked for it.
        internal.lazy_register_component(
            "endpoint_resolver", endpoint_resolver_factory(botocore_session, directory)
        )
    for service in CLIENT_OPERATIONS:
        botocore_session.register(f"getattr.{service}", _missing_operation)
    return True


def _missing_operation(client: Any, event_name: str, **kwargs: Any) -> None:
    # Event names read ``getattr.<service>.<attribute>``.
    explain_missing_operation(client, event_name.split(".", 2)[2])


__all__ = [
    "CACHE_ENV",
    "ENDPOINT_SERVICES",
    "CachedServiceList",
    "CachingFileLoader",
    "TrimmedEndpointResolver",
    "cache_dir",
    "endpoint_resolver_factory",
    "install",
    "trim_endpoints",
]
