import pytest

import minispec
from minispec.model.load import sample_text


@pytest.fixture(scope="module")
def code_pair():
    """The embedded target and draft, and six code prompts of 24 to 89 bytes (bytes = tokens)."""
    target, _ = minispec.load("tiny-code-target")
    draft, _ = minispec.load("tiny-code-draft")
    text = sample_text("code")
    return target, draft, [list(text[400 * i: 400 * i + 24 + 13 * i]) for i in range(6)]
