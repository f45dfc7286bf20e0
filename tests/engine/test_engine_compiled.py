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


def test_a_one_token_pass_runs_its_small_products_as_the_eager_step_does():
    """The graph of one-token passes keeps the eager step's rule (:data:`~minispec.model.llama.PACKED_MIN_MACS`): a
    product that small runs through F.linear, whose fixed cost is lower than oneDNN's packed call; the embedded
    target's are all that small at one token. The graph for every other token count calls oneDNN for each layer's
    four products (the rule would put a guard on the count there). A prompt's pass, then two decoding steps."""
    from torch.profiler import profile

    target, _ = minispec.load("tiny-code-target")
    engine = Engine(target, compile=True)
    calls, products = {}, 4 * target.config.num_hidden_layers  # qkv, o, gate and up, down
    for rows in (1, 2):
        with profile() as prof:
            engine.run([Request(list(b"def f(x):"), 3) for _ in range(rows)])
        calls[rows] = sum(e.count for e in prof.key_averages() if e.key == "minispec::packed_linear")
    assert calls == {1: products, 2: 3 * products}
