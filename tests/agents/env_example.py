"""An agent environment plug-in: the worked example of docs/agents.md.

`RolloutConfig.env = "env_example:make_env"` with this folder on PYTHONPATH. Each episode
is one row's question; the model may call `lookup` (a capital city) and `count_letters`
in its template's tool-call format, over several turns, then answers. Reward: 1 when the
final turn names the row's answer, 0 otherwise; a turn that calls tools earns nothing.
"""

import gin

from jaxrl_llm.agents import StepResult, ToolBox

CAPITALS = {"france": "Paris", "japan": "Tokyo", "peru": "Lima"}


def lookup(country: str) -> str:
    """The capital city of a country.

    Args:
        country: The country's English name.
    """
    return CAPITALS[country.lower()]


def count_letters(word: str) -> int:
    """How many letters a word has.

    Args:
        word: The word.
    """
    return sum(c.isalpha() for c in word)


class CapitalsEnv:
    def __init__(self, timeout_s: float):
        self.box = ToolBox([lookup, count_letters], timeout_s=timeout_s)
        self.tools = self.box.schemas  # rendered into the prompt by the chat template
        self.answer = ""

    def reset(self, row):
        self.answer = str(row["answer"])
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, turn):
        if (turn.calls or turn.malformed) and not turn.final:
            return StepResult(observations=self.box.answer(turn), metrics=self.box.metrics())
        right = self.answer in turn.text
        return StepResult(reward=float(right), done=True, metrics=self.box.metrics())

    def close(self):
        pass


@gin.configurable
def make_env(timeout_s: float = 5.0):
    return CapitalsEnv(timeout_s)
