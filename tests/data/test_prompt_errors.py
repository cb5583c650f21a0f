"""A prompt source that gives no full batch is a `ConfigError` naming what to change."""

import pytest

from jaxrl_llm.config_checks import ConfigError
from jaxrl_llm.data.pipeline import PipelineConfig, build_prompt_pipeline
from jaxrl_llm.data.sources import SourceConfig


def test_every_prompt_too_long_names_the_maximum_prompt_length(math_jsonl, char_tokenizer):
    config = PipelineConfig(SourceConfig(str(math_jsonl)), global_batch_size=4,
                            max_prompt_length=3)  # fmt: skip
    with pytest.raises(ConfigError, match=r"23 prompts are longer than 3 tokens; raise the max"):
        build_prompt_pipeline(config, char_tokenizer)
