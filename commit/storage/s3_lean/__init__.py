"""Lean S3 requests: what botocore would send, without its per-request pipeline.

Through botocore an S3 request costs a few ms of CPU on this project's benchmark machine,
little of it the HTTP exchange (endpoint rules, the User-Agent, a dozen events, ~30
response headers parsed into typed fields), where pylance's Rust client spends a
fraction of that. A lean request is the same request, learned from botocore once per
client, bucket and operation (a probe request stopped after botocore signed it, never
sent), signed with SigV4 exactly as botocore signs it, seen by the client's
``before-send`` handlers (request counters, guards, mocks that answer) and sent on a
connection of the client's own pool (its TLS, timeouts and connection reuse; through
its HTTP session when a proxy or the asyncio client is in the way). It never
decides anything: on any answer but a plain success the caller makes the ordinary
botocore call, whose answer is the definitive one.

* :mod:`.kit`: learning a template, signing, sending, relearning after refusals;
* :mod:`.exchange`: one request and its answer, as steps, with a blocking and an
  asyncio driver (every lean request, sync or async, is these steps);
* :mod:`.wire`: the HTTP/1.1 exchange itself, on a connection of the client's pool;
* :mod:`.gets`: ``Range: bytes=-N`` GETs of the manifests a catch-up reads;
* :mod:`.writes`: a commit's ``PutObject``, ``CopyObject`` and ``DeleteObject``.

Imported by the first lean request, never by opening a table.
"""

from __future__ import annotations

from lancetx.commit.storage.s3_lean.gets import AsyncLeanGets, LeanGets, lean_gets, sign_get
from lancetx.commit.storage.s3_lean.kit import (
    RELEARN_AFTER,
    LeanTemplate,
    quoted_key,
    sign,
    template_from_request,
)
from lancetx.commit.storage.s3_lean.writes import AsyncLeanWrites, LeanWrites, lean_writes

__all__ = [
    "RELEARN_AFTER",
    "AsyncLeanGets",
    "AsyncLeanWrites",
    "LeanGets",
    "LeanTemplate",
    "LeanWrites",
    "lean_gets",
    "lean_writes",
    "quoted_key",
    "sign",
    "sign_get",
    "template_from_request",
]
