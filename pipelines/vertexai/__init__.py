"""Vertex AI Pipelines: submit runs and keep schedules, and what is checked before the first request."""
