"""The course's shared pieces: the models a lesson gets, from the device and MINISPEC_TARGET / MINISPEC_DRAFT."""

import pytest
import torch

from minispec.course import models as course
from minispec.model.config import ModelConfig
from minispec.model.llama import Model
from minispec.model.load import ASSETS
from minispec.tools.train import save_checkpoint


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv("MINISPEC_TARGET", raising=False)
    monkeypatch.delenv("MINISPEC_DRAFT", raising=False)
    return monkeypatch


def test_course_models_on_a_cpu_is_the_embedded_trio(no_env):
    m = course.course_models("cpu")
    assert m["embedded"] and m["device"] == torch.device("cpu") and m["synthetic_alpha"] is None
    assert m["name"] == "tiny-code-target / tiny-code-draft" and m["eagle"] == "tiny-code-eagle"
    sizes = [m[k].config.num_parameters for k in ("target", "draft", "prose_draft")]
    assert sizes[0] > 5 * sizes[1] and sizes[1] == sizes[2]  # a small draft, and a prose draft of its size
    assert all(m[k].config.vocab_size == 256 for k in ("target", "draft", "prose_draft"))
    assert m["tokenizer"].decode(m["tokenizer"].encode("def f():")) == "def f():"
    assert len(m["code"]) > 1000 and len(m["prose"]) > 1000


def test_embedded_ignores_the_environment(no_env):
    no_env.setenv("MINISPEC_TARGET", "/nowhere")
    m = course.course_models(embedded=True)
    assert m["embedded"] and m["name"] == "tiny-code-target / tiny-code-draft"


def test_a_target_with_no_draft_beside_it_says_what_to_set(no_env):
    no_env.setenv("MINISPEC_TARGET", str(ASSETS / "tiny-code-target"))  # a directory: no default draft is known
    with pytest.raises(ValueError, match="set MINISPEC_DRAFT to a checkpoint that shares its tokenizer, or to "
                                         "layerskip:N"):
        course.course_models("cpu")


def test_a_draft_with_another_vocabulary_is_refused_before_the_lesson(no_env, tmp_path):
    cfg = ModelConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, head_dim=16, max_position_embeddings=512)
    save_checkpoint(Model(cfg), tmp_path / "draft")
    no_env.setenv("MINISPEC_TARGET", "tiny-code-target")
    no_env.setenv("MINISPEC_DRAFT", str(tmp_path / "draft"))
    with pytest.raises(ValueError, match=r"\(256 tokens\) and MINISPEC_DRAFT=.*\(300 tokens\) cannot go together"):
        course.course_models("cpu")


def test_layerskip_draft_is_the_targets_first_layers_sharing_its_weights(no_env):
    no_env.setenv("MINISPEC_TARGET", "tiny-code-target")
    no_env.setenv("MINISPEC_DRAFT", "layerskip:3")
    m = course.course_models("cpu")
    target, draft = m["target"], m["draft"]
    assert m["name"] == "tiny-code-target / layerskip:3" and not m["embedded"] and m["eagle"] == "tiny-code-eagle"
    assert draft.config.num_hidden_layers == 3 and draft.embed.weight.data_ptr() == target.embed.weight.data_ptr()
    x = torch.tensor([list(b"def f(x):\n    return x")])
    with torch.inference_mode():
        assert torch.equal(draft(x), target(x, num_layers=3))  # the target stopped after 3 layers
        assert not torch.equal(draft(x), target(x))
    no_env.setenv("MINISPEC_DRAFT", "layerskip:8")
    with pytest.raises(ValueError, match="layerskip:N needs N from 1 to 7"):
        course.course_models("cpu")


def test_the_shipped_head_is_found_by_its_target():
    assert course.shipped_head("tiny-code-target") == "tiny-code-eagle"
    assert course.shipped_head(str(ASSETS / "tiny-code-target")) == "tiny-code-eagle"  # the same checkpoint
    assert course.shipped_head("tiny-code-draft") is None
