"""What each miniature reproduction runs: its arms (gin files + bindings), the paper's claim,
which arms to compare, and the preparation some need before the arms can run.

An arm is one `jaxrl-llm train` configuration; the runner adds the seed, step count and run
directory. A preparation (``Repro.prepare``) runs once per reproduction, before any arm, and
returns per-(arm, seed) gin bindings (e.g. the LIM subset's file, each seed's random subset,
an SFT checkpoint) plus notes for the report (e.g. what the selection kept).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from jaxrl_llm.config_checks import ConfigError

PREPARED = "prepared.json"  # in a preparation's out_dir: what it was trained from, and its notes


def finished_preparation(out: Path, signature: str) -> dict | None:
    """The notes of a preparation's training already finished in `out` from the same
    settings (its `hf/` checkpoint written, its `PREPARED` record's signature matching), with
    `reused`; None when it must be trained. Changed code is not seen: delete `out` to
    retrain after changing a trainer."""
    record = out / PREPARED
    if not (record.is_file() and (out / "hf" / "config.json").is_file()):
        return None
    notes = json.loads(record.read_text())
    if notes.pop("signature", None) != signature:
        return None
    return {**notes, "reused": True}


def preparation_signature(gin_file: str, data: Path, params: list[str]) -> str:
    """What decides a preparation's training (an SFT, LIMR's scoring run) besides the code:
    the gin file, the bindings (the step budget and output folder among them) and the
    training data, hashed."""
    from jaxrl_llm.config import resolve_gin_file

    h = hashlib.sha256()
    for part in (resolve_gin_file(gin_file).read_bytes(), "\n".join(params).encode(),
                 data.read_bytes()):  # fmt: skip
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()


@dataclasses.dataclass(frozen=True)
class Arm:
    name: str
    gin_files: tuple[str, ...]
    description: str
    gin_params: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class PrepOptions:
    """What the caller of a preparation controls: where it writes, the seeds it must serve,
    ``prep_steps``, a cap on its own training (None: the reproduction's default; small
    values for smoke tests), and the bindings every RL run takes."""

    out_dir: Path
    seeds: tuple[int, ...]
    prep_steps: int | None = None
    # The caller's `--gin_param` bindings, for the preparation's own RL runs (LIMR's scoring
    # run): settings of the machine or the algorithm, e.g. `MeshConfig.devices = 1`. The
    # preparation's bindings of its data and step count come after them and win.
    gin_params: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A preparation's result: extra gin bindings per arm (for every seed) and per (arm, seed),
    and JSON-serialisable notes for the report."""

    arm_params: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    seed_params: Mapping[tuple[str, int], tuple[str, ...]] = dataclasses.field(default_factory=dict)
    notes: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def params(self, arm: str, seed: int) -> tuple[str, ...]:
        return (*self.arm_params.get(arm, ()), *self.seed_params.get((arm, seed), ()))


@dataclasses.dataclass(frozen=True)
class Repro:
    name: str
    claim: str  # the paper's claim, one sentence, with its reference
    arms: tuple[Arm, ...]
    comparisons: tuple[tuple[str, str], ...]  # (a, b): report a - b
    prepare: str | None = None  # "module:function" taking (PrepOptions) -> Prepared

    def arm(self, name: str) -> Arm:
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise ValueError(f"{self.name} has no arm {name!r}; arms: {[a.name for a in self.arms]}")

    def prepare_fn(self) -> Callable[[PrepOptions], Prepared] | None:
        if self.prepare is None:
            return None
        module, fn = self.prepare.split(":")
        return getattr(importlib.import_module(module), fn)


REPROS: dict[str, Repro] = {
    "torl": Repro(
        name="torl",
        claim=(
            "ToRL (Li, Zou, Liu 2025, arXiv:2503.23383): RL with a code interpreter in the loop "
            "reaches higher accuracy than the same RL without it."
        ),
        arms=(
            Arm(
                "tool",
                ("torl_tiny_fair.gin",),
                "SFT on ToRL-style Python solutions, then GRPO with the sandbox",
            ),
            Arm(
                "no_tool",
                ("torl_tiny_fair_notool.gin",),
                "the same SFT budget on step-by-step text arithmetic, then GRPO without a tool",
            ),
        ),
        comparisons=(("tool", "no_tool"),),
        prepare="jaxrl_llm.repro.torl_stage:prepare_torl",
    ),
    "limr": Repro(
        name="limr",
        claim=(
            "LIMR (Li et al. 2025, arXiv:2502.11886): the prompts whose learning curve follows "
            "the mean curve (LIM) train as well as the full set, and better than a random "
            "subset of the same size."
        ),
        arms=(
            Arm("full", ("limr_tiny_mix.gin",), "every prompt of the mixed set"),
            Arm("lim", ("limr_tiny_mix.gin",), "the LIM-selected subset"),
            Arm("random", ("limr_tiny_mix.gin",), "a random subset of the LIM subset's size"),
        ),
        comparisons=(("lim", "random"), ("lim", "full"), ("full", "random")),
        prepare="jaxrl_llm.repro.limr_stage:prepare_limr",
    ),
    "search-r1": Repro(
        name="search-r1",
        claim=(
            "Search-R1 (Jin et al. 2025, arXiv:2503.09516): RL with a search engine in the loop "
            "beats RL without retrieval on questions that need facts the model lacks, and "
            "masking the retrieved tokens from the loss trains better than training on them."
        ),
        arms=(
            Arm("search", ("search_r1_tiny_sft.gin",), "GRPO with the BM25 search tool"),
            Arm(
                "no_search",
                ("search_r1_tiny_sft.gin",),
                "the same GRPO, search tags never answered",
                ("RolloutConfig.tool = 'none'",),
            ),
            Arm(
                "search_unmasked",
                ("search_r1_tiny_sft.gin",),
                "GRPO with the search tool, the retrieved passages trained on too",
                ("AlgoConfig.mask_tool_output = False",),
            ),
        ),
        comparisons=(("search", "no_search"), ("search", "search_unmasked")),
        prepare="jaxrl_llm.repro.search_stage:prepare_search",
    ),
    "agent": Repro(
        name="agent",
        claim=(
            "Agentic RL (as verl's AgentLoop, SkyRL, Tunix's agentic learner run it): GRPO on "
            "multi-turn episodes with several tools, calls in the model's chat format, raises "
            "accuracy and the share of well-formed calls over the SFT checkpoint it starts from."
        ),
        arms=(
            Arm(
                "grpo",
                ("agent_tiny.gin",),
                "a short SFT on worked calculator episodes, then GRPO in the environment",
            ),
        ),
        comparisons=(),
        prepare="jaxrl_llm.repro.agent_stage:prepare_agent",
    ),
    "rm": Repro(
        name="rm",
        claim=(
            "RL against a learned reward model (as in InstructGPT, Ouyang et al. 2022, "
            "arXiv:2203.02155; Gao, Schulman, Hilton 2022, arXiv:2210.10760, on "
            "overoptimization): GRPO raises the reward model's score of the policy's samples; "
            "whether held-out correctness rises with it, or the policy games the model, a rule "
            "check the training never sees tells."
        ),
        arms=(
            Arm(
                "rm",
                ("rm_grpo_tiny.gin",),
                "GRPO on the tiny reward model's score alone (the math rule logged at weight 0)",
            ),
            Arm(
                "rule",
                ("rm_grpo_tiny.gin",),
                "GRPO on the math rule alone (the reward model logged at weight 0)",
            ),
        ),
        comparisons=(("rm", "rule"),),
        prepare="jaxrl_llm.repro.rm_stage:prepare_rm",
    ),
}


def get_repro(name: str) -> Repro:
    if name not in REPROS:
        raise ConfigError(f"unknown reproduction {name!r}; choose from {sorted(REPROS)}")
    return REPROS[name]


def seed_list(n: int) -> tuple[int, ...]:
    if n < 1:
        raise ConfigError(f"--seeds = {n}: expected an integer >= 1 (seeds 0..N-1)")
    return tuple(range(n))
