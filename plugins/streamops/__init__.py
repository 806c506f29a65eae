"""streamops: deploy and operate Kafka streaming pipelines on Spark, with Airflow 3 in control."""
