"""The shipped gin configs, installed as package data `jaxrl_llm.configs` (pyproject.toml)."""
