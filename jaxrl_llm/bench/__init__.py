"""`jaxrl-llm bench` suites; each prints JSON with same-run baselines and machine ceilings."""
