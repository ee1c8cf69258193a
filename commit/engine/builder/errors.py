"""The builder's typed errors: a transaction that does not fit the previous
version, and a feature lancetx does not build."""

from __future__ import annotations

from collections.abc import Iterable

from lancetx.commit.errors import CommitError, LancetxError, UnsupportedFeatureError


class InvalidTransactionError(CommitError):
    """The transaction cannot be applied to the previous version.

    ``operation`` is the transaction's operation (``"Delete"``), ``fragment_ids``
    the fragments at fault (if any), ``read_version`` the version it was planned
    against, ``previous_version`` the version it was applied to and ``version``
    the version being built. Nothing was written.
    """

    def __init__(
        self,
        operation: str,
        problem: str,
        *,
        read_version: int | None = None,
        previous_version: int | None = None,
        version: int | None = None,
        fragment_ids: Iterable[int] = (),
    ) -> None:
        self.operation = operation
        self.problem = problem
        self.read_version = read_version
        self.previous_version = previous_version
        self.version = version
        self.fragment_ids = tuple(sorted(fragment_ids))
        base = "a new table" if previous_version is None else f"version {previous_version}"
        super().__init__(
            f"cannot build version {version} from the {operation} transaction "
            f"(read_version {read_version}) on top of {base}: {problem}"
        )


class UnsupportedTransactionError(UnsupportedFeatureError):
    """The transaction needs a feature lancetx's manifest builder does not implement.

    Building it anyway could write a manifest Lance would build differently, so
    it is refused. ``feature`` names what is missing.
    """

    def __init__(self, operation: str, feature: str, flags: int = 0) -> None:
        self.path = f"{operation} transaction"
        self.role = "writer"
        self.flags = flags
        self.operation = operation
        self.feature = feature
        LancetxError.__init__(
            self,
            f"cannot build a manifest for the {operation} transaction: lancetx does not "
            f"implement {feature}; commit this change with pylance instead",
        )
