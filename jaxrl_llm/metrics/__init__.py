"""Metric names (verl's), writers (jsonl, TensorBoard), plots and health checks."""

from jaxrl_llm.metrics.writer import MetricsWriter, read_metrics

__all__ = ["MetricsWriter", "read_metrics"]
