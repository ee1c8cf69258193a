"""lancetx: safe concurrent commits to Lance tables on object stores without conditional PUT.

The front door. The layers below it are importable on their own:
``lancetx.commit`` (format, storage, handlers, engine) and ``lancetx.externalstore``.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__: str = version("lancetx")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

from lancetx.multi_table import commit_many

__all__ = ["__version__", "commit_many"]
