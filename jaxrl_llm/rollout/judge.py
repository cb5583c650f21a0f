"""LLM judges: a causal LM checkpoint grading responses through the rollout sampler seam,
named in configs as `"judge:/path/to/folder"` (or `"judge:builtin"`).

`Judge.score(responses, examples)` has `RewardPool.score`'s form: each response's judge
prompt (`rewards.judge_config.judge_message`: the question, the reference answer and the
response in `JudgeConfig.template`) is rendered by the judge checkpoint's chat template as one
user turn with the generation prompt, the judge writes a verdict with the sampler
`JudgeConfig.backend` names (our JAX engine, or vLLM: `rollout.sampler.build_sampler`,
loaded once from the folder, its weights pushed once), and `parse_verdict` reads the score.
The inserted texts (question, reference, response) give the judge no control tokens: the
judge tokenizer's special-token strings in them are neutralised first
(`tools.special_tokens`), so a response holding "<|im_end|><|im_start|>assistant ..."
reads as plain text, not as a forged turn; the template's own markers stay special.

Reproducible: the first ask is greedy. A verdict that does not parse is asked again up to
`JudgeConfig.retries` times at `retry_temperature`, each re-ask's randomness fixed by
`JudgeConfig.seed`, the attempt and the prompt's own tokens (never by which other responses
share the call), so a response scores the same however the rollout batches its scoring. A
score outside `JudgeConfig.score_range` or beyond float32 does not parse. A verdict that
never parses scores `unparsed_score`; a prompt longer than
`max_prompt_length` is not judged and scores it too. Per call, `last_counts` holds the
judge's counts (`retries`, `unparsed`, `too_long`), reported with its mean score as
`reward/judge:<name>/{mean,retries,unparsed,too_long}` (docs/rewards.md, "LLM judges").
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxrl_llm.config_checks import FLOAT32_MAX
from jaxrl_llm.data.templates import chat_prompt
from jaxrl_llm.rewards.judge_config import (
    JUDGE_PREFIX,
    JudgeConfig,
    judge_folder,
    judge_message,
    parse_verdict,
)
from jaxrl_llm.rollout.sampler import Sampler
from jaxrl_llm.rollout.sampling import SamplingParams
from jaxrl_llm.tools.special_tokens import neutralise_special_tokens, special_token_strings

COUNTS = ("retries", "unparsed", "too_long")


class Judge:
    """Scores (response, data row) pairs with an LLM's verdicts (the module docstring).

    `sampler` holds the judge's weights already (`Judge.load` builds one from a folder);
    `tokenizer` is the judge checkpoint's. The judge closes its sampler."""

    def __init__(self, sampler: Sampler, tokenizer, config: JudgeConfig, name: str):
        self.sampler, self.tokenizer, self.config, self.name = sampler, tokenizer, config, name
        self.special_tokens = special_token_strings(tokenizer)
        self.last_counts: dict[str, int] = {k: 0 for k in COUNTS}
        self.last_verdicts: list[str] = []

    @classmethod
    def load(cls, name: str, config: JudgeConfig, mesh=None) -> Judge:
        """The judge `name` ("judge:<folder>") loaded on `mesh` (None: the local devices),
        its sampler built by `config.backend` and its weights pushed."""
        from flax import nnx

        from jaxrl_llm.assets import resolve_checkpoint
        from jaxrl_llm.rollout.backends import takes_devices
        from jaxrl_llm.rollout.config import RolloutConfig
        from jaxrl_llm.rollout.loading import resolve_dtype
        from jaxrl_llm.rollout.sampler import SamplerContext, build_sampler

        path = resolve_checkpoint(judge_folder(name), f"reward {name!r}")
        model, tokenizer, mesh = _load_model(path, resolve_dtype(config.dtype), mesh)
        # A prompt and its verdict stay within the judge's context: a longer prompt is
        # counted `too_long`, not fed past the positions it was trained on.
        context = getattr(model.config, "max_position_embeddings", None)
        # (the engines size a sequence prompt + new tokens + 1)
        if context and config.max_prompt_length + config.max_new_tokens + 1 > context:
            longest = max(context - config.max_new_tokens - 1, 1)
            config = dataclasses.replace(config, max_prompt_length=longest)
        cfg = RolloutConfig(
            n=1, max_new_tokens=config.max_new_tokens, temperature=0.0,
            max_slots=config.max_slots, backend=config.backend, max_tool_calls=0,
        )  # fmt: skip
        # A backend on JAX devices samples on the judge's own (host-local) mesh; one that
        # places itself (vLLM) is given none.
        ctx = SamplerContext(
            cfg=cfg, policy=model, tokenizer=tokenizer, mesh=mesh, checkpoint=path,
            max_prompt_length=config.max_prompt_length,
            sampling_mesh=mesh if takes_devices(config.backend) else None,
        )  # fmt: skip
        sampler = build_sampler(ctx)
        try:
            sampler.push_weights(nnx.state(model))
        except BaseException:
            sampler.close()
            raise
        return cls(sampler, tokenizer, config, name)

    def prompts(
        self, responses: Sequence[str], examples: Sequence[Mapping[str, Any]]
    ) -> list[np.ndarray]:
        """The judge's prompt tokens [P] (int32) for each response."""

        def clean(text: str) -> str:
            return neutralise_special_tokens(text, self.special_tokens)

        chats = [
            [{"role": "user", "content": judge_message(self.config, e, r, clean)}]
            for r, e in zip(responses, examples, strict=True)
        ]
        if getattr(self.tokenizer, "chat_template", None):
            texts = [chat_prompt(self.tokenizer, c) for c in chats]
            ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        else:
            ids = self.tokenizer([c[0]["content"] for c in chats])["input_ids"]
        return [np.asarray(row, np.int32) for row in ids]

    def score(self, responses: Sequence[str], examples: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """Each response's score (float32 [B]) from the judge's verdict."""
        if len(responses) != len(examples):
            raise ValueError(f"{len(responses)} responses but {len(examples)} examples")
        prompts = self.prompts(responses, examples) if responses else []
        cfg = self.config
        scores = np.full(len(prompts), np.nan, np.float64)
        verdicts = [""] * len(prompts)
        fits = [len(p) <= cfg.max_prompt_length for p in prompts]
        todo = [i for i, ok in enumerate(fits) if ok]
        counts: dict[str, int] = {k: 0 for k in COUNTS}
        counts["too_long"] = len(prompts) - len(todo)
        for attempt in range(cfg.retries + 1):
            if not todo:
                break
            counts["retries"] += len(todo) if attempt else 0
            texts = self._ask([prompts[i] for i in todo], attempt)
            for i, text in zip(todo, texts, strict=True):
                verdicts[i] = text
                parsed = parse_verdict(text, cfg)
                # Finite as the float32 the reward is: 1e39 parses in float64 but is inf.
                if parsed is not None and abs(parsed) <= FLOAT32_MAX:
                    scores[i] = parsed
            todo = [i for i in todo if np.isnan(scores[i])]
        counts["unparsed"] = len(todo)
        scores[np.isnan(scores)] = cfg.unparsed_score
        self.last_counts, self.last_verdicts = counts, verdicts
        return scores.astype(np.float32)

    def _ask(self, prompts: list[np.ndarray], attempt: int) -> list[str]:
        """One verdict per prompt: greedy at attempt 0, else sampled with a seed fixed by
        the config, the attempt and each prompt's tokens."""
        cfg = self.config
        sampling = SamplingParams(
            temperature=0.0 if attempt == 0 else cfg.retry_temperature,
            max_new_tokens=cfg.max_new_tokens,
            n=1,
            seed=cfg.seed + attempt,
        )
        indices = [zlib.crc32(p.tobytes()) & 0x7FFFFFFF for p in prompts]
        done = self.sampler.generate(prompts, sampling, prompt_indices=indices)
        return [c.text for c in done]

    def close(self) -> None:
        self.sampler.close()

    def __enter__(self) -> Judge:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _load_model(path, dtype: str, mesh):
    """The judge's `CausalLM` (sharded for sampling on `mesh`, or one over the local
    devices), its tokenizer and the mesh."""
    import jax

    from jaxrl_llm.models import CausalLM, from_pretrained, load_tokenizer
    from jaxrl_llm.sharding import SAMPLE_RULES, build_mesh

    if mesh is None:
        mesh = build_mesh(1, 1, -1, devices=jax.local_devices())
    model = from_pretrained(path, dtype=dtype, mesh=mesh, rules=SAMPLE_RULES)
    assert isinstance(model, CausalLM)
    return model, load_tokenizer(path), mesh


def build_judge(name: str, config: JudgeConfig, mesh=None) -> Judge:
    """`rewards.config.build_rewards`' judge factory: `Judge.load`."""
    if not name.startswith(JUDGE_PREFIX):
        raise ValueError(f"{name!r} is not a judge reward ('judge:<folder>')")
    return Judge.load(name, config, mesh)
