"""Output topic quality: bounded Kafka ranges validated with Great Expectations suites."""
