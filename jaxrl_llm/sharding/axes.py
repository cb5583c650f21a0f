"""Logical axis names. Model code names these only; `rules.py` maps them to mesh axes.

Parameters and activations use different names for the model dimension, because they
shard differently: under FSDP a weight's `embed` dimension is split over `fsdp`, while the
activation's `act_embed` dimension stays whole and the batch is split instead.
"""

# Parameter axes.
VOCAB = "vocab"
EMBED = "embed"
HEADS = "heads"
KV_HEADS = "kv_heads"
HEAD_DIM = "head_dim"
MLP = "mlp"

# Activation / cache axes.
BATCH = "batch"
SEQ = "seq"
CACHE_SEQ = "cache_seq"
LAYERS = "layers"
ACT_EMBED = "act_embed"
ACT_HEADS = "act_heads"
ACT_KV_HEADS = "act_kv_heads"
ACT_MLP = "act_mlp"
ACT_VOCAB = "act_vocab"

MESH_AXES = ("data", "fsdp", "tensor")
