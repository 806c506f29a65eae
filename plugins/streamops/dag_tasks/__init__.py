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
