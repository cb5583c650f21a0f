"""`jaxrl-llm generate`: print completions of prompts from a checkpoint.

Interim implementation (greedy or temperature sampling over `CausalLM.extend`, one batch),
until the JetStream-API engine and rollout driver replace it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_llm.assets import resolve_checkpoint
from jaxrl_llm.models import KVCache, from_pretrained, load_tokenizer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", default="builtin", help="HF checkpoint dir or 'builtin'")
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    src.add_argument("--prompts-file", type=Path, help="one prompt per line")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chat", action="store_true", help="wrap prompts in the chat template")


def main(args: argparse.Namespace) -> int:
    path = resolve_checkpoint(args.checkpoint)
    tokenizer = load_tokenizer(path)
    model = from_pretrained(path)
    prompts = args.prompt or ["What is 12 + 30?"]
    if args.prompts_file:
        prompts = [ln for ln in args.prompts_file.read_text().splitlines() if ln.strip()]
    if args.chat:
        prompts = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
            )
            for p in prompts
        ]
    t0 = time.perf_counter()
    outs = generate(model, tokenizer, prompts, args.max_new_tokens, args.temperature, args.seed)
    dt = time.perf_counter() - t0
    for p, o in zip(prompts, outs):
        print(f"=== prompt: {p!r}\n{o}\n")
    n_tokens = sum(len(tokenizer(o)["input_ids"]) for o in outs)
    print(f"[{len(prompts)} prompts, {n_tokens} new tokens in {dt:.1f}s incl. compile]")
    return 0


def generate(model, tokenizer, prompts, max_new_tokens, temperature, seed) -> list[str]:
    ids = [tokenizer(p)["input_ids"] for p in prompts]
    B, T = len(ids), max(len(i) for i in ids)
    padded = np.zeros((B, T), np.int32)
    for b, row in enumerate(ids):
        padded[b, : len(row)] = row
    lengths = jnp.asarray([len(i) for i in ids], jnp.int32)
    cache = KVCache.zeros(model.config, B, T + max_new_tokens)
    graphdef, state = nnx.split(model)
    eos = jnp.asarray(model.config.eos_token_ids or (-1,))

    @jax.jit
    def prefill(state, cache):
        m = nnx.merge(graphdef, state)
        h, cache = m.extend(cache, jnp.asarray(padded), jnp.zeros(B, jnp.int32), lengths)
        return m.logits(h[jnp.arange(B), lengths - 1]), cache

    @jax.jit
    def step(state, cache, tokens, pos):
        m = nnx.merge(graphdef, state)
        h, cache = m.extend(cache, tokens[:, None], pos)
        return m.logits(h[:, 0]), cache

    def pick(logits, key):
        if temperature <= 0:
            return jnp.argmax(logits, -1)
        return jax.random.categorical(key, logits / temperature)

    key = jax.random.key(seed)
    logits, cache = prefill(state, cache)
    out = np.zeros((B, max_new_tokens), np.int32)
    done = np.zeros(B, bool)
    pos = lengths
    for t in range(max_new_tokens):
        key, sub = jax.random.split(key)
        tok = pick(logits, sub)
        out[:, t] = np.asarray(tok)
        done |= np.isin(out[:, t], np.asarray(eos))
        if done.all():
            break
        logits, cache = step(state, cache, tok, pos)
        pos = pos + 1
    texts = []
    for row in out:
        stop = np.flatnonzero(np.isin(row, np.asarray(eos)))
        row = row[: stop[0]] if stop.size else row
        texts.append(tokenizer.decode(row.tolist(), skip_special_tokens=True))
    return texts
