"""Grafana boards as code, the panel query catalogue, and the evidence tool."""
