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


@pytest.mark.parametrize(
    ("conn_type", "host", "port", "master"),
    [("spark", "local[2]", None, "local[2]"), ("spark", "spark://10.0.0.5", 7077, "spark://10.0.0.5:7077"),
     ("spark", "10.0.0.5", 7077, "spark://10.0.0.5:7077"), ("spark", "yarn", None, "yarn"),
     ("k8s", "https://api.example", 6443, "k8s://https://api.example:6443"), ("spark", None, None, "local[*]")],
)
def test_a_spark_connection_names_the_master_as_the_spark_provider_reads_it(conn_type, host, port, master):
    from streamops.spark_submit import SparkTarget

    assert SparkTarget.from_connection(conn_type, host, port, {}).master == master


def test_the_target_reaches_the_command_and_a_kubernetes_namespace_its_conf():
    from streamops.spark_submit import SparkTarget, SubmitSpec

    spec = SubmitSpec(name="streamops-a", application="driver.py", application_args=["--app", "a"], jars=["k.jar"],
                      conf={"spark.x": "1"}, min_task_slots=6)
    target = SparkTarget.from_connection("k8s", "https://api.example", 6443, {"deploy-mode": "cluster", "namespace": "streaming"})
    argv = spec.argv(target)
    assert argv[1:7] == ["--master", "k8s://https://api.example:6443", "--name", "streamops-a", "--deploy-mode", "cluster"]
    assert "spark.kubernetes.namespace=streaming" in argv and argv[-3:] == ["driver.py", "--app", "a"]
    assert spec.argv(SparkTarget("local[2]"))[2] == "local[6]"  # a local master gets the task slots
