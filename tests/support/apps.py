"""Running an app's queries in the test's own Spark session."""

from __future__ import annotations


def run_available_now(spark, catalog, app_name, broker, checkpoint, **options):
    """Run every query of the app over what its inputs hold now, then stop; return the queries."""
    from streamops.driver.options import AVAILABLE_NOW, RunOptions
    from streamops.driver.queries import start_app
    from streamops.programs import load_program

    spec = catalog.app(app_name)
    program = load_program(spec)
    return start_app(
        spark,
        spec,
        program,
        RunOptions(kafka=broker.client_config, checkpoint=str(checkpoint), trigger=AVAILABLE_NOW, **options),
    )
