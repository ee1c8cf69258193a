"""Version discovery by listing ``_versions/``.

This is how Lance finds versions when no external manifest store is involved,
and how it finds transactions to check for conflicts even when one is
(``list_manifest_locations`` is not overridden by the DynamoDB handler).

Only final manifest names count (:func:`lancetx.commit.format.naming.parse_manifest_name`):
staged ``…manifest-{uuid}`` names, ``latest_version_hint.json``, detached
``d…manifest`` versions and anything else are skipped. A directory holding
both V1 and V2 names is refused, as Lance refuses it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from lancetx.commit.errors import FormatError
from lancetx.commit.format import naming
from lancetx.commit.format.location import ManifestLocation
from lancetx.commit.format.naming import NamingScheme
from lancetx.commit.storage.objectstore import ObjectMeta, ObjectStore


class MixedNamingSchemesError(FormatError):
    """``_versions/`` holds manifests of both naming schemes (V1 and V2).

    Lance refuses such a directory ("Found multiple manifest naming schemes in
    the same directory"); pylance's ``migrate_manifest_paths_v2`` repairs it.
    """

    kind = "versions directory"

    def __init__(self, path: str, first: ManifestLocation, other: ManifestLocation) -> None:
        self.first = first
        self.other = other
        super().__init__(
            path,
            f"holds both {first.scheme.name} ({first.key.rsplit('/', 1)[-1]}) and "
            f"{other.scheme.name} ({other.key.rsplit('/', 1)[-1]}) manifest names; migrate the "
            "table to V2 names (pylance: dataset.migrate_manifest_paths_v2()) before using it",
        )


def versions_prefix(base: str) -> str:
    """The listing prefix of ``_versions/`` under ``base`` (ends with ``/``)."""
    return naming.join(base, naming.VERSIONS_DIR) + "/"


def manifest_location(prefix: str, meta: ObjectMeta) -> ManifestLocation | None:
    """The final manifest a listed object under ``prefix`` (a ``_versions/`` prefix) is,
    or None if it is anything else (staged, detached, in a subfolder, not a manifest)."""
    if not meta.key.startswith(prefix):
        return None
    name = meta.key[len(prefix) :]
    if "/" in name:
        return None
    parsed = naming.parse_manifest_name(name)
    if parsed is None:
        return None
    version, scheme = parsed
    return ManifestLocation(
        version=version, key=meta.key, scheme=scheme, size=meta.size, etag=meta.etag
    )


def iter_manifest_locations(store: ObjectStore, base: str) -> Iterator[ManifestLocation]:
    """Final manifests under ``base`` in the store's listing order (unchecked for mixing)."""
    prefix = versions_prefix(base)
    yield from manifest_locations(prefix, store.list(prefix))


def manifest_locations(prefix: str, listing: Iterable[ObjectMeta]) -> Iterator[ManifestLocation]:
    """The final manifests in ``listing`` (of ``prefix``), lazily, in listing order."""
    for meta in listing:
        location = manifest_location(prefix, meta)
        if location is not None:
            yield location


def _check_same_scheme(path: str, first: ManifestLocation, other: ManifestLocation) -> None:
    if other.scheme is not first.scheme:
        raise MixedNamingSchemesError(path, first, other)


def ascending_locations(locations: Iterable[ManifestLocation], path: str) -> list[ManifestLocation]:
    """``locations`` sorted by version; MixedNamingSchemesError (naming ``path``, the
    listed prefix's URI) if V1 and V2 names are mixed."""
    ordered = list(locations)
    for location in ordered[1:]:
        _check_same_scheme(path, ordered[0], location)
    ordered.sort(key=lambda loc: loc.version)
    return ordered


def newest_location(
    locations: Iterable[ManifestLocation], path: str, *, lexically_ordered: bool
) -> ManifestLocation | None:
    """The newest of ``locations`` (in listing order), consuming them lazily.

    With ``lexically_ordered`` and a first location that is V2, that first one
    is the newest (V2 names sort newest first) and nothing more is consumed.
    MixedNamingSchemesError (naming ``path``) if V1 and V2 names are mixed.
    """
    remaining = iter(locations)
    first = next(remaining, None)
    if first is None:
        return None
    if lexically_ordered and first.scheme is NamingScheme.V2:
        return first
    latest = first
    for location in remaining:
        _check_same_scheme(path, first, location)
        if location.version > latest.version:
            latest = location
    return latest


def list_manifest_locations(store: ObjectStore, base: str) -> list[ManifestLocation]:
    """Every committed version under ``base``, ascending by version.

    Raises MixedNamingSchemesError if V1 and V2 names are mixed.
    """
    return ascending_locations(
        iter_manifest_locations(store, base), store.uri(versions_prefix(base))
    )


def latest_manifest_location(store: ObjectStore, base: str) -> ManifestLocation | None:
    """The newest committed version under ``base``, or None if there is none.

    On a lexically ordered store whose first listed manifest is V2, that first
    entry is the newest (V2 names sort newest first) and the listing stops
    there, as in Lance. Otherwise every entry is listed and the maximum taken.
    """
    return newest_location(
        iter_manifest_locations(store, base),
        store.uri(versions_prefix(base)),
        lexically_ordered=store.capabilities.lexically_ordered_list,
    )


def detect_table_scheme(store: ObjectStore, base: str) -> NamingScheme | None:
    """The naming scheme of the table under ``base`` (None if it has no manifest).

    New commits must keep it: Lance never switches a table's scheme implicitly.
    """
    first = next(iter_manifest_locations(store, base), None)
    return None if first is None else first.scheme


__all__ = [
    "MixedNamingSchemesError",
    "ascending_locations",
    "detect_table_scheme",
    "iter_manifest_locations",
    "latest_manifest_location",
    "list_manifest_locations",
    "manifest_location",
    "manifest_locations",
    "newest_location",
    "versions_prefix",
]
