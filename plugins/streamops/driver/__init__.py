"""The driver: the process spark-submit runs for every app, and the only code that starts queries.

The control plane (DAG tasks, the CLI, the supervisor) launches it and reads what it leaves
beside the checkpoint (`streamops.app_runtime`); a program (`streamops.program_contract`) gives
it queries and never starts them itself. Modules, each a concern:

- `arguments`: the command line as one typed value (`DriverArgs`), parsed here, built by launchers.
- `exit_codes`: how a driver ends (`ExitCode`).
- `run`: one run, from the lease to its release (`main`).
- `options`: what a run is asked to do (`RunOptions`; triggers).
- `session`, `kafka_io`: the SparkSession every app runs in; Kafka source and sink options.
- `outputs`: the program's queries over the app's topics, skip list and end offsets applied.
- `queries`: starting them; `sink`: the lease-fenced Kafka sink; `real_time`: what real-time mode needs.
- `state_check`: Spark's verdict on restarting from a checkpoint (a copy, one empty batch); `progress`:
  per-batch progress published.
- `preparation`, `warm_standby`: what is built before the queries start; a rolling restart's standby.
- `stopping`: graceful stops, signals, and how an ending is worded.

The driver speaks protocol `DRIVER_PROTOCOL` (its command line and runtime files). An artifact
records the protocol it was built for (`streamops.artifacts`); a launcher refuses one built for
another by name, since an artifact's program is imported into this driver.
"""

DRIVER_PROTOCOL = 2  # 1: artifacts that carried their own driver (spark_apps.common.runner), before it moved here
