"""A GPT-2-like decoder-only language model: a prefill graph over the prompt and a decoder step with a KV cache.

The export follows the seq2seq layout the rest of lazybatch already serves (``lazybatch.seq2seq`` metadata, see
docs/formats.md), with the prompt in the "encoder" part:

- **prefill** (runs once per request, STATIC stages): the right-padded prompt ``src_tokens`` [B, max_prompt] and
  its length ``src_len`` through every layer under a causal mask. It writes each layer's keys and values into a
  cache of ``max_prompt + max_output`` slots (``prefill_k{i}``/``prefill_v{i}``) and hands over the last prompt token
  and its position.
- **decoder step** (once per generated token, DECODER stages): one token per row at its own position ``dec_pos``.
  It writes that position's key/value into the row's cache (a one-hot Where, as the Transformer does) and attends to
  slots ``<= dec_pos``, so rows at different positions share a batch.

The decoder's carried state starts from the prefill's outputs (``init_from``): the first decoder step re-runs the
last prompt token at its own position (rewriting that cache slot with the same values) and yields the first new
token. Every generated token therefore comes from the same decoder step, and a request's tokens do not depend on
which requests shared its batches. Prompt slots past ``src_len`` hold the padding's keys; the decoder's mask never
reads a slot before it has written it, so they are never used.

GPT-2's block (pre-LayerNorm, GELU MLP of 4x width, learned positions, a final LayerNorm); the LM head is a weight of
its own rather than tied to the embedding (random weights make tying moot, and an untied head keeps the prefill and
decoder graphs free of shared transposes).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from ..builder import FLOAT, INT64, GraphBuilder
from .layers import NEG, attention, feed_forward, length_mask, one_hot_rows, unsqueeze, write_slot

BATCH = "batch"


@dataclass(frozen=True)
class LMConfig:
    layers: int = 12
    d_model: int = 768
    heads: int = 12
    vocab: int = 50257
    max_prompt: int = 128
    max_output: int = 384

    @property
    def cache(self) -> int:
        return self.max_prompt + self.max_output


GPT2_SMALL = LMConfig()  # GPT-2 small's shape (124M parameters), its 1024-token context cut to 512 cache slots
SMALL = LMConfig(layers=2, d_model=32, heads=2, vocab=64, max_prompt=8, max_output=12)  # tests: seconds to build
# The served benchmarks' model (`lazybatch repo default --model lm`): GPT-2's block at a size this 2-core CPU serves at
# about 10 ms a token. Its weights (~84M parameters, the LM head's vocabulary of 32000 included) outweigh a row's KV
# cache, as on a real LM, so a decoder step is bound by reading the weights and batching rows pays; a tail of several
# hundred output tokens.
SERVED = LMConfig(layers=4, d_model=512, heads=8, vocab=32000, max_prompt=32, max_output=384)


class _SharedWeights(GraphBuilder):
    """The prefill and the decoder step are two graphs over one set of weights: a weight or bias asked for again by
    name is the same initializer, not a fresh draw."""

    def __init__(self, name: str, seed: int = 0) -> None:
        super().__init__(name, seed)
        self._named: dict[str, str] = {}

    def weight(self, name: str, shape: Sequence[int], fan_in: int | None = None, gain: float = 1.0) -> str:
        if name not in self._named:
            self._named[name] = super().weight(name, shape, fan_in, gain)
        return self._named[name]

    def bias(self, name: str, n: int, scale: float = 0.01) -> str:
        if name not in self._named:
            self._named[name] = super().bias(name, n, scale)
        return self._named[name]


def _block_kv(g: GraphBuilder, x: str, d: int, name: str) -> tuple[str, str, str]:
    """Pre-LN: (h = LN(x), k, v) of one layer; the same weights serve the prefill and the decoder step (the query,
    ``_query``, only where attention runs: a dead node would leave a stage with no outputs)."""
    h = g.layer_norm(x, d, f"{name}.ln1")
    return h, g.linear(h, d, d, f"{name}.attn.k"), g.linear(h, d, d, f"{name}.attn.v")


def _query(g: GraphBuilder, h: str, d: int, name: str) -> str:
    return g.linear(h, d, d, f"{name}.attn.q")


def gpt2(seed: int = 0, small: bool = False, *, config: LMConfig | None = None, **overrides: Any
         ) -> tuple[GraphBuilder, dict[str, Any]]:
    """GPT-2-small-like decoder (12 layers, d 768, 12 heads, vocabulary 50257, 128 prompt + 384 output tokens);
    ``small``: 2 layers, d 32. ``overrides`` set fields of LMConfig (e.g. ``layers=4, d_model=256``)."""
    c = replace(config or (SMALL if small else GPT2_SMALL), **overrides)
    if c.d_model % c.heads or min(c.layers, c.max_prompt, c.max_output) < 1 or c.vocab < 4:
        raise ValueError(f"bad decoder configuration {c}: d_model must divide into heads, lengths >= 1, vocab >= 4")
    d, n_heads, P, C = c.d_model, c.heads, c.max_prompt, c.cache
    g = _SharedWeights("gpt2_small" if small else "gpt2", seed)
    wte = g.weight("wte", [c.vocab, d], fan_in=1, gain=0.02 ** 2 * 100)
    wpe = g.weight("wpe", [C, d], fan_in=1, gain=0.01 ** 2 * 100)
    # ---------------- prefill: the whole prompt at once, causal
    src = g.input("src_tokens", INT64, [BATCH, P], value_range=(0, c.vocab - 1))
    src_len = g.input("src_len", INT64, [BATCH], value_range=(1, P))
    x = g.op("Gather", [wte, src], name="prefill.embed")
    x = g.op("Add", [x, g.op("Gather", [wpe, g.const(np.arange(P, dtype=np.int64), "prompt_positions")],
                             name="prefill.pos")], name="prefill.add_pos")
    causal = np.where(np.tril(np.ones((P, P), bool)), 0.0, NEG).astype(np.float32)[None, None]
    causal_mask = g.const(causal, "causal_mask")
    pad = g.i64([0, 0, 0, 0, C - P, 0], "cache_pads")
    prefill_out: list[str] = []
    for i in range(c.layers):
        name = f"h{i}"
        h, k, v = _block_kv(g, x, d, name)
        for t, kind in ((k, "k"), (v, "v")):
            out = f"prefill_{kind}{i}"
            g.output(g.op("Pad", [t, pad], name=f"prefill.{name}.cache_{kind}"), out, FLOAT, [BATCH, C, d])
            prefill_out.append(out)
        if i == c.layers - 1:  # the last layer's keys and values are all the decoder needs of the prompt
            break
        a = attention(g, _query(g, h, d, name), k, v, causal_mask, d, n_heads, f"prefill.{name}.attn")
        x = g.op("Add", [x, g.linear(a, d, d, f"{name}.attn.out")], name=f"prefill.{name}.attn_res")
        x = g.op("Add", [x, feed_forward(g, g.layer_norm(x, d, f"{name}.ln2"), d, 4 * d, f"{name}.mlp", act="gelu")],
                 name=f"prefill.{name}.mlp_res")
    last_pos = g.op("Sub", [src_len, g.const(np.int64(1), "one_i")], name="prefill.last_pos")
    last_tok = g.op("GatherElements", [src, unsqueeze(g, last_pos, [1], "prefill.last_col")], name="prefill.last",
                    axis=1)
    g.output(g.op("Squeeze", [last_tok, g.i64([1], "axes")], name="prefill.last_sq"), "last_token", INT64, [BATCH])
    g.output(g.op("Identity", [last_pos], name="prefill.last_pos_out"), "last_pos", INT64, [BATCH])
    # ---------------- decoder step: one token per row, rows at different positions
    tok = g.input("dec_token", INT64, [BATCH], value_range=(0, c.vocab - 1))
    pos = g.input("dec_pos", INT64, [BATCH], value_range=(0, C - 1))
    caches = [(g.input(f"cache_k{i}", FLOAT, [BATCH, C, d]), g.input(f"cache_v{i}", FLOAT, [BATCH, C, d]))
              for i in range(c.layers)]
    y = g.op("Add", [g.op("Gather", [wte, tok], name="dec.embed"), g.op("Gather", [wpe, pos], name="dec.pos")],
             name="dec.add_pos")
    y = unsqueeze(g, y, [1], "dec.as_seq")  # [B, 1, D]
    state = []
    for i in range(c.layers):
        name = f"h{i}"
        hot = one_hot_rows(g, pos, C, f"dec.{name}.slot")
        mask = length_mask(g, pos, C, f"dec.{name}.mask", inclusive=True)
        h, k, v = _block_kv(g, y, d, name)
        k_all = write_slot(g, caches[i][0], g.op("Squeeze", [k, g.i64([1], "axes")], name=f"dec.{name}.k_sq"), hot,
                           f"dec.{name}.cache_k")
        v_all = write_slot(g, caches[i][1], g.op("Squeeze", [v, g.i64([1], "axes")], name=f"dec.{name}.v_sq"), hot,
                           f"dec.{name}.cache_v")
        for t, out in ((k_all, f"cache_k{i}_out"), (v_all, f"cache_v{i}_out")):
            g.output(t, out, FLOAT, [BATCH, C, d])  # emitted where computed: nothing waits until the end
            state.append(out)
        a = attention(g, _query(g, h, d, name), k_all, v_all, mask, d, n_heads, f"dec.{name}.attn")
        y = g.op("Add", [y, g.linear(a, d, d, f"{name}.attn.out")], name=f"dec.{name}.attn_res")
        y = g.op("Add", [y, feed_forward(g, g.layer_norm(y, d, f"{name}.ln2"), d, 4 * d, f"{name}.mlp", act="gelu")],
                 name=f"dec.{name}.mlp_res")
    y = g.op("Squeeze", [g.layer_norm(y, d, "ln_f"), g.i64([1], "axes")], name="dec.out_sq")
    logits = g.linear(y, d, c.vocab, "lm_head", bias=False)
    g.output(logits, "logits", FLOAT, [BATCH, c.vocab])
    g.output(g.op("ArgMax", [logits], name="dec.argmax", axis=1, keepdims=0), "next_token", INT64, [BATCH])
    g.output(g.op("Add", [pos, g.const(np.int64(1), "one_i")], name="dec.pos_next"), "dec_pos_out", INT64, [BATCH])
    seq2seq = {
        "encoder": {"runs": "once", "outputs": prefill_out + ["last_token", "last_pos"], "state": []},
        "decoder": {"outputs": ["logits", "next_token", "dec_pos_out"] + state,
                    "state": [{"input": "dec_token", "output": "next_token", "init_from": "last_token"},
                              {"input": "dec_pos", "output": "dec_pos_out", "init_from": "last_pos"}]
                    + [{"input": n[:-4], "output": n, "init_from": "prefill_" + n[len("cache_"):-4]}
                       for n in state]},
        "bind": [],
        "request_inputs": ["src_tokens", "src_len"],
        "token_output": "next_token", "logits_output": "logits",
        "start_token_id": 1, "end_token_id": 2, "max_length": c.max_output, "max_source_length": P,
        "kv_cache": {"length": C, "inputs": [n[:-4] for n in state], "position_input": "dec_pos"},
        "decoder_only": True,
        "length_histogram": "chat",
    }
    return g, seq2seq
