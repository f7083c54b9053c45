"""Building blocks shared by the NLP models: masks, multi-head attention, feed-forward, LSTM cell.

Masks are recomputed inside every layer from the graph's own inputs (src_len, attention_mask, positions) instead
of once at the top: the splitter cuts where few activations cross, and a mask built once and used by every layer
would cross every layer boundary. Recomputing a [B, T] comparison per layer costs next to nothing.
"""

from __future__ import annotations

import math

import numpy as np

from ..builder import GraphBuilder

NEG = -1e9


def arange(g: GraphBuilder, n: int) -> str:
    return g.const(np.arange(n, dtype=np.int64), f"arange{n}")


def unsqueeze(g: GraphBuilder, x: str, axes: list[int], name: str) -> str:
    return g.op("Unsqueeze", [x, g.i64(axes, "axes")], name=name)


def additive_mask(g: GraphBuilder, keep: str, name: str) -> str:
    """[B, T] bool (True = attend) -> [B, 1, 1, T] float additive mask (0 or -1e9)."""
    m = g.op("Where", [keep, g.const(np.float32(0.0), "zero_f"), g.const(np.float32(NEG), "neg_inf")],
             name=f"{name}.where")
    return unsqueeze(g, m, [1, 2], f"{name}.unsqueeze")


def length_mask(g: GraphBuilder, lengths: str, n: int, name: str, inclusive: bool = False) -> str:
    """Additive mask over n positions keeping position t < lengths (t <= lengths when inclusive)."""
    lens = unsqueeze(g, lengths, [1], f"{name}.len")
    keep = g.op("LessOrEqual" if inclusive else "Less", [arange(g, n), lens], name=f"{name}.cmp")
    return additive_mask(g, keep, name)


def heads(g: GraphBuilder, x: str, n_heads: int, d_head: int, name: str, perm: list[int]) -> str:
    """[B, T, D] -> [B, H, T, dh] (perm [0,2,1,3]) or [B, H, dh, T] (perm [0,2,3,1]); 0 keeps B and T symbolic."""
    y = g.op("Reshape", [x, g.i64([0, 0, n_heads, d_head])], name=f"{name}.split_heads")
    return g.op("Transpose", [y], name=f"{name}.transpose", perm=perm)


def attention(g: GraphBuilder, q: str, k: str, v: str, mask: str, d: int, n_heads: int, name: str) -> str:
    """Scaled dot-product attention over projected q [B,Tq,D], k/v [B,Tk,D]; returns [B,Tq,D]."""
    dh = d // n_heads
    qh = heads(g, q, n_heads, dh, f"{name}.q", [0, 2, 1, 3])
    kh = heads(g, k, n_heads, dh, f"{name}.k", [0, 2, 3, 1])
    vh = heads(g, v, n_heads, dh, f"{name}.v", [0, 2, 1, 3])
    s = g.op("MatMul", [qh, kh], name=f"{name}.scores")
    s = g.op("Mul", [s, g.const(np.float32(1.0 / math.sqrt(dh)), f"scale{dh}")], name=f"{name}.scale")
    s = g.op("Add", [s, mask], name=f"{name}.mask")
    p = g.op("Softmax", [s], name=f"{name}.softmax", axis=-1)
    c = g.op("MatMul", [p, vh], name=f"{name}.context")
    c = g.op("Transpose", [c], name=f"{name}.merge_transpose", perm=[0, 2, 1, 3])
    return g.op("Reshape", [c, g.i64([0, 0, d])], name=f"{name}.merge_heads")


def self_attention_block(g: GraphBuilder, x: str, mask: str, d: int, n_heads: int, name: str) -> str:
    q = g.linear(x, d, d, f"{name}.q")
    k = g.linear(x, d, d, f"{name}.k")
    v = g.linear(x, d, d, f"{name}.v")
    a = attention(g, q, k, v, mask, d, n_heads, name)
    return g.linear(a, d, d, f"{name}.out")


def gelu(g: GraphBuilder, x: str, name: str) -> str:
    """x * 0.5 * (1 + erf(x / sqrt 2)): BERT's exact GELU with opset-17 operators."""
    e = g.op("Erf", [g.op("Mul", [x, g.const(np.float32(1 / math.sqrt(2)), "inv_sqrt2")], name=f"{name}.div")],
             name=f"{name}.erf")
    e = g.op("Add", [e, g.const(np.float32(1.0), "one_f")], name=f"{name}.add")
    return g.op("Mul", [g.op("Mul", [x, e], name=f"{name}.mul"), g.const(np.float32(0.5), "half_f")],
                name=f"{name}.half")


def feed_forward(g: GraphBuilder, x: str, d: int, d_ff: int, name: str, act: str = "relu") -> str:
    h = g.linear(x, d, d_ff, f"{name}.fc1", gain=2.0)
    h = gelu(g, h, f"{name}.gelu") if act == "gelu" else g.op("Relu", [h], name=f"{name}.relu")
    return g.linear(h, d_ff, d, f"{name}.fc2")


def residual_ln(g: GraphBuilder, x: str, y: str, d: int, name: str) -> str:
    return g.layer_norm(g.op("Add", [x, y], name=f"{name}.residual"), d, f"{name}.ln")


def lstm_cell(g: GraphBuilder, x: str, h: str, c: str, d_in: int, d: int, name: str) -> tuple[str, str]:
    """One LSTM step: gates = x W + h U + b, split i, f, g, o; returns (h', c')."""
    # the recurrent product first: while it runs, x is still pending, so no cut can fall inside the cell
    hu = g.linear(h, d, 4 * d, f"{name}.u")
    gates = g.op("Add", [g.linear(x, d_in, 4 * d, f"{name}.w", bias=False), hu], name=f"{name}.gates")
    i, f, cand, o = g.op("Split", [gates, g.i64([d] * 4, "split")], n_out=4, name=f"{name}.split", axis=-1)
    i = g.op("Sigmoid", [i], name=f"{name}.i")
    f = g.op("Sigmoid", [f], name=f"{name}.f")
    o = g.op("Sigmoid", [o], name=f"{name}.o")
    cand = g.op("Tanh", [cand], name=f"{name}.g")
    c2 = g.op("Add", [g.op("Mul", [f, c], name=f"{name}.fc"), g.op("Mul", [i, cand], name=f"{name}.ig")],
              name=f"{name}.c")
    h2 = g.op("Mul", [o, g.op("Tanh", [c2], name=f"{name}.tanh_c")], name=f"{name}.h")
    return h2, c2


def one_hot_rows(g: GraphBuilder, pos: str, n: int, name: str) -> str:
    """[B] positions -> [B, n, 1] bool, True at each row's position (for writing one slot of a buffer)."""
    hit = g.op("Equal", [arange(g, n), unsqueeze(g, pos, [1], f"{name}.pos")], name=f"{name}.eq")
    return unsqueeze(g, hit, [2], f"{name}.unsqueeze")


def write_slot(g: GraphBuilder, buf: str, value: str, onehot: str, name: str) -> str:
    """buf [B, n, D] with row b's slot pos[b] replaced by value [B, D]: batches rows at different positions."""
    v = unsqueeze(g, value, [1], f"{name}.value")
    return g.op("Where", [onehot, v, buf], name=f"{name}.write")
