"""The shipped streaming apps: programs only (the driver that runs them is `streamops.driver`;
record parsing and dead letters, `streamops.records`).

Each program module holds a `program`: a `streamops.program_contract.StreamingProgram` whose
`queries()` build the transformation shared by streaming runs, backfills and reconciliations.
Drivers start through `streamops.entrypoints.driver` (spark-submit), never a program file.
No Airflow import here.
"""
