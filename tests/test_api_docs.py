"""docs/api.md is what ``make api-docs`` renders from the code as it stands: a changed
signature or docstring of the public API that is not in the reference fails here (the
reference had drifted: new errors and parameters missing from it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_docs_api_md_is_rendered_from_the_current_code() -> None:
    spec = importlib.util.spec_from_file_location("api_docs", ROOT / "tools" / "api_docs.py")
    assert spec is not None and spec.loader is not None
    api_docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(api_docs)
    written = (ROOT / "docs" / "api.md").read_text()
    assert written == api_docs.render(), (
        "docs/api.md is stale: run `make api-docs` and commit docs/api.md"
    )
