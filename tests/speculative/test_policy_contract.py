"""What the loop asks of a gamma policy, and what ``gamma="auto"`` prices (issue 23)."""

import pytest

from minispec.roofline.policy import FixedPolicy
from minispec.speculative.loop import speculative_generate


@pytest.mark.parametrize("gamma", [2.0, True, "2"])
def test_a_policy_must_return_an_int_gamma(pair, gamma):
    """A float gamma used to fail deep inside the draft with "'float' object cannot be interpreted as an integer"."""
    target, draft = pair

    class Loose(FixedPolicy):
        def choose(self, batch_size, context=None):
            return gamma

    with pytest.raises(TypeError, match=rf"Loose.choose must return an int gamma, got {gamma!r}"):
        speculative_generate(target, draft, [[1, 2, 3]], gamma=Loose(2), max_new_tokens=8)
