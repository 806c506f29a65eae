"""spark-submit's master for an app: a local master gets a task slot per partition a real-time
app reads (a real-time query holds one per partition for as long as it runs)."""

from __future__ import annotations

import pytest

from streamops.spark_submit import with_task_slots


@pytest.mark.parametrize(
    ("master", "slots", "expected"),
    [("local[2]", 6, "local[6]"), ("local[*]", 10_000, "local[10000]"), ("local[8]", 6, "local[8]"), ("local", 3, "local[3]"),
     ("local[2]", 0, "local[2]"), ("spark://10.0.0.5:7077", 6, "spark://10.0.0.5:7077"), ("local[4,2]", 6, "local[6,2]")],
)
def test_a_local_master_gets_a_thread_per_partition_a_real_time_app_reads(master, slots, expected):
    assert with_task_slots(master, slots) == expected
