"""An EAGLE head in both engines. minispec's head and vLLM's EAGLE-1 (``EagleLlamaForCausalLM``) differ in layout, so
the shipped head cannot be handed to vLLM as it is (docs/VLLM.md, "EAGLE"). What is tested: the shipped head's
weights written in vLLM's layout (every part of it that maps exactly, folded in; the norms vLLM's layer lacks,
dropped), run by vLLM's ``eagle`` method, and the same head run by minispec's EAGLE loop (``EagleDraft`` through
``speculative_generate`` and ``Engine``) with a head module that computes what vLLM's does. Equal tokens and equal
per-position counts say that minispec's drafting loop (which target features, which tokens, when the draft reads
its own hidden state) is vLLM's.
"""

import json

import pytest
import torch
import torch.nn.functional as F
import vllm_lane as lane
from safetensors.torch import save_file

import minispec
from minispec.drafts.eagle import EagleConfig, EagleDraft, EagleModel
from minispec.model.llama import Block, rotate

pytestmark = pytest.mark.vllm

N, NEW = 8, 48


class _NoInputNorm(Block):
    """vLLM's EAGLE-1 layer: a Llama decoder layer whose input RMSNorm is removed (``disable_input_layernorm`` for
    layer 0 in vllm/model_executor/models/llama_eagle.py); Block.forward without its first line's norm."""

    def forward(self, x, cos, sin, masks, cache):
        B, T, C = x.shape
        q, k, v = self.wqkv(x).split([self.H * self.D, self.K * self.D, self.K * self.D], -1)
        q = rotate(q.view(B, T, self.H, self.D).transpose(1, 2), cos, sin)  # (B, H, T, D)
        k = rotate(k.view(B, T, self.K, self.D).transpose(1, 2), cos, sin)  # (B, K, T, D)
        v = v.view(B, T, self.K, self.D).transpose(1, 2)  # (B, K, T, D)
        if getattr(cache, "attends", False):  # the engine's paged cache
            y = cache.attend(self.layer, q, k, v, self.window)  # (B, H, T, D)
        else:
            if cache is not None:
                k, v = cache.update(self.layer, k, v)  # (B, K, S', D) each
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=masks[self.window],
                                               enable_gqa=self.H != self.K)  # (B, H, T, D)
        x = x + self.wo(y.transpose(1, 2).reshape(B, T, self.H * self.D))  # (B, T, C)
        gate, up = self.w13(F.rms_norm(x, (C,), self.mlp_norm, self.eps)).chunk(2, -1)  # (B, T, F) each
        return x + self.w2(F.silu(gate) * up)  # (B, T, C)


class VllmEagle1Head(EagleModel):
    """What vLLM's EagleLlamaForCausalLM computes, on minispec's EAGLE loop: fc over [its own embedding of x_{t+1},
    the target's final-normed hidden state at t] (the draft's own raw hidden state at later draft positions), one
    layer without an input norm, and logits from the target's LM head with no norm before it."""

    def __init__(self, cfg: EagleConfig, final_norm: torch.Tensor, embed: torch.Tensor):
        super().__init__(cfg)
        self.layer = _NoInputNorm(cfg.layer, 0)
        self.register_buffer("final_norm", final_norm)  # (C,) the target's final norm (vLLM's feature is after it)
        self.register_buffer("own_embed", embed)  # (V, C)

    def fuse(self, emb, g, from_target):
        C, eps = emb.shape[-1], self.config.layer.rms_norm_eps
        e = F.embedding(self._tokens, self.own_embed)  # (B, T, C) vLLM's embed_tokens of the draft's own
        f = F.rms_norm(g, (C,), self.final_norm, eps) if from_target else g  # (B, T, C)
        return self.fc(torch.cat([e, f], -1))  # (B, T, C)

    def logits(self, h, head):
        return F.linear(h, head)  # (B, T, V) the target's LM head (vLLM shares it: EAGLE-1 has none of its own)


def convert(target, out_dir):
    """The shipped tiny-code-eagle in vLLM's EAGLE-1 layout (out_dir, loadable as ``method: "eagle"``), and the same
    weights as a VllmEagle1Head for minispec. Exact folds: minispec normalises the token embedding (weightless RMS) ->
    its rows normalised once, as the head's own embed_tokens; minispec's feature is the pre-norm residual, normalised
    without weight -> vLLM's is normalised with the target's final-norm weight w, so fc's feature half is divided by w;
    the layer's input-norm weight -> into q, k, v. Not exact, so this is another head: the per-position RMS of the
    layer's input; the head's final norm, weight and RMS (vLLM's EAGLE-1 has no norm there, and no LM head of its own
    to fold the weight into: it shares the target's); and the RMS normalisation of the draft's own hidden state fed
    back at later draft positions (vLLM feeds it raw)."""
    src = EagleDraft.from_pretrained("tiny-code-eagle", target).model
    cfg, C, eps = src.config, target.config.hidden_size, target.config.rms_norm_eps
    w_final, E = target.norm.detach().clone(), target.embed.weight.detach().clone()  # (C,), (V, C)
    embed = F.rms_norm(E, (C,), None, eps)  # (V, C)
    fc = src.fc.weight.detach().clone()  # (C, 2C): [embedding half | feature half]
    fc[:, C:] = fc[:, C:] / w_final  # (C, C) reads w * x / rms(x) as minispec read x / rms(x)
    wqkv = src.layer.wqkv.weight.detach() * src.layer.attn_norm.detach()  # ((H+2K) D, C)
    H, K, D = cfg.layer.num_attention_heads, cfg.layer.num_key_value_heads, cfg.layer.head_dim
    q, k, v = wqkv.split([H * D, K * D, K * D], 0)
    gate, up = src.layer.w13.weight.detach().chunk(2, 0)
    state = {"fc.weight": fc, "embed_tokens.weight": embed,
             "layers.0.self_attn.q_proj.weight": q, "layers.0.self_attn.k_proj.weight": k,
             "layers.0.self_attn.v_proj.weight": v, "layers.0.self_attn.o_proj.weight": src.layer.wo.weight.detach(),
             "layers.0.mlp.gate_proj.weight": gate, "layers.0.mlp.up_proj.weight": up,
             "layers.0.mlp.down_proj.weight": src.layer.w2.weight.detach(),
             "layers.0.post_attention_layernorm.weight": src.layer.mlp_norm.detach()}
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({n: t.contiguous().float() for n, t in state.items()}, str(out_dir / "model.safetensors"),
              metadata={"format": "pt"})
    layer = cfg.layer.to_hf_dict() | {"tie_word_embeddings": False}
    (out_dir / "config.json").write_text(json.dumps(layer, indent=2))

    model = VllmEagle1Head(cfg, w_final, embed)
    own = {k: v for k, v in src.state_dict().items()}
    own |= {"fc.weight": fc, "layer.wqkv.weight": wqkv, "final_norm": w_final, "own_embed": embed}
    model.load_state_dict(own)
    return out_dir, model.eval().requires_grad_(False)


class _Draft(EagleDraft):
    """EagleDraft with VllmEagle1Head: its fuse needs the tokens, not only their target embeddings."""

    def __init__(self, target, model):
        super().__init__(target, model)
        model_embed = self.embed

        def embed(tokens):
            model._tokens = tokens
            return model_embed(tokens)

        self.embed = embed


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    target = minispec.load("tiny-code-target")[0]
    path, model = convert(target, tmp_path_factory.mktemp("vllm-eagle1"))
    return target, path, model


@pytest.mark.parametrize("k", [3])
def test_an_eagle1_head_accepts_the_same_tokens_in_both_engines(heads, llms, k):
    target, path, model = heads
    llm = llms.get(**lane.PAIR, speculative_config={"method": "eagle", "model": str(path), "num_speculative_tokens": k})
    prompts = lane.heldout(N)
    tokens, v = lane.generate(llm, prompts, NEW)
    assert tokens == minispec.generate(target, prompts, max_new_tokens=NEW).tokens
    assert 0 < v["accepted_tokens"] < v["draft_tokens"], v
    draft = _Draft(target, model)
    out = minispec.speculative_generate(target, draft, prompts, gamma=k, max_new_tokens=NEW)
    engine = minispec.Engine(target, draft, gamma=k)
    served = engine.run([minispec.Request(p, max_new_tokens=NEW) for p in prompts])
    assert out.tokens == tokens and [o.tokens for o in served] == tokens
    want = (v["num_drafts"], v["accepted_per_position"])
    for s in (out.stats, engine.stats):
        assert (s.num_drafts, list(s.accepted_per_position) + [0] * (k - len(s.accepted_per_position))) == want
