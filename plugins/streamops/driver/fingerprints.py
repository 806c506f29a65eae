"""What must stay the same for a restart from an existing checkpoint: per query, its stateful
operators and window definitions as plan text (expression ids removed), the program's declared
stateful operators first. A rolling restart compares the running version's with the standby's.
"""

from __future__ import annotations

import re

from streamops.program_contract import OutputQuery, StreamingProgram

_STATEFUL = ("FlatMapGroups", "Aggregate", "Deduplicate", "Join", "TransformWithState")


# Expression ids, query ids and watermark delays (a changed watermark is restart-safe), and the
# name one JVM gives a lambda object ("$$Lambda$2398/0x00007fbc64d1d498@1dfa9af8" on Java 17,
# "$$Lambda/0x...@..." later), which a JVM function's operator (flatMapGroupsWithState from Java)
# prints and every driver numbers its own way. (Which function it is, the program declares.)
_VOLATILE = re.compile(
    r"#\d+L?|-T\d+ms|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
    r"|(?<=\$\$Lambda)(\$\d+)?/0x[0-9a-f]+(@[0-9a-f]+)?"
)


def plan_lines(plan: str) -> list[str]:
    """The analyzed plan's stateful operators and window definitions, without what varies from one
    driver to the next."""
    return [
        _VOLATILE.sub("", line.strip().lstrip(":+- ~"))
        for line in plan.splitlines()
        if any(node in line for node in _STATEFUL) or ("window" in line and "Expand" in line)
    ]


def plan_fingerprint(outputs: list[OutputQuery]) -> dict[str, list[str]]:
    """Per query, its stateful operators and window definitions as plan text with expression
    ids removed: what must stay the same for a restart from the existing checkpoint."""
    return {
        output.name: plan_lines(output.frame._jdf.queryExecution().analyzed().toString())  # noqa: SLF001 - no public API
        for output in outputs
    }


def stateful_fingerprint(program: StreamingProgram, outputs: list[OutputQuery]) -> dict[str, list[str]]:
    """`plan_fingerprint`, with the operators the program declares stateful (program contract)
    first: a changed declaration is a changed state layout even where the plan text looks alike."""
    fingerprint = plan_fingerprint(outputs)
    for query, operators in program.stateful_operators.items():
        fingerprint[query] = [f"declared: {op}" for op in operators] + fingerprint.get(query, [])
    return fingerprint
