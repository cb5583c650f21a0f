"""The LIMR paper workflow (README, docs, the gin config) trains as many steps as the
`limr score` command after it scores: otherwise the last epoch has no records and nothing
can be selected."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GIN = ROOT / "configs" / "limr_ppo_qwen2.5_math_7b.gin"
# LIMR's math.8k.json (arXiv:2502.11886: 8,523 MATH prompts); its lim/lim.sh scores
# --steps_per_epoch 8 --max_epochs 21.
MATH_8K_PROMPTS = 8523
LIMR_EPOCHS = 21


def _binding(text: str, name: str) -> int:
    (value,) = re.findall(rf"^{re.escape(name)} = (\d+)", text, flags=re.MULTILINE)
    return int(value)


def _score_commands() -> list[tuple[Path, int, int]]:
    """Every `limr score ... --steps-per-epoch S --epochs E` for this config in the docs."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for spe, epochs in re.findall(
            r"limr score --run \S*limr\S* --steps-per-epoch (\d+) --epochs (\d+)",
            path.read_text(),
        ):
            found.append((path, int(spe), int(epochs)))
    return found


def test_the_paper_config_trains_every_epoch_the_docs_score():
    gin = GIN.read_text()
    steps = _binding(gin, "RLConfig.steps")
    steps_per_epoch = MATH_8K_PROMPTS // _binding(gin, "DataConfig.prompts_per_step")
    assert steps == steps_per_epoch * LIMR_EPOCHS, (steps, steps_per_epoch)
    commands = _score_commands()
    assert commands, "README's LIMR workflow has a `limr score` command"
    for path, spe, epochs in commands:
        assert (spe, epochs) == (steps_per_epoch, LIMR_EPOCHS), path
        assert spe * epochs <= steps, path
