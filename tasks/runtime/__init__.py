"""The runtime every flow shares, naming no system: task runners (local, Ray) and their admission seam, requests and
placements, slices, MLflow tracking, PNG basics, gang rendezvous and what every flow does the same way
(``docs/architecture.md``)."""
