"""Rollout: JetStream-API engine, sampling, KV cache management, RL rollout driver."""
