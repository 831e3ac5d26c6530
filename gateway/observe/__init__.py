"""Observation: metrics, the access log, tracing. Metadata only, never a body."""
