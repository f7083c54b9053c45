"""A GNMT-like LSTM encoder-decoder with attention, exported as an encoder step and a decoder step.

Both run once per token, so the scheduler's ENCODER and DECODER loops map onto them directly (Algorithm 1's
enc_timesteps and dec_timesteps). The encoder step reads source token ``src_tokens[b, enc_pos[b]]``, advances its
LSTM stack and writes the top hidden state into slot ``enc_pos[b]`` of a fixed-size memory; rows at different
positions batch together. The decoder step is Luong-style: stacked LSTM (input feeding of the previous attentional
vector), global attention over the memory masked to the source length, then the output projection.
GNMT proper has a bidirectional first encoder layer and 8+8 layers; this keeps 4+4 unidirectional layers with
residual connections from the third layer on, hidden size 1024, vocabulary 32000 and 80 tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..builder import FLOAT, INT64, GraphBuilder
from .layers import length_mask, lstm_cell, one_hot_rows, unsqueeze, write_slot

BATCH = "batch"


def gnmt(seed: int = 0, small: bool = False) -> tuple[GraphBuilder, dict[str, Any]]:
    n_layers, d, vocab, max_len = (2, 16, 50, 8) if small else (4, 1024, 32000, 80)
    g = GraphBuilder("gnmt_small" if small else "gnmt", seed)
    # ---------------- encoder step
    src = g.input("src_tokens", INT64, [BATCH, max_len], value_range=(0, vocab - 1))
    pos = g.input("enc_pos", INT64, [BATCH], value_range=(0, max_len - 1))
    mem = g.input("enc_memory", FLOAT, [BATCH, max_len, d])
    enc_state = [(g.input(f"enc_h{i}", FLOAT, [BATCH, d]), g.input(f"enc_c{i}", FLOAT, [BATCH, d]))
                 for i in range(n_layers)]
    tok = g.op("GatherElements", [src, unsqueeze(g, pos, [1], "enc.pos_col")], name="enc.token", axis=1)
    tok = g.op("Squeeze", [tok, g.i64([1], "axes")], name="enc.token_sq")
    x = g.op("Gather", [g.weight("encoder.embedding", [vocab, d], fan_in=1, gain=0.1), tok], name="enc.embed")
    enc_out = []
    for i, (h, c) in enumerate(enc_state):
        h2, c2 = lstm_cell(g, x, h, c, d, d, f"enc{i}")
        enc_out += [(h2, f"enc_h{i}_out"), (c2, f"enc_c{i}_out")]
        g.output(h2, f"enc_h{i}_out", FLOAT, [BATCH, d])
        g.output(c2, f"enc_c{i}_out", FLOAT, [BATCH, d])
        x = g.op("Add", [x, h2], name=f"enc{i}.residual") if i >= 2 else h2
    mem2 = write_slot(g, mem, x, one_hot_rows(g, pos, max_len, "enc.slot"), "enc.memory")
    g.output(mem2, "enc_memory_out", FLOAT, [BATCH, max_len, d])
    g.output(g.op("Add", [pos, g.const(np.int64(1), "one_i")], name="enc.pos_next"), "enc_pos_out", INT64, [BATCH])
    # ---------------- decoder step
    dtok = g.input("dec_token", INT64, [BATCH], value_range=(0, vocab - 1))
    feed = g.input("dec_feed", FLOAT, [BATCH, d])
    dmem = g.input("dec_memory", FLOAT, [BATCH, max_len, d])
    src_len = g.input("src_len", INT64, [BATCH], value_range=(1, max_len))
    dec_state = [(g.input(f"dec_h{i}", FLOAT, [BATCH, d]), g.input(f"dec_c{i}", FLOAT, [BATCH, d]))
                 for i in range(n_layers)]
    y = g.op("Gather", [g.weight("decoder.embedding", [vocab, d], fan_in=1, gain=0.1), dtok], name="dec.embed")
    y = g.op("Concat", [y, feed], name="dec.input_feed", axis=1)
    dec_out = []
    for i, (h, c) in enumerate(dec_state):
        h2, c2 = lstm_cell(g, y, h, c, 2 * d if i == 0 else d, d, f"dec{i}")
        dec_out += [(h2, f"dec_h{i}_out"), (c2, f"dec_c{i}_out")]
        g.output(h2, f"dec_h{i}_out", FLOAT, [BATCH, d])
        g.output(c2, f"dec_c{i}_out", FLOAT, [BATCH, d])
        y = g.op("Add", [y, h2], name=f"dec{i}.residual") if i >= 2 else h2
    # attention (Luong "general"): score[b, s] = mem[b, s] . (W y[b]), masked to the source length
    q = unsqueeze(g, g.linear(y, d, d, "attn.query", bias=False), [2], "attn.q_col")
    score = g.op("Squeeze", [g.op("MatMul", [dmem, q], name="attn.score"), g.i64([2], "axes")], name="attn.sq")
    mask = g.op("Squeeze", [length_mask(g, src_len, max_len, "attn.mask"), g.i64([1, 2], "axes")], name="attn.mask_sq")
    p = g.op("Softmax", [g.op("Add", [score, mask], name="attn.masked")], name="attn.softmax", axis=-1)
    ctx = g.op("MatMul", [unsqueeze(g, p, [1], "attn.p_row"), dmem], name="attn.context")
    ctx = g.op("Squeeze", [ctx, g.i64([1], "axes")], name="attn.ctx_sq")
    att = g.op("Tanh", [g.linear(g.op("Concat", [ctx, y], name="attn.concat", axis=1), 2 * d, d, "attn.combine",
                                 bias=False)], name="attn.tanh")
    logits = g.linear(att, d, vocab, "generator")
    g.output(logits, "logits", FLOAT, [BATCH, vocab])
    g.output(g.op("ArgMax", [logits], name="dec.argmax", axis=1, keepdims=0), "next_token", INT64, [BATCH])
    g.output(att, "dec_feed_out", FLOAT, [BATCH, d])
    enc_states = [{"input": "enc_pos", "output": "enc_pos_out", "init": 0},
                  {"input": "enc_memory", "output": "enc_memory_out", "init": 0.0}]
    enc_states += [{"input": n[:-4], "output": n, "init": 0.0} for _, n in enc_out]
    seq2seq = {
        "encoder": {"runs": "per_token", "steps_input": "src_len",
                    "outputs": ["enc_memory_out", "enc_pos_out"] + [n for _, n in enc_out], "state": enc_states},
        "decoder": {"outputs": ["logits", "next_token", "dec_feed_out"] + [n for _, n in dec_out],
                    "state": [{"input": "dec_token", "output": "next_token", "init": "start_token_id"},
                              {"input": "dec_feed", "output": "dec_feed_out", "init": 0.0}]
                    + [{"input": n[:-4], "output": n, "init": 0.0} for _, n in dec_out]},
        "bind": [{"input": "dec_memory", "encoder_output": "enc_memory_out"},
                 {"input": "src_len", "request_input": "src_len"}],
        "request_inputs": ["src_tokens", "src_len"],
        "token_output": "next_token", "logits_output": "logits",
        "start_token_id": 1, "end_token_id": 2, "max_length": max_len, "max_source_length": max_len,
    }
    return g, seq2seq
