"""lancetx.demo: the demos and the embedded server they run on; no part of the library.

* :mod:`.embedded` — an in-process moto server standing in for S3 (optionally legacy:
  it ignores ``If-None-Match``) and DynamoDB, over real HTTP (extra ``embedded``); the
  tests and benchmarks run on it too;
* :mod:`.race` — ``lancetx-demo`` (``python -m lancetx.demo.race``): lancetx and pylance
  writers appending to one ``s3+ddb://`` table at once;
* :mod:`.spark` — ``make demo`` (``python -m lancetx.demo.spark``): the same race with
  Spark jobs.

Nothing in the library imports this package (``tests/test_layering.py``): it sits above
every layer, the Spark data source included.
"""
