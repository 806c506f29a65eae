"""Code every app shares: the Spark session, Kafka in and out, record parsing, dead letters."""
