"""Where the manifest of one version lives: what a listing, a commit handler or
an external manifest store hands to a reader."""

from __future__ import annotations

from dataclasses import dataclass

from lancetx.commit.format.naming import NamingScheme


@dataclass(frozen=True)
class ManifestLocation:
    """Where the manifest of one version lives. ``size``/``etag`` are None when unknown.

    ``alternate_key`` is where the same bytes are found if ``key`` is gone: a
    staged manifest (``…manifest-{uuid}``) is deleted once it has been copied to
    its final name, so a reader that lost that race reads the final name.
    """

    version: int
    key: str
    scheme: NamingScheme
    size: int | None = None
    etag: str | None = None
    alternate_key: str | None = None
