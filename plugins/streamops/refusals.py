"""The one type a refusal has: a request the suite will not carry out, answered before anything
was changed.

Every "this input is not allowed" of the suite derives from `Refused`: a recovery plan's, a
reprocessing request's, a launch override's, a validation range's, a catalog's, a rolling
restart's, a second run on a busy app. Each keeps the words its operators know (its own heading
and layout), and all of them carry `problems`, every problem found, not only the first.

An Airflow task turns a refusal into a failure without retries in one place
(`streamops.dag_tasks.task_failure`: a `RefusalFailure` that carries the refusal, its text
`operator_text()`). A failure is known to be a refusal by its type (`streamops.dag_tasks.is_refusal`),
never by its text: `says_refused` only decides whether that text needs its "refused" label. Nothing
here imports Airflow: the floors below the DAG tasks raise these.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import ClassVar

# A refusal's text that already says it is one ("refused: ...", "rolling restart refused: ...",
# "the reprocessing request was refused before ..."): operator_text adds no label to it.
_SAYS_REFUSED = re.compile(r"[A-Za-z ]*\brefused\b[A-Za-z ]*:")


class Refused(ValueError):
    """Refused before anything was changed. `problems` lists every problem; str() is the text an
    operator reads: `heading`, then one problem a line (subclasses with a one-line form override
    `render`). `label` opens `operator_text()` when the text does not say "refused" itself."""

    heading: ClassVar[str] = "refused before anything was changed:"
    label: ClassVar[str] = "refused"

    def __init__(self, problems: str | Sequence[str]):
        self.problems: list[str] = [problems] if isinstance(problems, str) else [str(p) for p in problems]
        super().__init__(self.render(self.problems))

    def render(self, problems: list[str]) -> str:
        return "\n".join([self.heading, *(f"  - {p}" for p in problems)])

    def operator_text(self) -> str:
        """The refusal as a task failure or a CLI error shows it: it always says "refused"."""
        text = str(self)
        return text if says_refused(text) else f"{self.label}: {text}"


class OneLineRefused(Refused):
    """A refusal whose problems read best on one line, joined by "; " (a trigger's override, a
    running app): the caller usually puts it inside a sentence of its own."""

    def render(self, problems: list[str]) -> str:
        return "; ".join(problems)


def says_refused(text: str) -> bool:
    """Does this text open by saying it is a refusal? For composing a refusal's text only: an
    exception is a refusal by its type, whatever its text ("[Errno 111] Connection refused" is not)."""
    return bool(_SAYS_REFUSED.match(text))
