"""The interview drill: its sections and index, each question folded with a lesson link, every number computed or cited.

A number the drill computes is recomputed below with minispec's own functions (or a short computation here) and must
appear, formatted as the drill writes it, in that question's block; every other decimal number in a block, and every
integer written with a unit ("330 requests/s", "104 rows"), must be one the question gives or one cited to a source
named in the same block. So the drill cannot drift from the code, integers included, and a number with no source
cannot slip in. The sections must come in the promised order, with the counts the index and their headings
state.
"""

import functools
import json
import math
import re
from pathlib import Path

import torch

from minispec import roofline as r
from minispec import serving
from minispec.decoding.sampling import SamplingParams, probabilities
from minispec.model.load import ASSETS
from minispec.roofline.hardware import H100_SXM, H200, Hardware

LESSONS = Path(__file__).parents[2] / "lessons"
DRILL = LESSONS / "interview_drill.md"
CARD = json.loads((ASSETS / "evaluation.json").read_text())["acceptance"]  # the embedded pair's model card
SECTIONS = ("Cost model", "Exactness", "Drafts", "Trees", "Engines", "Deployment")  # the promised order

# Public config.json files (Hugging Face): HuggingFaceTB/SmolLM2-135M-Instruct and SmolLM2-1.7B-Instruct.
SMOL_135M = dict(architectures=["LlamaForCausalLM"], hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                 num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=49152,
                 tie_word_embeddings=True, max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000)
SMOL_1_7B = dict(SMOL_135M, hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
                 num_key_value_heads=32, rope_theta=130000)
# meta-llama/Meta-Llama-3-8B: hidden 4096, FFN 14336, 8 KV heads of 128, vocabulary 128,256. An EAGLE-1 head is
# one decoder layer, the layer fusing feature and embedding (2 hidden -> hidden) and the LM head.
H, FF, KV, VOCAB, HOT = 4096, 14336, 8 * 128, 128256, 32000
EAGLE_LAYER = 2 * H * H + 2 * H * KV + 3 * H * FF + 2 * H + 2 * H * H  # attention, MLP, 2 norms, fusing layer
TP4 = Hardware("4x H100 SXM", 4 * H100_SXM.memory_bandwidth, 4 * H100_SXM.peak_flops, 4 * H100_SXM.memory_bytes)
# eugr/spark-vllm-docker#343: vLLM's per-position acceptance (share of drafts accepted through position i), MTP on
# Gemma-4 26B-A4B, measured in two runs.
MTP_K4, MTP_K2 = (0.844, 0.599, 0.385, 0.271), (0.766, 0.545)


def n(value, spec=".2f") -> str:
    return format(value, spec)


def never_breaks_even(**draft) -> int:
    """The least context (tokens per row) from which gamma 4 never breaks even, by bisection."""
    lo, hi = 0, 4096
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if r.break_even_batch(context=mid, **draft) == math.inf else (mid, hi)
    return hi


# Question 65: short chat (192 tokens of KV a row), a Llama-3.2-1B draft with its own KV, 128-token answers.
CHAT, ANSWER = dict(context=192, draft=r.LLAMA_1B), 128
CHAT_ROWS = min(1024, r.max_batch(H100_SXM, r.LLAMA_8B, 192 + ANSWER, r.LLAMA_1B))  # memory, and vLLM's max_num_seqs


def chat_tpot(B: int, gamma: int) -> float:
    """Seconds per output token of a row at batch B: a plain step, or a speculative step over its E tokens."""
    if gamma == 0:
        return r.step_time(B, 1, context=CHAT["context"])
    return r.speculative_step_time(B, gamma, **CHAT) / r.expected_tokens(0.8, gamma)


def capacity(slo_s: float, policy) -> float:
    """Requests/s a steady batch serves with every row's TPOT within the SLO: max over B of B / (answer x TPOT(B))
    (Little's law), over the batches whose TPOT meets it; ``policy(B)`` is the gamma at batch B (0 = plain)."""
    rates = (B / (ANSWER * chat_tpot(B, policy(B))) for B in range(1, CHAT_ROWS + 1)
             if chat_tpot(B, policy(B)) <= slo_s)
    return max(rates, default=0.0)


def two_classes(K_easy: int, K_hard: int, B: int, easy=0.9, hard=0.5, c=0.05) -> float:
    """Speedup over plain of a batch of B rows, half accepting at ``easy`` and half at ``hard``, drafting K_easy and
    K_hard tokens (question 68): tokens per step over one verify of every row's tokens plus max(K) draft passes."""
    half = B // 2
    verify = r.step_time(1, half * (K_easy + 1) + half * (K_hard + 1))  # the weight matmuls see every token alike
    step = verify + max(K_easy, K_hard) * c * r.step_time(B, 1)
    tokens = half * (r.expected_tokens(easy, K_easy) + r.expected_tokens(hard, K_hard))
    return tokens / step / (B / r.step_time(B, 1))


def full_memory(context: int, draft=None) -> tuple[int, float]:
    """Question 15: rows and tokens/s of a server at the largest batch memory holds and vLLM runs (1,024)."""
    B = min(1024, r.max_batch(H100_SXM, r.LLAMA_8B, context, draft))
    if draft is None:
        return B, B / r.step_time(B, 1, context=context)
    return B, B * r.expected_tokens(0.8, 4) / r.speculative_step_time(B, 4, context=context, draft=draft)


@functools.cache
def computed() -> dict[int, list[str]]:
    """Question -> the numbers its answer derives, recomputed with minispec and formatted as the drill prints them."""
    E, lev = r.expected_tokens(0.8, 4), r.leviathan_speedup
    rates = [0.8 ** i for i in range(1, 5)]  # per-position acceptance, i.i.d. alpha 0.8
    p, q = (0.6, 0.3, 0.1), (0.3, 0.3, 0.4)
    beta = sum(map(min, p, q))
    wrong = [min(a, b) + (1 - beta) * a for a, b in zip(p, q)]  # resampled from p after a rejection
    code, prose = CARD["tiny-code-draft"]["code"], CARD["tiny-prose-draft"]["code"]
    g_prose, g_code = r.best_gamma(1, prose["greedy_match"]), r.best_gamma(1, code["greedy_match"])
    ridge = H100_SXM.ridge
    c1b = r.modelled_draft_cost(1, r.LLAMA_1B)
    weights_only = r.max_batch(H100_SXM, r.LLAMA_8B, 4096, r.ModelShape(r.LLAMA_1B.params, 2))
    full, with_1b = r.max_batch(H100_SXM, r.LLAMA_8B, 4096), r.max_batch(H100_SXM, r.LLAMA_8B, 4096, r.LLAMA_1B)
    s135, s17 = r.ModelShape.from_config(SMOL_135M), r.ModelShape.from_config(SMOL_1_7B)
    c_smol = r.modelled_draft_cost(1, s135, model=s17)
    eagle = r.ModelShape.from_params(EAGLE_LAYER + VOCAB * H)
    hot = r.ModelShape.from_params(EAGLE_LAYER + HOT * H)
    # Question 44: E from the per-position profiles; K = 2 against K = 4 at a draft pass costing c = 0.05.
    k4, k2 = serving.conditional(MTP_K4), serving.conditional(MTP_K2)  # the rate given the positions before
    E4, E2 = serving.expected_tokens(k4, 4), serving.expected_tokens(k2, 2)
    k_speedup = lambda B, Ek, K: Ek * r.step_time(B, 1) / (r.step_time(B, K + 1) + K * 0.05 * r.step_time(B, 1))
    k2_wins = next(B for B in range(1, 1000) if k_speedup(B, E2, 2) > k_speedup(B, E4, 4))
    never = never_breaks_even()
    w4 = r.quantized(r.LLAMA_8B, 4)
    mix = r.MIXTRAL_8X7B
    c_tp = r.step_time(1, 1, H100_SXM, r.LLAMA_1B) / r.step_time(1, 1, TP4)
    g_tp = r.best_gamma(1, draft_cost=c_tp)
    chat = dict(context=192, draft=r.LLAMA_1B)  # short chat, a Llama-3.2-1B draft with its own KV (questions 64-65)
    t256, s256 = r.step_time(256, context=192), r.speculative_step_time(256, **chat)
    tree16 = r.tree_speedup_table([16])[0]  # the best tree at batch 16 (question 50)
    trees = r.tree_speedup_table(range(1, 300))
    tree_falls_back = (next(x["batch"] for x in trees if x["chain"]),  # a chain from, plain decoding from
                       next(x["batch"] for x in trees if not x["budget"]))
    table = r.vllm_speculative_config()["num_speculative_tokens_per_batch_size"]
    overlap = sum(map(min, (0.6, 0.4), (0.9, 0.1)))  # question 25: sampled acceptance of a greedily agreeing pair
    logits = torch.tensor((0.5, 0.3, 0.2)).log()  # (3,) a model's logits for p = (0.5, 0.3, 0.2)
    warped = probabilities(logits, SamplingParams(temperature=1.0, top_p=0.7)).tolist()  # question 26: top-p 0.7
    entropy = -sum(x * math.log(x) for x in p)  # question 30: Medusa's typical-acceptance threshold
    kv8b = r.LLAMA_8B.kv_bytes_per_token  # bytes per token of Llama-3-8B's KV cache (questions 51-52)
    words = math.ceil(r.LLAMA_8B.vocab / 32)  # question 57: 32-bit words in one grammar bitmask
    budget, rows = 8192, 256  # question 55: a token budget and the decoding rows it carries
    # New in the drill's fourth edition.
    reached = Hardware("H100, 70 % / 90 %", 0.9 * H100_SXM.memory_bandwidth, 0.7 * H100_SXM.peak_flops,
                       H100_SXM.memory_bytes)  # question 5: the ceilings kernels reach
    prefill = {T: r.step_time(1, T) for T in (1, 4096)}
    crossover = next(T for T in range(1, 4097) if r.step_time(1, T) > prefill[1])  # question 11
    long_rows = r.max_batch(H100_SXM, r.LLAMA_8B, 32768)  # question 14: MagicDec, self-speculation at 32k
    magic = dict(context=32768, draft=r.LLAMA_8B, draft_kv_window=512)
    (b256, t256_plain), (_, t256_spec) = full_memory(256), full_memory(256, r.LLAMA_1B)
    (_, t4k_plain), (_, t4k_spec) = full_memory(4096), full_memory(4096, r.LLAMA_1B)
    fp8 = Hardware("H100, FP8", H100_SXM.memory_bandwidth, 2 * H100_SXM.peak_flops, H100_SXM.memory_bytes)
    w8 = r.quantized(r.LLAMA_8B, 8)
    residual = [max(0.0, a - b) for a, b in zip(p, q)]  # question 23: what is still owed after a rejection
    residual = [x / sum(residual) for x in residual]
    second = sum(map(min, residual, q))  # a second candidate from q, tested against the residual
    logits3 = torch.tensor((2.0, 1.0, 0.5))  # question 27: token 0 is in the history, repetition penalty 1.2
    penalised = torch.where(torch.arange(3) == 0, torch.where(logits3 > 0, logits3 / 1.2, logits3 * 1.2), logits3)
    medusa_head = H * H + H + VOCAB * H  # question 45: a residual block (weight and bias) and an LM head of its own
    lookahead = (5 + 5) * (4 - 1)  # question 46: (W + G)(N - 1) extra tokens per row, W = 5, N = 4, G = 5
    suffix_gamma = next(g for g in range(1, 100) if r.expected_tokens(0.9, g) > 5.3)  # question 36
    stage = r.ModelShape.from_params(r.LLAMA_8B.params / 4)  # question 62: a quarter of the layers per stage
    link = 50e9  # question 63: bytes/s of a 400 Gb/s link
    slos = (0.005, 0.0065, 0.008)  # question 65
    policies = {"plain": lambda B: 0, "gamma 4": lambda B: 4, "gated": lambda B: r.best_gamma(B, **CHAT)}
    caps = [n(capacity(slo, policies[k]), ".0f") for slo in slos for k in policies]
    classes = {B: (max(range(9), key=lambda K: two_classes(K, K, B)),
                   max(((a, b) for a in range(9) for b in range(9)), key=lambda k: two_classes(*k, B)))
               for B in (64, 128)}  # question 68: the best single K, the best K per class
    return {
        # Cost model
        1: [*(n(x, "g") for x in rates[1:]), n(E)],
        2: [n(1 + 4 * 0.05, ".1f"), n(lev(0.8, 4, 0.05)), n(E)],
        3: [*(n(x, "g") for x in rates[1:]), n(sum(rates)), n(sum(rates) / 4), n(1 + sum(rates))],
        4: [n(ridge, ".0f"), n(r.LLAMA_8B.weight_bytes / 1e9, ".0f"), n(1e3 * r.step_time(1))],
        6: [n(r.compute_bound_batch(), ".0f"), n(E - 4 * 0.05), n(4 * 0.05), n(r.break_even_batch(), ".0f"),
            *(n(r.speculative_speedup(B)) for B in (32, 64, 128, 256))],
        7: [n(H200.ridge, ".0f"), n(r.compute_bound_batch(hardware=H200), ".0f"),
            n(r.break_even_batch(hardware=H200), ".0f")],
        8: [str(r.best_gamma(1, a, gamma_max=32)) for a in (0.6, 0.8, 0.9)]
        + [str(r.best_gamma(1, 0.8, 32, c)) for c in (0.25, 0.01)] + [str(r.best_gamma(64))],
        9: [n((4 + 1) / E), n(4 / E), n(r.compute_bound_batch(), ".0f")],
        10: [n(r.LLAMA_1B.params / r.LLAMA_8B.params * 100, ".1f")],
        12: [n(r.expected_tokens(0.3, 4)), n(r.speculative_speedup(1, 0.3)), n(r.speculative_speedup(1, 0.3, 4, 0.25))],
        13: [n(r.speculative_speedup(256, context=4096)), n(r.speculative_speedup(256)), str(never), str(full),
             *(n(r.speculative_speedup(B, context=4096, draft=r.LLAMA_1B)) for B in (1, 64)),
             *(n(r.speculative_speedup(B, context=4096, draft=r.LLAMA_1B, draft_kv_window=512)) for B in (1, 64))],
        16: [n(r.break_even_batch(context=640, draft=r.LLAMA_1B), ".0f"),
             n(r.break_even_batch(context=640, draft=r.LLAMA_1B), ".1f"), n(r.break_even_batch(), ".0f"),
             str(r.max_batch(H100_SXM, r.LLAMA_8B, 640, r.LLAMA_1B)), n(r.LLAMA_1B.kv_bytes_per_token, ",.0f"),
             n(kv8b, ",.0f")],
        17: [n(r.compute_bound_batch(model=w4), ".1f"), n(r.break_even_batch(model=w4), ".0f"),
             n(0.05 * r.step_time(1) / r.step_time(1, model=w4), ".1f"), n(r.leviathan_speedup(0.8, 4, 0.2)),
             n(r.break_even_batch(model=w4, draft_cost=0.2), ".0f"),
             n(r.modelled_draft_cost(1, r.LLAMA_1B, model=w4)),
             n(r.speculative_speedup(1, model=w4, draft=r.LLAMA_1B))],
        19: [n(mix.moe.experts_touched(5), ".1f"), n(mix.weight_bytes_read(5) / mix.weight_bytes_read(1), ".1f"),
             n(r.speculative_speedup(1, model=mix)), n(r.speculative_speedup(16, model=mix))],
        20: [n(r.compute_bound_batch(hardware=TP4), ".0f"), n(r.break_even_batch(hardware=TP4), ".0f"),
             n(1e3 * r.step_time(1, 1, TP4)), n(c_tp), n(r.leviathan_speedup(0.8, 4, c_tp)), str(g_tp),
             n(r.leviathan_speedup(0.8, g_tp, c_tp))],
        # Exactness
        21: [n(beta, ".1f"), n(1 - beta, ".1f"), n(min(p[0], q[0]) + (1 - beta) * 1, ".1f")],
        22: [*(n(x) for x in wrong), n(0.5 * sum(abs(a - b) for a, b in zip(wrong, p)))],
        25: [n(overlap, ".1f"), n(code["greedy_match"]), n(code["overlap"])],
        26: [n(x, ".3f") for x in warped[:2]],
        30: [n(entropy), n(math.exp(-entropy)), n(0.3 * math.exp(-entropy)), n(min(0.09, 0.3 * math.exp(-entropy)))],
        # Drafts
        31: [n(prose["greedy_match"]), n(code["greedy_match"]), n(prose["overlap"]), n(code["overlap"]),
             n(lev(prose["greedy_match"], 4, 0.05)), str(g_prose), n(r.speculative_speedup(1, prose["greedy_match"],
                                                                                       g_prose)),
             str(g_code), n(r.speculative_speedup(1, code["greedy_match"], g_code))],
        33: [n(c1b, ".3f"), n(r.speculative_speedup(1, draft=r.LLAMA_1B))],
        34: [str(full), str(with_1b), str(full - weights_only), str(weights_only), str(weights_only - with_1b),
             str(r.max_batch(H100_SXM, r.LLAMA_8B, 4096, r.LLAMA_1B, draft_kv_window=512))],
        35: [n(r.speculative_speedup(1, 0, 4, 0)), n(r.step_time(64, 5) / r.step_time(64, 1)),
             n(r.speculative_speedup(64, 0, 4, 0))],
        37: [n(100 * 49152 * 576 / s135.params, ".0f")],
        38: [n(c_smol, ".3f"), n(100 * c_smol, ".0f"), n(r.speculative_speedup(1, model=s17, draft=s135)),
             str(SMOL_135M["num_hidden_layers"]), str(SMOL_1_7B["num_hidden_layers"])],
        40: [n(EAGLE_LAYER / 1e6, ".0f"), n(VOCAB * H / 1e6, ".0f"), n(100 * VOCAB * H / eagle.params, ".0f"),
             n(r.modelled_draft_cost(1, eagle), ".3f"), n(r.modelled_draft_cost(1, hot), ".3f")],
        41: [n(100 * (1 - HOT / VOCAB), ".0f")],
        42: [n(r.expected_tokens(0.85, 1)), n(r.expected_tokens(0.9, 1))],
        43: [n(x) for x in k4],
        44: [n(E4), n(E2), n(E4 - serving.expected_tokens(k4, 2)), n(k_speedup(1, E4, 4)), n(k_speedup(1, E2, 2)),
             n((E4 - E2) / (4 * E2 - 2 * E4)), str(k2_wins)],
        # Trees: T nodes per row verify T + 1 tokens, the root included (as lesson 11 counts them)
        48: [n(r.compute_bound_batch(), ".0f"), *(n(r.compute_bound_batch(gamma=T), ".1f") for T in (32, 64)),
             n(r.tree_step_time(64, 32) / r.step_time(64, 1))],
        49: [n(0.3 / 0.5, ".1f"), n(0.2 / 0.5, ".1f"), n(0.5 + 0.5 * 0.3 / 0.5, ".1f")],
        50: [str(16 * (32 + 1)), n(r.tree_step_time(16, 32) / r.step_time(16, 1)), n(tree16["tokens_per_step"]),
             n(tree16["speedup"]), *map(str, r.sglang_eagle_args(tree16["tree"]).values()),
             *map(str, tree_falls_back)],
        51: [n(kv8b, ",.0f"), n(4 * kv8b / 2**10, ".0f"), n(100 * 4 * kv8b / r.LLAMA_8B.weight_bytes, ".3f")],
        # Engines
        52: [n(kv8b, ",.0f"), n(4 * kv8b / 2**20, ".1f"), n(4096 * kv8b / 2**20, ".0f"), n(100 * 4 / 4096, ".1f")],
        54: [n(100 * 16 / 2048, ".1f")],
        55: [n(rows * 5, ",.0f"), n(budget - rows * 5, ",.0f"), n(budget - rows, ",.0f"), n(budget // 5, ",.0f")],
        56: [str(64 * 5), n(r.step_time(64, 5) / r.step_time(64, 1))],
        57: [n(r.LLAMA_8B.vocab, ",.0f"), n(4 * words, ",.0f"), n(5 * 4 * words, ",.0f")],
        58: [str(1 + 4)],
        60: [n(E)],
        # Deployment
        64: [n(r.speculative_speedup(1, draft=r.LLAMA_1B)), n(r.break_even_batch(**chat), ".0f"), n(1e3 * t256),
             n(256 / t256, ",.0f"), n(1e3 * s256), n(256 * E / s256, ",.0f"), n(r.speculative_speedup(256, **chat)),
             n(270 * 128, ",.0f")],
        65: [n(1e3 * s256), n(1e3 * s256 / E), n(100 * (1e3 * s256 / E - 8) / 8, ".0f"), n(1e3 * t256), *caps],
        67: [f"{K} up to batch {end}" if start == 1 else f"{K} from {start}" for start, end, K in table
             if K in (8, 4, 1, 0)] + [f"{start} to {end}" for start, end, K in table if K in (4, 1)],
        69: [n(1000 * (E - 1), ",.0f"), n(1000 * (E - 1) / 4000), n(1 + (E - 1))],
        70: [n(1e3 * r.step_time(1)), n(1e3 * r.speculative_step_time(1)), n(1e3 * r.speculative_step_time(1) / E),
             n(1 - 0.8, ".1f"), n(0.8 ** 4)],
        # New questions
        5: [n(reached.ridge, ".0f"), n(r.compute_bound_batch(hardware=reached), ".0f"),
            n(r.compute_bound_batch(), ".0f"), n(r.break_even_batch(), ".0f"),
            n(r.break_even_batch(hardware=reached), ".0f"),
            n(r.speculative_speedup(128)), n(r.speculative_speedup(128, hardware=reached)),
            n(r.speculative_speedup(1, hardware=reached))],
        11: [n(1e3 * prefill[1]), str(crossover - 1), str(crossover), n(1e3 * prefill[4096], ".1f"),
             n(100 * r.step_time(1, 128, model=r.LLAMA_1B) / r.step_time(1, 128), ".1f"),
             n(100 * r.step_time(1, 4096, model=r.LLAMA_1B) / prefill[4096], ".1f")],
        14: [str(long_rows), n(r.modelled_draft_cost(1, r.LLAMA_8B, context=32768, draft_kv_window=512)),
             n(r.speculative_speedup(1, **magic)), n(r.modelled_draft_cost(long_rows, r.LLAMA_8B, context=32768,
                                                                             draft_kv_window=512)),
             n(r.speculative_speedup(long_rows, **magic))],
        15: [n(r.max_batch(H100_SXM, r.LLAMA_8B, 256), ",.0f"), n(r.max_batch(H100_SXM, r.LLAMA_8B, 256, r.LLAMA_1B),
                                                                  ",.0f"),
             n(b256, ",.0f"), n(t256_spec / t256_plain), str(full), str(with_1b), n(t4k_spec / t4k_plain)],
        18: [n(fp8.ridge, ".0f"), n(r.compute_bound_batch(hardware=fp8, model=w8), ".0f"),
             n(r.break_even_batch(hardware=fp8, model=w8), ".0f"), n(1e3 * r.step_time(1, 1, fp8, w8)),
             n(1e3 * r.step_time(1)), n(r.compute_bound_batch(model=w8), ".0f"),
             n(r.break_even_batch(model=w8), ".0f")],
        23: [n(beta, ".1f"), *(n(x, "g") for x in residual), n(second, ".1f"), n(beta + (1 - beta) * second)],
        27: [*(n(x) for x in logits3.softmax(-1).tolist()), *(n(x) for x in penalised.softmax(-1).tolist())],
        28: [n(-math.log(p[0]))],
        32: [n(code["greedy_match"]), n(prose["greedy_match"]), n(lev(0.7, 4, 0.05)), n(lev(0.8, 4, 0.05))],
        36: [str(math.ceil(5.3) - 1), n(1 / (1 - 0.9), ".0f"), str(suffix_gamma)],
        45: [n(medusa_head / 1e6, ".0f"), n(4 * medusa_head / 1e9), n(100 * 4 * medusa_head / r.LLAMA_8B.params, ".0f"),
             n(r.modelled_draft_cost(1, r.ModelShape.from_params(4 * medusa_head)))],
        46: [str(lookahead), n(r.compute_bound_batch(gamma=lookahead), ".1f"), n(r.compute_bound_batch(), ".0f")],
        47: [n(lev(0.8, 8, 0.05)), n(r.expected_tokens(0.8, 8) / (1 + 0.05))],
        61: [n(r.speculative_speedup(64)), n(r.speculative_speedup(256))],
        62: [n(1e3 * r.step_time(1, 1, model=stage)), n(1e3 * r.step_time(1, 1, TP4)), n(1e3 * r.step_time(1)),
             n(r.compute_bound_batch(model=stage), ".0f")],
        63: [n(4096 * kv8b / 1e6, ".0f"), n(4096 * r.LLAMA_1B.kv_bytes_per_token / 1e6, ".0f"),
             n(1e3 * 4096 * kv8b / link, ".1f"), n(1e3 * 4096 * r.LLAMA_1B.kv_bytes_per_token / link, ".1f"),
             n(1e3 * r.step_time(1, 4096, model=r.LLAMA_1B), ".1f")],
        66: [n(256 / t256, ",.0f"), n(256 * E / s256, ",.0f")],
        68: [str(classes[64][0]), n(two_classes(classes[64][0], classes[64][0], 64)), *map(str, classes[64][1]),
             n(two_classes(*classes[64][1], 64)), str(classes[128][0]),
             n(two_classes(classes[128][0], classes[128][0], 128)), *map(str, classes[128][1]),
             n(two_classes(*classes[128][1], 128))],
        71: [n(r.break_even_batch(), ".0f"), n(r.break_even_batch(hardware=reached), ".0f"),
             n(r.break_even_batch(hardware=H200), ".0f"), n(r.speculative_speedup(1, 0.3)),
             n(r.speculative_speedup(1, 0.3, 4, 0.25)), str(never), str(never_breaks_even(draft=r.LLAMA_1B))],
    }


# Numbers the question itself sets (inputs), and numbers cited to a source named in the same block.
GIVEN = {1: {"0.8"}, 2: {"0.05"}, 3: {"0.59", "0.8"}, 4: {"3.35"}, 7: {"4.8"},
         8: {"0.05", "0.6", "0.8", "0.9", "0.25", "0.01"}, 10: {"1.24"}, 12: {"0.3", "0.25"}, 13: {"0.05"},
         16: {"0.05"}, 17: {"0.05"}, 20: set(), 21: {"0.6", "0.3", "0.1", "0.4"}, 22: {"0.6", "0.3", "0.1", "0.4"},
         25: {"0.6", "0.4", "0.9", "0.1"}, 26: {"0.7", "0.5", "0.3", "0.2"}, 30: {"0.09", "0.3", "0.6", "0.1", "0.5"},
         31: {"0.05"}, 33: {"0.05", "1.24", "0.155"}, 40: set(), 44: {"0.05"}, 49: {"0.5", "0.3", "0.2"},
         64: {"2.8"}, 65: {"6.5", "8.5"}, 69: {"1.0"},
         # new questions
         5: {"0.7", "0.9"}, 23: {"0.6", "0.3", "0.1", "0.4"}, 27: {"0.5", "1.0", "1.2", "2.0"},
         28: {"0.6", "0.3", "0.1", "0.4"}, 32: {"0.7"}, 36: {"0.9"}, 68: {"0.9", "0.5"}, 71: {"0.3", "0.25"}}
# Integers a question sets (a context, a batch, a shape), allowed beside a unit in its block (see ``quantities``).
GIVEN_INTEGERS = {5: {"128", "70"}, 11: {"4,096"}, 13: {"4096"}, 14: {"32,768"}, 15: {"256", "4,096", "70"},
                  16: {"640"}, 19: {"2", "8"}, 34: {"4096", "512"}, 37: {"49,152"}, 41: {"128,256"},
                  45: {"128,256", "4,096"}, 47: {"8"}, 48: {"1", "6"}, 50: {"16", "32"}, 51: {"16"}, 52: {"4,096"},
                  54: {"16"}, 56: {"64"}, 60: {"64"}, 61: {"64"}, 63: {"50"}, 64: {"128", "192", "256", "270"},
                  65: {"128", "256", "8"}, 66: {"256"}, 68: {"128"}}
CITED = {25: dict.fromkeys(("2.95", "3.82", "2.39", "3.39", "4.04", "4.65", "3.65", "4.26"), "arXiv 2406.16858"),
         30: {"1.0": "server_args.py"},
         35: {"2.8": "vLLM blog", "1.59": "Spec-Bench", "2.43": "Spec-Bench"},
         39: {"2.8": "arXiv 2502.05202"},
         40: {"2.29": "Spec-Bench", "3.61": "Spec-Bench"},
         42: {"1.8": "arXiv 2412.19437", "0.85": "arXiv 2412.19437"},
         44: dict.fromkeys((*map(str, MTP_K4), *map(str, MTP_K2), "55.6", "54.9", "210.0", "303.6"),
                           "spark-vllm-docker#343"),
         48: {"3.05": "arXiv 2406.16858", "4.26": "arXiv 2406.16858", "4.04": "arXiv 2402.12374"},
         54: dict.fromkeys(("1.29", "14.55", "18.77"), "vllm#19996") | {"97": "sglang#32459"},
         64: {"1.5": "vLLM blog", "1.4": "vLLM blog"},
         70: dict.fromkeys(("8.72", "292.29", "3.42", "3.20"), "sglang#12064"),
         36: {"5.3": "arXiv 2411.04975"}, 20: {"21": "sglang#6949"},
         45: dict.fromkeys(("1.78", "2.32", "2.29", "3.61"), "Spec-Bench"),
         46: {"1.8": "arXiv 2402.02057"}}
# The reference setting (roofline's defaults, allowed anywhere) and its two headline results, E and the batch-1
# speedup, which many answers start from (computed here, required where computed() lists them).
REFERENCE = {n(H100_SXM.memory_bandwidth / 1e12), n(H100_SXM.peak_flops / 1e12, ".0f"), "0.8", "0.05",
             n(r.expected_tokens(0.8, 4)), n(r.speculative_speedup(1))}
# The reference's integers: gamma and the gamma + 1 tokens a row verifies, the H100's GB, the usable share (%), TFLOP/s.
REFERENCE_INTEGERS = {"4", "5", n(H100_SXM.memory_bytes / 1e9, ".0f"), "90", n(H100_SXM.peak_flops / 1e12, ".0f")}
# A unit that makes an integer a claim (rows, requests/s, ms, ...): such an integer must be computed, given or cited.
UNITS = (r"(?:requests/s|req/s|tokens/s|tok/s|rows?|ms|MB|GB|KB|GiB|FLOP/byte|x\b|%|tokens|nodes|experts|layers|steps"
         r"|slots)")


def blocks(text: str) -> tuple[str, dict[int, str]]:
    """The introduction, and question number -> its block (question and answer)."""
    parts = re.split(r"^### (\d+)\. ", text, flags=re.M)
    return parts[0], {int(num): body for num, body in zip(parts[1::2], parts[2::2])}


def sections(text: str) -> list[tuple[str, str, int, list[int]]]:
    """(name, anchor, count its heading states, the question numbers under it) for each ``## Name (N questions)``."""
    heads = list(re.finditer(r'^<a id="([\w-]+)"></a>\n\n## (.+) \((\d+) questions\)$', text, flags=re.M))
    out = []
    for i, m in enumerate(heads):
        body = text[m.end():heads[i + 1].start() if i + 1 < len(heads) else len(text)]
        out.append((m[2], m[1], int(m[3]), [int(x) for x in re.findall(r"^### (\d+)\. ", body, flags=re.M)]))
    return out


def index(intro: str) -> list[tuple[str, str, int, int, int]]:
    """The index table's rows: (name, anchor, count, first, last)."""
    rows = re.findall(r"^\| \[(.+?)\]\(#([\w-]+)\) \| (\d+) \| (\d+)-(\d+) \|", intro, flags=re.M)
    return [(name, anchor, int(c), int(a), int(b)) for name, anchor, c, a, b in rows]


def found(number: str, block: str) -> bool:
    """``number`` appears in ``block`` as a whole number, not inside a longer one."""
    return re.search(rf"(?<![\d.,]){re.escape(number)}(?!\d|[.,]\d)", block) is not None


def decimals(block: str) -> set[str]:
    """Every number with a decimal point; arXiv ids, section numbers, 1e12-style constants and model names
    (Llama-3.2-1B, 1.24B) left out."""
    block = re.sub(r"arXiv\s+\d{4}\.\d{4,5}|§[\d.]+|\d+(\.\d+)?e\d+|\S*-\d+\.\d[\w.-]*|\d+(\.\d+)?B\b", "", block)
    return set(re.findall(r"(?<![\d.])\d+\.\d+(?![\d.]*\d)", block))


def quantities(block: str) -> set[str]:
    """Every integer written with a unit after it ("330 requests/s", "1,668 rows", "27 %"): the integers a reader
    takes as results. Issue and pull-request numbers, arXiv ids, dates and model names are left out."""
    block = re.sub(r"arXiv\s+\d{4}\.\d{4,5}|§[\d.]+|\d+(\.\d+)?e\d+|\S*-\d+\.\d[\w.-]*|\d+(\.\d+)?B\b|#\d+|"
                   r"\b(?:19|20)\d\d-\d\d-\d\d", "", block)
    return set(re.findall(rf"(?<![\d.,\w-])(\d{{1,3}}(?:,\d{{3}})+|\d+)(?![\d.,]\d) ?{UNITS}", block))


def problems(text: str) -> list[str]:
    """What is wrong with a drill: structure, sections, links, numbers not recomputed, numbers without a source."""
    intro, qs = blocks(text)
    out = [f"introduction: {x} is not a reference figure" for x in sorted(decimals(intro) - REFERENCE)]
    if "being written" in intro:
        out.append("introduction: says lessons are 'being written'")
    if sorted(qs) != list(range(1, len(qs) + 1)):
        out.append(f"questions are not numbered 1..{len(qs)}: {sorted(qs)}")
    found_sections = sections(text)
    if [s[0] for s in found_sections] != list(SECTIONS):
        out.append(f"sections are {[s[0] for s in found_sections]}, not {list(SECTIONS)}")
    for name, _, count, numbers in found_sections:
        if count != len(numbers):
            out.append(f"section {name}: its heading says {count} questions, it holds {len(numbers)}")
    if sum(len(s[3]) for s in found_sections) != len(qs):
        out.append("some questions are outside every section")
    expected = [(name, anchor, len(nums), nums[0], nums[-1]) for name, anchor, _, nums in found_sections if nums]
    if index(intro) != expected:
        out.append(f"the index {index(intro)} does not match the sections {expected}")
    numbers = computed()
    for i, block in qs.items():
        if not re.search(r"<details><summary>Answer</summary>\n\n.+</details>", block, re.S):
            out.append(f"question {i}: no folded answer (<details><summary>Answer</summary>, a blank line, </details>)")
        links = re.findall(r"\]\((\d\d_[\w]+\.ipynb)\)", block)
        if not links:
            out.append(f"question {i}: no link to the lesson that derives it")
        out += [f"question {i}: links to {x}, which does not exist" for x in links
                if not (LESSONS / x).is_file()]
        out += [f"question {i}: refers to question {x}, which does not exist"
                for x in re.findall(r"question (\d+)", block) if int(x) not in qs]
        mine = numbers.get(i, [])
        out += [f"question {i}: {x} (computed by minispec) is not in the answer" for x in mine if not found(x, block)]
        cited = CITED.get(i, {})
        out += [f"question {i}: {x} is cited to {src!r}, which the answer does not name" for x, src in cited.items()
                if src not in " ".join(block.split())]
        unknown = decimals(block) - set(mine) - set(cited) - GIVEN.get(i, set()) - REFERENCE
        out += [f"question {i}: {x} is neither computed, given nor cited" for x in sorted(unknown)]
        derived = {x for s in mine for x in re.findall(r"\d[\d,]*(?:\.\d+)?", s)}  # "4 up to batch 32": 4 and 32
        loose = quantities(block) - derived - set(cited) - GIVEN_INTEGERS.get(i, set()) - REFERENCE_INTEGERS
        out += [f"question {i}: the integer {x} is neither computed, given nor cited" for x in sorted(loose)]
    return out


def test_the_drill_is_consistent_with_the_code():
    assert problems(DRILL.read_text()) == []


def test_at_least_70_questions_covering_the_topics():
    text = DRILL.read_text()
    assert len(blocks(text)[1]) >= 70
    for topic in ("tree", "EAGLE", "MTP", "context", "Mixtral", "W4A16", "tensor parallelism", "SLO", "vLLM",
                  "lookahead", "prefix", "grammar", "batch-invariant", "tokenizer", "CUDA graphs", "temperature",
                  "Mamba", "ITL", "typical acceptance", "overlapped",
                  # issue 34's topics
                  "Medusa", "Hydra", "DistillSpec", "online speculative decoding", "SmartSpec", "TurboSpec",
                  "three meanings", "FP8", "W8A8", "MagicDec", "self-speculation", "Jacobi", "SuffixDecoding", "PARD",
                  "DFlash", "SpecTr", "block verification", "disaggregation", "pipeline parallelism",
                  "repetition_penalty", "logprobs", "n = 4"):
        assert topic.lower() in text.lower(), topic


def test_the_check_catches_a_drifted_number_an_unsourced_one_and_a_broken_link():
    text = DRILL.read_text()
    _, qs = blocks(text)
    drifted = text.replace(qs[6], qs[6].replace("= 187 rows", "= 188 rows"))
    assert any("question 6: 187 (computed" in p for p in problems(drifted))
    unsourced = text.replace(qs[2], qs[2].replace("2.80x", "2.80x (2.97x on a good day)"))
    assert "question 2: 2.97 is neither computed, given nor cited" in problems(unsourced)
    uncited = text.replace(qs[40], qs[40].replace("Spec-Bench measured", "A benchmark measured"))
    assert any("question 40: 3.61 is cited to 'Spec-Bench'" in p for p in problems(uncited))
    unlinked = text.replace(qs[3], qs[3].replace("(00_quickstart.ipynb)", "(00_quickstart_old.ipynb)"))
    assert "question 3: links to 00_quickstart_old.ipynb, which does not exist" in problems(unlinked)
    unfolded = text.replace(qs[21], qs[21].replace("<details><summary>Answer</summary>", "**Answer**"))
    assert any(p.startswith("question 21: no folded answer") for p in problems(unfolded))


def test_the_check_catches_integers_that_drift():
    """Integers are results too: a capacity copied from an old run, or a computed one edited, is caught."""
    text = DRILL.read_text()
    _, qs = blocks(text)
    edited = text.replace(qs[65], qs[65].replace("gated 316", "gated 317"))
    assert any(p.startswith("question 65: 316 (computed") for p in problems(edited))
    stale = text.replace(qs[65], qs[65].replace("holds 45 requests/s", "holds 12 requests/s"))
    assert "question 65: the integer 12 is neither computed, given nor cited" in problems(stale)
    assert quantities("1,668 rows, 330 requests/s, 27 %, vllm#19996, arXiv 2408.11049, Llama-3.2-1B, 3 of them") == {
        "1,668", "330", "27"}


def test_the_check_catches_a_tree_counted_without_its_root_and_a_stale_k2_profile():
    text = DRILL.read_text()
    _, qs = blocks(text)
    rootless = text.replace(qs[48], qs[48].replace("at 8.9", "at 9.2"))  # 295 / 32: the root forgotten
    assert "question 48: 9.2 is neither computed, given nor cited" in problems(rootless)
    assert any(p.startswith("question 48: 8.9 (computed") for p in problems(rootless))
    stale = text.replace(qs[44], qs[44].replace("2.31", "2.44"))  # K = 2 read off the K = 4 run's first two rates
    assert any(p.startswith("question 44: 2.31 (computed") for p in problems(stale))


def test_the_check_catches_sections_out_of_order_miscounted_or_missing_from_the_index():
    text = DRILL.read_text()
    miscounted = text.replace("## Trees (4 questions)", "## Trees (5 questions)")
    assert "section Trees: its heading says 5 questions, it holds 4" in problems(miscounted)
    unindexed = re.sub(r"^\| \[Trees\].*\n", "", text, flags=re.M)
    assert any(p.startswith("the index") for p in problems(unindexed))
    swapped = text.replace("## Trees (4 questions)", "## Drafts again (4 questions)")
    assert any(p.startswith("sections are") for p in problems(swapped))
    stale_intro = text.replace("Engine answers cite", "Lessons 11 and 12 are being written. Engine answers cite")
    assert "introduction: says lessons are 'being written'" in problems(stale_intro)
    dangling = text.replace("(question 54)", "(question 90)")
    assert any("refers to question 90" in p for p in problems(dangling))


def test_found_reads_whole_numbers_only():
    assert found("59", "at 59 rows") and found("2.80", "2.80x") and found("53,600", "53,600 tokens/s")
    assert not found("59", "0.59") and not found("2.8", "2.80x") and not found("600", "53,600")
    assert decimals("arXiv\n2406.16858, §5.4.3, 3.35e12, Llama-3.2-1B, SmolLM2-1.7B, a 1.24B draft, 0.8 and 3.36x, "
                    "5.5.") == {"0.8", "3.36", "5.5"}
    assert found("0.6", "is 0.6, exactly") and found("8", "wants 8, and")
