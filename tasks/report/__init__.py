"""What a reviewer reads, naming no system: charts, tables and progress in the Prefect UI, the pool's occupancy, and
``records``: the one way each system publishes its MLflow records, tables and charts."""
