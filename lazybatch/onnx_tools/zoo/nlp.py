"""BERT-base encoder and a Transformer (base) encoder-decoder with a bounded key/value cache.

The Transformer exports as one ONNX file holding two disconnected graphs: the encoder (runs once per request over
the padded source) and the decoder step (runs once per output token). The decoder step reads and writes a
key/value cache of fixed length ``max_length`` per layer; each row carries its own position ``dec_pos``, so rows at
different timesteps run in one batch (the write is a one-hot Where, attention masks slots after the position).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..builder import FLOAT, INT64, GraphBuilder
from .layers import (attention, feed_forward, length_mask, one_hot_rows, residual_ln,
                     self_attention_block, unsqueeze, write_slot)

BATCH = "batch"


def _positional(n: int, d: int) -> np.ndarray:
    pos = np.arange(n)[:, None]
    i = np.arange(d)[None, :]
    angle = pos / np.power(10000.0, (2 * (i // 2)) / d)
    return np.where(i % 2 == 0, np.sin(angle), np.cos(angle)).astype(np.float32)


def bert(seed: int = 0, small: bool = False, *, seq_len: int | None = None, layers: int | None = None
         ) -> GraphBuilder:
    """BERT-base: 12 layers, hidden 768, 12 heads, FFN 3072, sequence 128 (small: 2 layers, hidden 32, seq 16).

    ``seq_len`` / ``layers`` override the sequence length and depth (batching gains depend on both: at short
    sequences the per-token matrix products are thin and batching requests pays, the regime benchmarks need)."""
    n_layers, d, n_heads, d_ff, seq, vocab = (2, 32, 2, 64, 16, 100) if small else (12, 768, 12, 3072, 128, 30522)
    layers = n_layers if layers is None else layers
    seq = seq if seq_len is None else seq_len
    if layers < 1 or seq < 1:
        raise ValueError(f"bert needs layers >= 1 and seq_len >= 1, got layers={layers}, seq_len={seq}")
    g = GraphBuilder("bert_small" if small else "bert_base", seed)
    ids = g.input("input_ids", INT64, [BATCH, seq], value_range=(0, vocab - 1))
    am = g.input("attention_mask", INT64, [BATCH, seq], value_range=(0, 1))
    x = g.op("Gather", [g.weight("embeddings.word", [vocab, d], fan_in=1, gain=0.02 ** 2 * 100), ids],
             name="embeddings.gather")
    x = g.op("Add", [x, g.weight("embeddings.position", [seq, d], fan_in=1, gain=0.02 ** 2 * 100)],
             name="embeddings.add_pos")
    x = g.layer_norm(x, d, "embeddings.ln")
    for i in range(layers):
        name = f"layer{i}"
        m = g.op("Cast", [am], name=f"{name}.mask.cast", to=1)
        m = g.op("Mul", [g.op("Sub", [g.const(np.float32(1.0), "one_f"), m], name=f"{name}.mask.invert"),
                         g.const(np.float32(-10000.0), "neg10k")], name=f"{name}.mask.scale")
        m = unsqueeze(g, m, [1, 2], f"{name}.mask.unsqueeze")
        x = residual_ln(g, x, self_attention_block(g, x, m, d, n_heads, f"{name}.attn"), d, f"{name}.attn")
        x = residual_ln(g, x, feed_forward(g, x, d, d_ff, f"{name}.ffn", act="gelu"), d, f"{name}.ffn")
    g.output(x, "last_hidden_state", FLOAT, [BATCH, seq, d])
    cls = g.op("Gather", [x, g.const(np.int64(0), "zero_i")], name="pooler.cls", axis=1)
    pooled = g.op("Tanh", [g.linear(cls, d, d, "pooler.dense")], name="pooler.tanh")
    g.output(pooled, "pooler_output", FLOAT, [BATCH, d])
    return g


def transformer(seed: int = 0, small: bool = False) -> tuple[GraphBuilder, dict[str, Any]]:
    """Transformer base: 6+6 layers, d 512, 8 heads, FFN 2048, vocab 32000, max 80 tokens (small: 2+2, d 32)."""
    n_enc, n_dec, d, n_heads, d_ff, vocab, max_len = (
        (2, 2, 32, 2, 64, 50, 8) if small else (6, 6, 512, 8, 2048, 32000, 80))
    g = GraphBuilder("transformer_small" if small else "transformer", seed)
    scale = g.const(np.float32(math.sqrt(d)), "sqrt_d")
    pe = g.const(_positional(max_len, d), "positional")
    emb_gain = 1.0 / d  # embeddings ~ N(0, 1/d), times sqrt(d) -> unit variance
    # ---------------- encoder: runs once over the padded source
    src = g.input("src_tokens", INT64, [BATCH, max_len], value_range=(0, vocab - 1))
    src_len = g.input("src_len", INT64, [BATCH], value_range=(1, max_len))
    x = g.op("Gather", [g.weight("encoder.embedding", [vocab, d], fan_in=1, gain=emb_gain), src], name="enc.embed")
    x = g.op("Add", [g.op("Mul", [x, scale], name="enc.embed_scale"), pe], name="enc.add_pos")
    for i in range(n_enc):
        name = f"enc{i}"
        m = length_mask(g, src_len, max_len, f"{name}.mask")
        x = residual_ln(g, x, self_attention_block(g, x, m, d, n_heads, f"{name}.attn"), d, f"{name}.attn")
        x = residual_ln(g, x, feed_forward(g, x, d, d_ff, f"{name}.ffn"), d, f"{name}.ffn")
    g.output(x, "enc_memory", FLOAT, [BATCH, max_len, d])
    # ---------------- decoder step: one token per row, rows at different positions
    tok = g.input("dec_token", INT64, [BATCH], value_range=(0, vocab - 1))
    pos = g.input("dec_pos", INT64, [BATCH], value_range=(0, max_len - 1))
    mem = g.input("dec_memory", FLOAT, [BATCH, max_len, d])
    dsrc_len = g.input("dec_src_len", INT64, [BATCH], value_range=(1, max_len))
    caches = []
    for i in range(n_dec):
        caches.append((g.input(f"cache_k{i}", FLOAT, [BATCH, max_len, d]),
                       g.input(f"cache_v{i}", FLOAT, [BATCH, max_len, d])))
    y = g.op("Gather", [g.weight("decoder.embedding", [vocab, d], fan_in=1, gain=emb_gain), tok], name="dec.embed")
    y = g.op("Add", [g.op("Mul", [y, scale], name="dec.embed_scale"),
                     g.op("Gather", [pe, pos], name="dec.pos_gather")], name="dec.add_pos")
    y = unsqueeze(g, y, [1], "dec.as_seq")  # [B, 1, D]
    state = []
    for i in range(n_dec):
        name = f"dec{i}"
        hot = one_hot_rows(g, pos, max_len, f"{name}.slot")
        self_mask = length_mask(g, pos, max_len, f"{name}.self_mask", inclusive=True)
        q = g.linear(y, d, d, f"{name}.self.q")
        k_new = g.op("Squeeze", [g.linear(y, d, d, f"{name}.self.k"), g.i64([1], "axes")], name=f"{name}.k_sq")
        v_new = g.op("Squeeze", [g.linear(y, d, d, f"{name}.self.v"), g.i64([1], "axes")], name=f"{name}.v_sq")
        k_all = write_slot(g, caches[i][0], k_new, hot, f"{name}.cache_k")
        v_all = write_slot(g, caches[i][1], v_new, hot, f"{name}.cache_v")
        state += [(k_all, f"cache_k{i}_out"), (v_all, f"cache_v{i}_out")]
        for t, out_name in state[-2:]:  # emit outputs where they are computed: nothing waits until the end
            g.output(t, out_name, FLOAT, [BATCH, max_len, d])
        a = attention(g, q, k_all, v_all, self_mask, d, n_heads, f"{name}.self")
        y = residual_ln(g, y, g.linear(a, d, d, f"{name}.self.out"), d, f"{name}.self")
        cross_mask = length_mask(g, dsrc_len, max_len, f"{name}.cross_mask")
        a = attention(g, g.linear(y, d, d, f"{name}.cross.q"), g.linear(mem, d, d, f"{name}.cross.k"),
                      g.linear(mem, d, d, f"{name}.cross.v"), cross_mask, d, n_heads, f"{name}.cross")
        y = residual_ln(g, y, g.linear(a, d, d, f"{name}.cross.out"), d, f"{name}.cross")
        y = residual_ln(g, y, feed_forward(g, y, d, d_ff, f"{name}.ffn"), d, f"{name}.ffn")
    y = g.op("Squeeze", [y, g.i64([1], "axes")], name="dec.out_sq")
    logits = g.linear(y, d, vocab, "generator")
    g.output(logits, "logits", FLOAT, [BATCH, vocab])
    g.output(g.op("ArgMax", [logits], name="dec.argmax", axis=1, keepdims=0), "next_token", INT64, [BATCH])
    g.output(g.op("Add", [pos, g.const(np.int64(1), "one_i")], name="dec.pos_next"), "dec_pos_out", INT64, [BATCH])
    seq2seq = {
        "encoder": {"runs": "once", "outputs": ["enc_memory"], "state": []},
        "decoder": {"outputs": ["logits", "next_token", "dec_pos_out"] + [n for _, n in state],
                    "state": [{"input": "dec_token", "output": "next_token", "init": "start_token_id"},
                              {"input": "dec_pos", "output": "dec_pos_out", "init": 0}]
                    + [{"input": n[:-4], "output": n, "init": 0.0} for _, n in state]},
        "bind": [{"input": "dec_memory", "encoder_output": "enc_memory"},
                 {"input": "dec_src_len", "request_input": "src_len"}],
        "request_inputs": ["src_tokens", "src_len"],
        "token_output": "next_token", "logits_output": "logits",
        "start_token_id": 1, "end_token_id": 2, "max_length": max_len, "max_source_length": max_len,
        "kv_cache": {"length": max_len, "inputs": [n[:-4] for _, n in state], "position_input": "dec_pos"},
    }
    return g, seq2seq
