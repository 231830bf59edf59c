"""The runtime every flow shares, naming no system: task runners (local, Ray), requests and placements, slices,
MLflow tracking, gang rendezvous and what every flow does the same way (``docs/architecture.md``)."""
