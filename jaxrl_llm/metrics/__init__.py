"""Metric names (verl's), writers (jsonl, TensorBoard, optional W&B), plots, health checks."""

from jaxrl_llm.metrics.writer import MetricsConfig, MetricsWriter, read_metrics

__all__ = ["MetricsConfig", "MetricsWriter", "read_metrics"]
