"""The course's shared pieces: the models a lesson gets on a CPU."""

import torch

from minispec.course import models as course


def test_course_models_on_a_cpu_is_the_embedded_trio(monkeypatch):
    monkeypatch.delenv("MINISPEC_TARGET", raising=False)
    m = course.course_models("cpu")
    assert m["embedded"] and m["device"] == torch.device("cpu") and m["synthetic_alpha"] is None
    assert m["name"] == "tiny-code-target / tiny-code-draft"
    sizes = [m[k].config.num_parameters for k in ("target", "draft", "prose_draft")]
    assert sizes[0] > 5 * sizes[1] and sizes[1] == sizes[2]  # a small draft, and a prose draft of its size
    assert all(m[k].config.vocab_size == 256 for k in ("target", "draft", "prose_draft"))
    assert m["tokenizer"].decode(m["tokenizer"].encode("def f():")) == "def f():"
    assert len(m["code"]) > 1000 and len(m["prose"]) > 1000
