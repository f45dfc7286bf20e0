"""The embedded model pair: loadable offline from the package, and as good as its model card says."""

import json
from pathlib import Path

import pytest

import minispec
from minispec.model.load import ASSETS, resolve
from minispec.tools.train import evaluate_embedded, train

CARD = json.loads((ASSETS / "evaluation.json").read_text())
TOLERANCE = 0.01  # figures recomputed here may differ from the card's in the last digits (thread counts, CPUs)


def test_all_three_load_from_the_package_alone():
    package = Path(minispec.__file__).parent
    for name in minispec.EMBEDDED:
        assert resolve(name).is_relative_to(package)
        model, tok = minispec.load(name)
        assert model.config.vocab_size == 256 and tok.decode(tok.encode("déf x:")) == "déf x:"


@pytest.fixture(scope="module")
def figures():
    return evaluate_embedded()


def test_model_card_figures_reproduce(figures):
    figs = figures
    for name, losses in CARD["heldout_loss"].items():
        for kind, loss in losses.items():
            assert figs["heldout_loss"][name][kind] == pytest.approx(loss, abs=TOLERANCE), (name, kind)
    for draft, by_kind in CARD["acceptance"].items():
        for kind, vals in by_kind.items():
            for k, v in vals.items():
                assert figs["acceptance"][draft][kind][k] == pytest.approx(v, abs=TOLERANCE), (draft, kind, k)


def test_target_is_clearly_better_than_its_draft(figures):
    loss = figures["heldout_loss"]
    assert loss["tiny-code-target"]["code"] < loss["tiny-code-draft"]["code"] - 0.1  # nats per byte
    params = figures["parameters"]
    assert params["tiny-code-target"] >= 3e6 and params["tiny-code-draft"] <= params["tiny-code-target"] / 10
    assert params["tiny-prose-draft"] == params["tiny-code-draft"]


def test_domain_shift_gap(figures):
    acc = figures["acceptance"]
    assert acc["tiny-code-draft"]["code"]["overlap"] >= 0.6
    assert acc["tiny-prose-draft"]["code"]["overlap"] <= 0.4


def test_shipped_size():
    # the three byte-level models, two EAGLE heads (the SmolLM2 head, 8.6 MB in bf16, ships because it is under
    # the 20 MB issue 18 allows) and the EAGLE-3 head (2.5 MB in float32: vLLM's eagle3 reads the same file, and the
    # lane compares its counts with minispec's); a wheel that grows past this needs a reason
    total = sum(f.stat().st_size for f in ASSETS.rglob("*") if f.is_file())
    assert total <= 29e6


@pytest.mark.slow
def test_retraining_the_draft_retraces_its_curve(tmp_path):
    """The first 100 steps of `minispec train tiny-code-draft` land on the shipped run's curve."""
    shipped = json.loads((ASSETS / "tiny-code-draft" / "training.json").read_text())
    first = shipped["curve"][0]
    record = train("tiny-code-draft", tmp_path, stop_after=first["step"], progress=False)
    assert record["heldout_loss"] == pytest.approx(first["heldout_loss"], abs=0.02)  # nats per byte
    assert (tmp_path / "config.json").exists() and (tmp_path / "model.safetensors").exists()
