"""The EAGLE-3 head from the command line and from its trainer: named by ``--draft`` (``eagle3:DIR``, the shipped name,
or a folder recognised by its config), checked before anything loads, and trained reproducibly."""

import json

import pytest
import torch

import minispec
from minispec import cli
from minispec.drafts.eagle3 import Eagle3Config, Eagle3Draft, Eagle3Model
from minispec.drafts.tree import TreeDraft
from minispec.tools.pair import check_pair, load_pair


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory):
    """A random EAGLE-3 head for tiny-code-target, with a 100-token draft vocabulary, saved."""
    target, _ = minispec.load("tiny-code-target")
    torch.manual_seed(0)
    model = Eagle3Model(Eagle3Config.for_target(target.config, draft_vocab=100))
    model.set_vocab(torch.arange(10, 110))
    path = tmp_path_factory.mktemp("eagle3")
    Eagle3Draft(target, model.requires_grad_(False)).save(path)
    return path


@pytest.mark.parametrize("name", ["eagle3:{}", "{}"], ids=["eagle3:DIR", "a folder"])
def test_a_head_folder_is_resolved_checked_and_loaded(head_dir, name):
    draft = name.format(head_dir)
    assert check_pair("tiny-code-target", draft).kind == "eagle3"
    target, _, drafter = load_pair("tiny-code-target", draft)
    assert isinstance(drafter, Eagle3Draft) and drafter.hot_vocab == 100
    _, _, tree = load_pair("tiny-code-target", draft, tree="budget=8,depth=3")
    assert isinstance(tree, TreeDraft) and isinstance(tree.draft, Eagle3Draft)


def test_the_shipped_head_is_resolved_by_name():
    pair = check_pair("tiny-code-target", "tiny-code-eagle3")
    assert pair.kind == "eagle3"


def test_bad_pairs_are_named_before_anything_loads(head_dir, tmp_path, monkeypatch):
    from minispec.tools import pair

    monkeypatch.setattr(pair, "load", lambda *a, **k: pytest.fail("loaded a model before checking the names"))
    with pytest.raises(ValueError, match="neither a shipped EAGLE-3 head"):
        load_pair("tiny-code-target", f"eagle3:{tmp_path / 'nowhere'}")
    with pytest.raises(ValueError, match="its own draft vocabulary"):
        load_pair("tiny-code-target", f"eagle3:{head_dir}", hot_vocab=64)
    with pytest.raises(ValueError, match="hidden size 192 and 8 layers; tiny-code-draft has"):
        load_pair("tiny-code-draft", f"eagle3:{head_dir}")
    with pytest.raises(ValueError, match="is an EAGLE head, not a target"):
        load_pair(str(head_dir), "ngram")
    c = json.loads((head_dir / "config.json").read_text())
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.safetensors").write_bytes((head_dir / "model.safetensors").read_bytes())
    (bad / "config.json").write_text(json.dumps(c | {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [5, 2]}}))
    with pytest.raises(ValueError, match="features must be increasing"):
        load_pair("tiny-code-target", f"eagle3:{bad}")


def test_generate_drafts_with_a_head_folder(head_dir, capsys):
    assert cli.main(["generate", "def main(argv):\n    ", "--draft", f"eagle3:{head_dir}", "--max-new-tokens", "8",
                     "--threads", "1"]) == 0
    assert "Eagle3Draft" in capsys.readouterr().err  # the report goes to stderr, the text to stdout


def test_train_eagle3_names_what_it_takes(tmp_path, capsys):
    assert cli.main(["train", "eagle3", "--out", str(tmp_path / "h")]) == 2  # no --target
    assert "minispec train eagle3 takes --target NAME" in capsys.readouterr().err
    assert cli.main(["train", "eagle3", "--target", "tiny-code-target", "--stop-after", "3",
                     "--out", str(tmp_path / "h")]) == 2
    assert "not --prose-file or --stop-after" in capsys.readouterr().err


# --- the trainer -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, message", [
    (dict(minutes=0), "minutes must be"), (dict(steps=0), "steps must be"), (dict(threads=1.5), "threads must be"),
    (dict(config_kw=dict(ttt=0)), "ttt must be"), (dict(config_kw=dict(decay=0.0)), "decay must be"),
    (dict(config_kw=dict(features=(4, 2))), "features must be"), (dict(config_kw=dict(draft_vocab=300)),
                                                                  "draft_vocab must be"),
    (dict(config_kw=dict(autocast="bf16")), "autocast must be"),
])
def test_bad_training_arguments_are_named_before_any_work(tmp_path, kw, message, monkeypatch):
    from minispec.tools import train_eagle3

    monkeypatch.setattr(train_eagle3, "load", lambda *a, **k: pytest.fail("loaded a model before the checks"))
    config = train_eagle3.Eagle3TrainConfig(**kw.pop("config_kw", {}))
    with pytest.raises(ValueError, match=message):
        train_eagle3.train_eagle3("tiny-code-target", tmp_path, config=config, **kw)


def test_the_draft_vocabulary_is_the_most_frequent_tokens_in_id_order():
    from minispec.tools.train_eagle3 import draft_vocabulary

    tokens = torch.tensor([5, 5, 5, 9, 9, 1, 7, 7, 7, 7, 3])
    assert draft_vocabulary(tokens, 10, 3).tolist() == [5, 7, 9]
    assert draft_vocabulary(tokens, 10, 4).tolist() == [1, 5, 7, 9]  # 1 and 3 tie once: the lower id


@pytest.mark.parametrize("native", [False, True])
def test_autocast_is_bfloat16_only_where_the_cpu_computes_it(tmp_path, monkeypatch, native):
    """Emulated bfloat16 made training 8x slower on an AVX2 CPU: "auto" (the default) takes it only where native, and
    the record says which ran, as does the autocast the step saw."""
    from minispec.tools import train_eagle3

    seen = []
    real = torch.autocast
    monkeypatch.setattr(train_eagle3, "native_bf16", lambda: native)
    monkeypatch.setattr(train_eagle3.torch, "autocast",
                        lambda *a, **k: seen.append((k["dtype"], k["enabled"])) or real(*a, **k))
    cfg = train_eagle3.Eagle3TrainConfig(draft_vocab=96, ttt=2, seq_len=16, batch_size=1, eval_every=5)
    rec = train_eagle3.train_eagle3("tiny-code-target", tmp_path, steps=1, config=cfg, progress=False)
    assert rec["train_config"]["autocast"] == ("bfloat16" if native else None)
    assert seen and (set(seen) == {(torch.bfloat16, True)} if native else not any(on for _, on in seen))


@pytest.mark.slow
def test_training_is_seeded_and_writes_a_head_that_drafts_exactly(tmp_path):
    """Two short runs with one seed give the same weights; the head loads, reads its layers and drafts exactly."""
    from minispec.tools.train_eagle3 import Eagle3TrainConfig, train_eagle3

    cfg = Eagle3TrainConfig(draft_vocab=96, ttt=3, seq_len=32, batch_size=2, eval_every=2)
    records = [train_eagle3("tiny-code-target", tmp_path / name, steps=3, config=cfg, progress=False)
               for name in ("a", "b")]
    r = records[0]
    assert r["steps"] == 3 and r["features"] == [2, 4, 5] and r["draft_vocab"] == 96 and len(r["curve"]) == 2
    assert len(r["curve"][-1]["heldout_greedy_match"]) == 4  # draft positions 1..4
    assert 0.9 < r["heldout_draft_vocab_mass"] <= 1.0
    target, _ = minispec.load("tiny-code-target")
    a, b = (Eagle3Draft.from_pretrained(tmp_path / name, target) for name in ("a", "b"))
    for k, v in a.model.state_dict().items():
        assert torch.equal(v, b.model.state_dict()[k]), k
    prompts = [list(b"def f(x):\n    return"), list(b"import os\n")]
    plain = minispec.generate(target, prompts, max_new_tokens=8).tokens
    assert minispec.speculative_generate(target, a, prompts, gamma=3, max_new_tokens=8).tokens == plain
