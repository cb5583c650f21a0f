"""Miniature paper reproductions (ToRL, LIMR, Search-R1) over several seeds, with intervals.

Modules:
  specs        each reproduction's arms, claim, comparisons and preparation
  runner       runs every arm over every seed in one process; ``results.json``
  stats        bootstrap intervals and paired permutation tests (scipy.stats)
  report       the figure and the markdown tables of a result
  limr_stage   LIMR's preparation: mixed-value prompt set, scoring run, LIM / random subsets
  torl_stage   ToRL's preparation: equal-budget SFT of the tool and no-tool checkpoints
  cli          ``jaxrl-llm repro NAME``
"""
