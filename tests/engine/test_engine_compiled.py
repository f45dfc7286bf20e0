"""``Engine(compile=True)``: the layers through ``torch.compile``, attention left opaque (minispec.engine.compiled)."""

import pytest
import torch
from test_engine_step import Passes

import minispec
from minispec.engine import Engine, Request
from minispec.engine import compiled as compiled_step
from minispec.engine.attention import PagedStep
from minispec.model.load import sample_text


@pytest.mark.parametrize("draft_kind", ["none", "model"])
def test_the_compiled_step_gives_the_eager_steps_tokens_acceptance_and_logits(draft_kind, monkeypatch):
    """Ragged prompts in chunks beside decoding rows and draft tokens: the compiled layers give the eager step's
    greedy tokens and acceptance, logits within float tolerance, and they, not the eager layers, ran: every layer
    attended through the opaque operator, in graphs built with the engine (the models are loaded afresh: compiling is
    in place)."""
    from torch._dynamo.utils import counters

    attend, through = PagedStep.attend, []

    def spied(self, *args):  # inside the opaque operator, not traced: whether the compiled graph called it
        through.append(compiled_step.CURRENT[0] is self)
        return attend(self, *args)

    monkeypatch.setattr(PagedStep, "attend", spied)

    text = sample_text("code")
    prompts = [list(text[300 * i: 300 * i + 20 + 11 * i]) for i in range(6)]
    runs = {}
    for compiled in (False, True):
        target, _ = minispec.load("tiny-code-target")
        draft = None if draft_kind == "none" else minispec.load("tiny-code-draft")[0]
        graphs = counters["stats"]["unique_graphs"]
        engine = Engine(target, draft, gamma=3, num_blocks=48, max_num_batched_tokens=32, compile=compiled)
        built = counters["stats"]["unique_graphs"] - graphs
        with Passes(target) as passes:
            outs = engine.run([Request(p, 12, arrival_s=0.002 * i) for i, p in enumerate(prompts)])
        assert built == 2 * compiled  # passes of several tokens and of one, built with the engine, not in a step
        assert counters["stats"]["unique_graphs"] - graphs == built
        assert through and set(through) == {compiled}
        through.clear()
        runs[compiled] = outs, engine.stats, passes.logits
    (e_out, e_stats, e_logits), (c_out, c_stats, c_logits) = runs[False], runs[True]
    assert [o.tokens for o in c_out] == [o.tokens for o in e_out]
    assert c_stats.accepted_per_position == e_stats.accepted_per_position
    assert sum(e_stats.accepted_per_position) or draft_kind == "none"
    assert len(c_logits) == len(e_logits)
    for a, b in zip(e_logits, c_logits):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_compile_must_be_a_bool():
    target, _ = minispec.load("tiny-code-target")
    with pytest.raises(ValueError, match="compile must be True or False"):
        Engine(target, compile="yes")


def test_the_compiled_passes_run_their_small_products_through_f_linear(monkeypatch):
    """Two rules send a product through F.linear, whose fixed cost is lower than oneDNN's packed call. The graph of
    one-token passes keeps the eager step's (:data:`~minispec.model.llama.PACKED_MIN_MACS`). The graph for every
    other token count cannot see the count without a guard on it; there a weight under
    :data:`~minispec.model.llama.PACKED_MIN_WEIGHT` elements runs through F.linear at every count. The embedded
    target's weights are all that small: no oneDNN call in either graph. A 576-wide model's (SmolLM2's width) are
    not, and its gate-and-up product is too large for the one-token rule: oneDNN's calls are its four products a
    layer in a pass of several tokens, one in a pass of one. A prompt's pass, then two decoding steps."""
    from torch.profiler import profile

    from tests.support import random_model

    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", max(16, torch._dynamo.config.recompile_limit))
    wide = random_model(seed=5, hidden=576, heads=9, kv_heads=3, layers=2, vocab=256)  # qkv 553k, o 332k, down 664k
    calls = {}
    for name, target in (("pair", minispec.load("tiny-code-target")[0]), ("wide", wide)):
        engine = Engine(target, compile=True)
        for rows in (1, 2):
            with profile() as prof:
                engine.run([Request(list(b"def f(x):"), 3) for _ in range(rows)])
            calls[name, rows] = sum(e.count for e in prof.key_averages() if e.key == "minispec::packed_linear")
    L = wide.config.num_hidden_layers
    assert calls == {("pair", 1): 0, ("pair", 2): 0,  # one row: its prompt's pass, then two of one token
                     ("wide", 1): 4 * L + 2 * L, ("wide", 2): 3 * 4 * L}  # two rows: three passes of two tokens or more
