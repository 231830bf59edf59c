"""Nexus serving runtime: torch workers per placed plan node, a routing frontend, load generation."""
