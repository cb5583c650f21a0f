"""`jaxrl-llm repro limr | search-r1` end to end at toy size: every arm, one seed, two steps."""

import json
import re

import gin
import pytest

from jaxrl_llm import cli
from jaxrl_llm.data.tasks import mixed_value, retrieval
from jaxrl_llm.metrics import read_metrics
from jaxrl_llm.repro.limr_stage import COUNTS
from jaxrl_llm.testing import ScriptedEngine

# Every RL run on one of the 8 simulated devices, the arms' and LIMR's scoring run
# (tests/learner/rl_helpers.py: a tiny model's steps over all 8 are several times slower;
# sharding is tested elsewhere).
ONE_DEVICE = ["--gin_param", "MeshConfig.devices = 1"]


@pytest.fixture(autouse=True)
def _no_bindings_left():
    """A reproduction parses its arms' gin files in this process; their bindings (e.g.
    search_r1_tiny.gin's `RewardConfig.name`) must not reach later tests' configs."""
    yield
    gin.clear_config()


def test_unknown_reproduction_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["repro", "r1"])
    assert exc.value.code == 2
    assert "invalid choice: 'r1'" in capsys.readouterr().err


@pytest.mark.slow  # 87 s alone, 118-145 s on 2 shared cores (6-step scoring run, 3 two-step arms)
def test_limr_smoke_runs_every_arm(tmp_path, capsys):
    out = tmp_path / "limr"
    code = cli.main(
        ["repro", "limr", "--seeds", "1", "--steps", "2", "--prep-steps", "6", "--out", str(out),
         *ONE_DEVICE]
    )  # fmt: skip
    assert code == 0
    result = json.loads((out / "results.json").read_text())
    assert sorted(result["arms"]) == ["full", "lim", "random"]
    for arm in result["arms"].values():
        (run,) = arm["runs"]
        assert run["seed"] == 0 and run["val_steps"] == [0, 2] and len(run["train_scores"]) == 2
        assert 0.0 <= run["val_scores"][-1] <= 1.0
    notes = result["prepared"]
    assert notes["full_set"] == COUNTS and notes["scoring_epochs"] == 1
    kept = sum(notes["lim_subset"].values())
    assert 1 <= kept <= sum(COUNTS.values())
    assert sum(notes["random_subsets"]["0"].values()) == kept
    assert set(notes["mean_lim_score_by_kind"]) == set(mixed_value.ITEM_KINDS)
    assert len(result["comparisons"]) == 9  # 3 pairs x (final, mean, gain)
    assert (out / "figure.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "lim_curves.png").is_file()
    assert "| lim - random | final |" in (out / "summary.md").read_text()
    assert '"out"' in capsys.readouterr().out


def _pattern(template: str) -> re.Pattern[str]:
    """A retrieval template ("Where was {s} born?") as a regex, each field a named group of
    word characters (names and numbers: `retrieval`'s subjects and answers)."""
    parts = re.split(r"\{(\w)\}", template)  # text, field, text, ...
    pieces = (re.escape(p) if i % 2 == 0 else f"(?P<{p}>\\w+)" for i, p in enumerate(parts))
    return re.compile("".join(pieces))


QUESTIONS = [_pattern(question) for _, question in retrieval.KINDS.values()]
FACTS = [_pattern(fact) for fact, _ in retrieval.KINDS.values()]


class ReaderEngine(ScriptedEngine):
    """A scripted Search-R1 policy: every sample writes `<search> SUBJECT </search>` (the
    subject read from its prompt's question, as the SFT demonstrations do); when the tool
    answers, every other sample inserted answers with the object of the first passage's
    fact (right whenever BM25 ranks the subject's document first), the rest with "unknown"
    (wrong), so each group of an even size is half right and GRPO's advantages are not 0.
    When nothing answers the search (`no_search`) it writes filler until its budget ends."""

    def __init__(self, tokenizer, **kw):
        super().__init__(tokenizer, [], **kw)
        self.plans: dict[int, list[list[int]]] = {}  # slot -> its turns' token ids
        self.reads: dict[int, bool] = {}
        self.inserted = 0

    def prefill_many(self, params, prompts):
        return [self.tokenizer.decode(p) for p in prompts]  # the prefix insert_slot gets

    def insert_slot(self, prefix, state, slot, sampling, max_new, row=0):
        (subject,) = {m["s"] for q in QUESTIONS for m in q.finditer(prefix[row])}
        self.plans[slot] = [self._ids(f"<search> {subject} </search>")]
        self.reads[slot], self.inserted = self.inserted % 2 == 0, self.inserted + 1
        return super().insert_slot(prefix, state, slot, sampling, max_new, row)

    def append_tokens(self, params, state, slot, tokens, start, sampling, max_new):
        first = self.tokenizer.decode(tokens).split("Doc 2(")[0]
        (answer,) = {m["o"] for f in FACTS for m in f.finditer(first)}
        answer = answer if self.reads[slot] else "unknown"
        self.plans[slot].append(self._ids(f"<answer> {answer} </answer>"))
        return super().append_tokens(params, state, slot, tokens, start, sampling, max_new)

    def _next_token(self, state, b: int) -> int:
        turns, turn = self.plans[b], state["turn"][b]
        if state["pos"][b] < len(turns[turn]):
            return turns[turn][state["pos"][b]]
        return int(self.eos_ids[0]) if turn > 0 else self.filler


@pytest.fixture
def reader_engine(monkeypatch):
    """Every arm's sampler (training and validation) runs `ReaderEngine`: two SFT steps cannot
    teach the tiny model the search format, and an arm that never searches compares nothing."""
    import jaxrl_llm.rollout as rollout_pkg

    real_engine = rollout_pkg.Engine

    def reader(policy, *, tokenizer, max_concurrent_decodes, max_cache_length, **kw):
        real = real_engine(policy, tokenizer=tokenizer, max_cache_length=max_cache_length,
                           max_concurrent_decodes=max_concurrent_decodes, **kw)  # fmt: skip
        engine = ReaderEngine(tokenizer, batch=max_concurrent_decodes,
                              cache_length=max_cache_length,
                              max_prefill_length=kw.get("max_prefill_length"))  # fmt: skip
        engine.param_shardings = real.param_shardings  # what the weight sync targets
        return engine

    monkeypatch.setattr(rollout_pkg, "Engine", reader)


@pytest.mark.slow  # 2-step SFT + 3 arms x 2 RL steps: 199 s on 2 loaded cores (270 s unscripted)
def test_search_r1_smoke_runs_every_arm(tmp_path, reader_engine):
    """The reproduction's plumbing, with a scripted policy (`ReaderEngine`, which ignores the
    weights, so the curves say nothing about learning): the search arms search once per
    sample and score half, the no-search arm never reaches a tool and scores 0, and the
    unmasked arm trains on more tokens (the passages) than the masked one."""
    out = tmp_path / "search"
    code = cli.main(
        ["repro", "search-r1", "--seeds", "1", "--steps", "2", "--prep-steps", "2",
         "--out", str(out), *ONE_DEVICE]
    )  # fmt: skip
    assert code == 0
    result = json.loads((out / "results.json").read_text())
    assert sorted(result["arms"]) == ["no_search", "search", "search_unmasked"]
    steps = {}
    for name, arm in result["arms"].items():
        (run,) = arm["runs"]
        assert run["seed"] == 0 and run["val_steps"][-1] == 2 and len(run["train_scores"]) == 2
        steps[name] = [r for r in read_metrics(run["run_dir"]) if "actor/trained_tokens" in r]
        assert [r["step"] for r in steps[name]] == [1, 2], name
        searched = name != "no_search"
        assert run["val_scores"] == [0.5 if searched else 0.0] * len(run["val_steps"]), name
        assert run["train_scores"] == [0.5 if searched else 0.0] * 2, name
        for r in steps[name]:
            assert r.get("env/tool_calls/mean", 0.0) == (1.0 if searched else 0.0), (name, r)
            assert (r["actor/grad_norm"] > 0) == searched, (name, r)
    for masked, unmasked in zip(steps["search"], steps["search_unmasked"], strict=True):
        assert unmasked["actor/trained_tokens"] > masked["actor/trained_tokens"], (masked, unmasked)
    assert result["prepared"]["sft_val_loss"] > 0
    assert len(result["comparisons"]) == 6  # 2 pairs x (final, mean, gain)
    final = {(c["a"], c["b"]): c["difference"]["mean"] for c in result["comparisons"]
             if c["metric"] == "final"}  # fmt: skip
    assert final == {("search", "no_search"): 0.5, ("search", "search_unmasked"): 0.0}
    assert "| search - search_unmasked | final |" in (out / "summary.md").read_text()
