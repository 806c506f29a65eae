"""The code behind each DAG's tasks. DAG files only wire these together.

These functions run inside Airflow tasks, so they take what they need (hooks, params) as
arguments and return JSON-friendly dicts for XCom; they never touch the metadata database.
"""


def apps_param(names: list[str], *, required: bool, description: str):
    """The "Apps" multi-select of a trigger form, its choices taken from the catalog."""
    from airflow.sdk import Param

    if required:
        return Param(names[:1], type="array", items={"type": "string", "enum": names}, minItems=1,
                     uniqueItems=True, examples=names, title="Apps", description=description)
    return Param([], type=["array", "null"], items={"type": "string", "enum": names}, uniqueItems=True,
                 examples=names, title="Apps", description=description)


def number_problem(value: object, what: str, low: float, high: float, *, whole: bool = True) -> str | None:
    """Why a numeric param is out of its bounds (None: it is within). The form's schema has the
    same bounds; this is the check for callers that bypass the form."""
    import math

    kinds = int if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or (isinstance(value, float) and math.isnan(value)) \
            or not low <= value <= high:
        return f"{what} must be a {'whole ' if whole else ''}number from {low:g} to {high:g}, got {value!r}"
    return None


def checked_number(value: object, what: str, low: float, high: float, *, whole: bool = True):
    """`value`, or a task failure without retries naming the param and its bounds."""
    from airflow.sdk.exceptions import AirflowFailException

    problem = number_problem(value, what, low, high, whole=whole)
    if problem:
        raise AirflowFailException(f"refused: {problem}")
    return value


def is_dry_run(params: dict) -> bool:
    """Fail safe: anything but an explicit False (a form's switch turned off) is a dry run."""
    return params.get("dry_run", True) is not False
