"""What a reviewer reads: charts, Prefect artifacts and progress, and the MLflow records flows publish."""
