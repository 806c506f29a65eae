"""streamops.driver.progress: what the driver's per-batch log line says of a batch's time."""

from streamops.driver.progress import batch_phases


def test_a_batch_s_phases_are_named_longest_first_without_the_total_or_empty_ones():
    spark_says = {"addBatch": 10240, "commitOffsets": 31, "getBatch": 0, "latestOffset": 4, "queryPlanning": 212,
                  "triggerExecution": 10530, "walCommit": 40}
    assert batch_phases(spark_says) == "addBatch 10240, queryPlanning 212, walCommit 40, commitOffsets 31, latestOffset 4"
    assert batch_phases({"triggerExecution": 3}) == batch_phases(None) == "no phases"
