"""Grafana boards as code and the panel query catalogue."""
