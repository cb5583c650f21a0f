"""The Search-R1 miniature's preparation: one SFT checkpoint that knows the search format.

The shipped tiny model has never seen Search-R1's tags, so RL from it scores 0 with or
without the tool. Every arm therefore starts from one checkpoint fine-tuned
(``search_sft_tiny.gin``) on demonstrations built from the built-in retrieval task in a world
of its own (``DEMO_WORLD_SEED``: no RL seed's facts are ever seen in SFT): the question (the
SFT loader renders it in the chat template, as ``search_r1_tiny_sft.gin`` does in RL), then
``<search> SUBJECT </search>``, the block the BM25 tool returns for that query
(``tools.search``, the same retriever and format RL uses), and ``<answer> ANSWER </answer>``.
The arms then differ only in RL: with the tool the block comes from the retriever; without
it nothing answers the search and the model must answer alone, which it cannot (the facts
are invented). Deviation: SFT trains on the retrieved block too (the SFT loader masks only
```output spans); at RL time it is inserted by the tool and masked (unless the arm trains
on it).
"""

from __future__ import annotations

import json
from pathlib import Path

from jaxrl_llm.data.tasks import arithmetic, retrieval
from jaxrl_llm.repro.specs import Prepared, PrepOptions
from jaxrl_llm.repro.torl_stage import prepared_sft, sft_run
from jaxrl_llm.tools.search import SEARCH_END, SEARCH_START, make_search_tool

SFT_GIN = "search_sft_tiny.gin"
RL_GIN = "search_r1_tiny_sft.gin"
ARMS = ("search", "no_search", "search_unmasked")  # all start from the one SFT checkpoint
N_TRAIN = 4000
DEMO_WORLD_SEED = 1000  # the demonstrations' invented world; RL seeds 0..N-1 use their own


def demonstrations(task_dir: Path, n_train: int) -> list[dict[str, str]]:
    """Prompt/response rows: search the question's subject, read the block, answer."""
    paths = retrieval.write_task(task_dir, n_train=n_train, n_val=0, seed=DEMO_WORLD_SEED)
    tool = make_search_tool(paths["corpus"])
    titles = {}
    for line in paths["corpus"].read_text().splitlines():
        doc = json.loads(line)
        titles[doc["id"]] = doc["contents"].split("\n")[0]
    rows = []
    for line in paths["train"].read_text().splitlines():
        q = json.loads(line)
        call = f"{SEARCH_START} {titles[q['doc_id']]} {SEARCH_END}"
        block = tool(call)
        if block is None:
            raise RuntimeError(f"the search tool ignored {call!r}")
        rows.append(
            {
                "prompt": q["question"],
                "response": f"{call}{block}<answer> {q['answer']} </answer>",
            }
        )
    return rows


def prepare_search(opts: PrepOptions) -> Prepared:
    """Writes the demonstrations, fine-tunes one checkpoint (or reuses the one a run with the
    same settings left: `torl_stage.prepared_sft`), points every arm at it."""
    data = arithmetic.write_jsonl(
        demonstrations(opts.out_dir / "search_task", N_TRAIN), opts.out_dir / "search_sft.jsonl"
    )
    out = opts.out_dir / "sft"
    params = [f"SFTConfig.train_file = '{data}'", f"SFTConfig.out_dir = '{out}'"]
    if opts.prep_steps is not None:
        params.append(f"SFTConfig.steps = {opts.prep_steps}")
    notes = prepared_sft(SFT_GIN, data, out, params, sft_run)
    checkpoint = (f"PolicyConfig.checkpoint = '{out / 'hf'}'",)
    return Prepared(arm_params={arm: checkpoint for arm in ARMS}, notes=notes)
