"""What a restart from a checkpoint must keep, read from the analyzed plan's text."""

from __future__ import annotations

from streamops.driver.fingerprints import plan_lines

# One driver's analyzed plan of the presence notifier's notify query (cut), and the same plan as a
# second driver prints it: other expression ids, lambda class and identity hash.
FIRST = """\
SerializeFromObject [staticinvoke(...) AS key#120, value#121]
+- FlatMapGroupsWithState org.apache.spark.sql.internal.ToScalaUDF$$$Lambda$2398/0x00007fbc64d1d498@1dfa9af8, \
invoke(cast(user_id#12 as string).toString()), Append, false, NoTimeout
   +- Project [user_id#12, kind#40, time_ms#41L]
"""
SECOND = FIRST.replace("#120", "#7").replace("#121", "#8").replace("#12", "#99").replace("#40", "#3").replace(
    "#41L", "#4L").replace("$2398/0x00007fbc64d1d498@1dfa9af8", "/0x00007f11aa0c2000@5e0c")


def test_a_jvm_function_operator_reads_the_same_from_every_driver():
    assert plan_lines(FIRST) == plan_lines(SECOND) == [
        "FlatMapGroupsWithState org.apache.spark.sql.internal.ToScalaUDF$$$Lambda, invoke(cast(user_id as string)"
        ".toString()), Append, false, NoTimeout",
    ]


def test_a_changed_operator_still_reads_as_changed():
    assert plan_lines(FIRST) != plan_lines(FIRST.replace("Append", "Update"))
    assert plan_lines(FIRST) != plan_lines(FIRST.replace("user_id#12 as string", "device_id#12 as string"))


def test_text_beside_an_at_sign_is_kept_outside_a_lambda_name():
    aggregate = "Aggregate [team#3], [team#3, count(if ((owner#2 = ops@cafe)) 1 else null) AS n#9L]\n"
    assert plan_lines(aggregate) != plan_lines(aggregate.replace("ops@cafe", "ops@beef"))
