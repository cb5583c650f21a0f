"""Activations of one policy micro-batch, per device, from shapes alone: the `activations`
term of the memory plan (`learner.plan`; `plan_lora.lora_activation_bytes` adds LoRA's).

`a` = compute-dtype bytes; `b` = micro-batch rows per device (`micro_batch_size / (data*fsdp)`),
`t = T - 1` positions the step runs on, `T` = max_prompt_length + max_new_tokens; heads, kv
heads, mlp and vocab divided by `tensor` where the rules shard them. With `S = b*N*t*t*4`
(float32 attention scores), `bt = b*t` and the fitted buffer counts of `ACTIVATION_COUNTS`:
      layer = 2.8*S [+ 0.5*S*a/4 for bf16] + bt*(1.75*D + 5*F + 1*K*H)*a
      head  = 1.8*b*c*V*4 + 5.4*bt*D*a      (float32 logits of one [mb, c, V] chunk of
                                             `head_logprobs`, c <= t; embedding, final norm)
peak = L*layer + head without remat; L*bt*D*a (each layer's saved input) + layer (one
layer recomputed in its backward) + head with per-layer remat; plus, under fsdp, the
all-gathered embedding/LM head and two layers' weights (`gathered_bytes`). The counts were
fitted to XLA:CPU's buffer assignment of the real `make_policy_step` on 12 tiny configs
(varying T, D, F, N, K, V, L, mb: worst error 5%). One micro-batch's activations whatever M:
accumulation scans every micro-batch from zeros (`state.accumulate`; XLA at mb=4, T=128:
48.9, 49.9 and 49.9 MB for M = 1, 2, 3).

Known gap: XLA:CPU does not realise remat's saving (its scheduler hoists the recomputation;
measured 20.4 vs 21.3 MB at L=4), so remat estimates are only checked on accelerators.
"""

from __future__ import annotations

import numpy as np

from jaxrl_llm.learner.plan_shapes import abstract_mesh, param_bytes, shard_numel
from jaxrl_llm.sharding import axes as ax
from jaxrl_llm.sharding.rules import TRAIN_RULES

# Buffer counts per activation shape, fitted to XLA:CPU (see the module docstring).
ACTIVATION_COUNTS = {
    "scores": 2.8,  # float32 [b, N, t, t] per layer
    "scores_low_precision": 0.5,  # the probabilities cast to a bf16/f16 compute dtype
    "bt*D": 1.75,  # per layer, compute dtype: the layer input, norms
    "bt*F": 5.0,  # per layer: gate, up, silu, their product and its gradient
    "bt*KH": 1.0,  # per layer: k and v (q and the attention output fuse away)
    "logits": 1.8,  # float32 [b, chunk, V] once
    "bt*D_head": 5.4,  # embedding output, final norm and their gradients, once
}


def gathered_bytes(cfg, mesh) -> int:
    """FSDP's transient all-gathers: the embedding (and untied LM head) and two layers'
    weights (one in use, one prefetched), whole over `fsdp`, still split over `tensor`."""
    if mesh.shape["fsdp"] == 1:
        return 0
    unsharded = abstract_mesh(mesh.shape["data"], 1, mesh.shape["tensor"])
    total, _ = param_bytes(cfg, unsharded, TRAIN_RULES)
    embed = (
        shard_numel((cfg.vocab_size, cfg.hidden_size), (ax.VOCAB, None), TRAIN_RULES, unsharded)
        * np.dtype(cfg.param_dtype).itemsize
    )
    heads = embed * (1 if cfg.tie_word_embeddings else 2)
    return int(heads + 2 * (total - heads) / cfg.num_layers)


def activation_bytes(cfg, mesh, micro_batch: int, seq_len: int, remat: bool) -> dict[str, int]:
    """Peak activation bytes of one policy micro-batch (formula in the module docstring)."""
    a = np.dtype(cfg.dtype).itemsize
    t, mb = seq_len - 1, micro_batch
    R = TRAIN_RULES
    b = shard_numel((mb,), (ax.BATCH,), R, mesh)
    N = shard_numel((cfg.num_heads,), (ax.ACT_HEADS,), R, mesh)
    K = shard_numel((cfg.num_kv_heads,), (ax.ACT_KV_HEADS,), R, mesh)
    F = shard_numel((cfg.intermediate_size,), (ax.ACT_MLP,), R, mesh)
    V = shard_numel((cfg.vocab_size,), (ax.ACT_VOCAB,), R, mesh)
    D, H, bt = cfg.hidden_size, cfg.head_dim, b * t
    scores = b * N * t * t
    c = ACTIVATION_COUNTS
    layer = c["scores"] * scores * 4
    layer += (c["bt*D"] * D + c["bt*F"] * F + c["bt*KH"] * K * H) * bt * a
    if a < 4:
        layer += c["scores_low_precision"] * scores * a
    from jaxrl_llm.learner.experience import logit_chunk  # the policy step's chunk width

    chunk = min(t, logit_chunk(mb, cfg.vocab_size))
    logits = c["logits"] * b * chunk * V * 4
    head = logits + c["bt*D_head"] * bt * D * a
    saved = cfg.num_layers * bt * D * a + layer if remat else cfg.num_layers * layer
    return {"per_layer": int(layer), "logits": int(logits), "peak": int(saved + head)}
