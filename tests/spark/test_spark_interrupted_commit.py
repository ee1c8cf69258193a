"""A Spark job interrupted at its claim keeps the version that landed (issue 19).

The job's commit runs in a Spark Python worker. Its claim lands, then that worker
gets Ctrl-C (SIGINT) or is SIGKILLed before it sees the answer (see
``claim_faults``). Spark then calls ``abort()`` — in another worker — with every
task's message: the data source cannot know whether the claim landed, so it keeps
the job's files. pylance alone opens every version; the one that landed holds the
job's rows; every data file is referenced (none deleted, none leaked). The unknown
outcome (a lost answer that cannot be settled) is
``test_spark_commit_faults.py::test_an_unsettled_commit_is_a_typed_error_and_abort_keeps_the_version``.
"""

from __future__ import annotations

from typing import Any

import pytest
from claim_faults import AtTheClaim, check_every_version_opens, victim_options
from spark_helpers import data_files, lance_ids, referenced_files, spark_options

from lancetx.demo.embedded import EmbeddedAws
from pyspark_lancetx import last_commit


@pytest.mark.slow  # one Spark job each, and a Python worker lost
@pytest.mark.parametrize("effect", ["sigint", "kill"])
def test_a_job_interrupted_at_its_claim_keeps_the_version_that_landed(
    spark: Any, legacy_aws: EmbeddedAws, ddb_uri: str, storage: dict[str, str], effect: str
) -> None:
    opts = spark_options(storage)
    spark.range(0, 10, 1, 1).write.format("lancetx").mode("append").options(**opts).save(ddb_uri)
    job = f"interrupted-{effect}"
    with AtTheClaim(legacy_aws, effect) as fault:
        with pytest.raises(Exception):  # noqa: B017 - Spark wraps the worker's end its own ways
            spark.range(10, 30, 1, 2).write.format("lancetx").mode("append").options(
                **spark_options(victim_options(storage))
            ).option("job_id", job).save(ddb_uri)
        assert fault.fired.wait(60) and fault.victim_pid is not None
        assert effect == "kill" or fault.reacted  # Ctrl-C arrived before any answer
    assert check_every_version_opens(ddb_uri, storage) == {1: 10, 2: 30}
    assert lance_ids(ddb_uri, storage) == list(range(30))
    assert last_commit(ddb_uri, job, storage) == 2
    assert data_files(ddb_uri, storage) == referenced_files(ddb_uri, storage)
