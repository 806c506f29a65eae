"""Start, check and stop the local services (Kafka broker, Airflow) as background processes."""
