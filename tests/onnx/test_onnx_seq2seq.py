"""Seq2seq exports: decoder (and GNMT encoder) steps of requests at different timesteps batch together.

Each request is decoded alone, then again with requests arriving at staggered times so that every batched step
mixes rows at different positions; every row's logits must match its solo run.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lazybatch.onnx_tools.seq2seq import Seq2SeqRunner
from lazybatch.sessions.chain import StageChain


def _split(name: str, tmp_path: Path, cli) -> StageChain:
    assert cli("export", name, "--small", "--out", tmp_path / "m.onnx")[0] == 0
    assert cli("split", tmp_path / "m.onnx", "--out", tmp_path / "s")[0] == 0
    man = json.loads((tmp_path / "s" / "manifest.json").read_text())
    return StageChain(tmp_path / "s", man, whole=False)


def _requests(man: dict, n: int, rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    sec = man["seq2seq"]
    spec = {s["name"]: s for s in man["graph_inputs"]}
    out = []
    for _ in range(n):
        length = int(rng.integers(2, sec["max_source_length"] + 1))
        tokens = rng.integers(3, spec["src_tokens"]["range"][1] + 1, size=(1, sec["max_source_length"]))
        out.append({"src_tokens": tokens.astype(np.int64), "src_len": np.array([length], dtype=np.int64)})
    return out


def _solo(runner: Seq2SeqRunner, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    r = runner.start(inputs)
    while r.phase != "done":
        runner.step([r])
    return r.logits


@pytest.mark.parametrize("name", ["transformer", "gnmt", "gpt2"])
def test_rows_at_different_timesteps_batch_together(name: str, tmp_path: Path, cli) -> None:
    chain = _split(name, tmp_path, cli)
    runner = Seq2SeqRunner(chain)
    rng = np.random.default_rng(7)
    reqs_in = _requests(chain.manifest, 4, rng)
    solo = [_solo(runner, x) for x in reqs_in]
    arrivals = [0, 1, 3, 4]  # ticks at which requests arrive
    live, tick, mixed_steps = [], 0, 0
    started = [None] * len(reqs_in)
    while tick < 200 and (len(live) < len(reqs_in) or any(r.phase != "done" for r in live)):
        for i, t in enumerate(arrivals):
            if t == tick:
                started[i] = runner.start(reqs_in[i])
                live.append(started[i])
        for phase in ("encoder", "decoder"):
            group = [r for r in live if r.phase == phase]
            if group:
                steps = {(r.enc_done if phase == "encoder" else len(r.tokens)) for r in group}
                mixed_steps += len(group) > 1 and len(steps) > 1
                runner.step(group)
        tick += 1
    assert mixed_steps > 0, "the schedule should batch rows at different timesteps"
    for i, r in enumerate(started):
        assert r.phase == "done"
        assert len(r.logits) == len(solo[i])
        for a, b in zip(r.logits, solo[i]):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * max(1.0, float(np.abs(b).max())))


def test_seq2seq_manifest_section(tmp_path: Path, cli) -> None:
    chain = _split("gnmt", tmp_path, cli)
    man = chain.manifest
    sec = man["seq2seq"]
    n = len(man["stages"])
    assert sorted(sec["encoder"]["stages"] + sec["decoder"]["stages"]) == list(range(n))
    assert max(sec["encoder"]["stages"]) < min(sec["decoder"]["stages"])
    assert {man["stages"][k]["type"] for k in sec["encoder"]["stages"]} == {"ENCODER"}
    assert {man["stages"][k]["type"] for k in sec["decoder"]["stages"]} == {"DECODER"}
    ins = {s["name"] for s in man["graph_inputs"]}
    outs = {s["name"] for s in man["graph_outputs"]}
    for part in ("encoder", "decoder"):
        for s in sec[part]["state"]:
            assert s["input"] in ins and s["output"] in outs
    assert sec["decoder"]["state"][0] == {"input": "dec_token", "output": "next_token", "init": sec["start_token_id"]}
    assert [i["name"] for i in sec["served_inputs"]] == ["src_tokens", "src_len"]
    assert sec["served_outputs"][0]["name"] == "output_tokens"
    # top-level inputs are the graph's: every stage input from "model" is among them
    top = {i["name"] for i in man["inputs"]}
    assert all(i["name"] in top for st in man["stages"] for i in st["inputs"] if i["from"] == "model")


def test_decoder_lm_prefill_equals_token_by_token_decoding(tmp_path: Path, cli) -> None:
    """The prefill is an optimisation only: feeding the prompt through the decoder step one token at a time from an
    empty cache (the plain sequential greedy decode) gives the same tokens and logits as prefill + decoder."""
    chain = _split("gpt2", tmp_path, cli)
    runner = Seq2SeqRunner(chain)
    sec, man = runner.sec, chain.manifest
    assert sec["decoder_only"] and [s["init_from"] for s in sec["decoder"]["state"][:2]] == ["last_token", "last_pos"]
    assert {man["stages"][k]["type"] for k in sec["encoder"]["stages"]} == {"STATIC"}
    spec = {s["name"]: s for s in man["graph_inputs"]}
    dec_inputs = [s["input"] for s in sec["decoder"]["state"]]
    rng = np.random.default_rng(11)
    for n in (1, 2, sec["max_source_length"]):
        prompt = rng.integers(3, spec["src_tokens"]["range"][1] + 1, size=n)
        src = np.zeros((1, sec["max_source_length"]), np.int64)
        src[0, :n] = prompt
        fast = runner.start({"src_tokens": src, "src_len": np.array([n], np.int64)})
        while fast.phase != "done":
            runner.step([fast])
        state = {k: np.zeros([1] + spec[k]["dims"], spec[k]["dtype"]) for k in dec_inputs}
        tokens: list[int] = []
        logits: list[np.ndarray] = []
        feed = list(prompt)
        for pos in range(n - 1 + sec["max_length"]):
            state["dec_token"] = np.array([feed[pos] if pos < n else tokens[-1]], np.int64)
            state["dec_pos"] = np.array([pos], np.int64)
            env = dict(state)
            for k in sec["decoder"]["stages"]:
                chain.run_stage(k, env)
            state = {s["input"]: env[s["output"]] for s in sec["decoder"]["state"]}
            if pos >= n - 1:  # from the last prompt token on, the step's output is a generated token
                tokens.append(int(env["next_token"][0]))
                logits.append(env["logits"][0])
                if tokens[-1] == sec["end_token_id"]:
                    break
        assert fast.tokens == tokens, n
        for a, b in zip(fast.logits, logits):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * max(1.0, float(np.abs(b).max())))
