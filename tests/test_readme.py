"""The README's "Use it" example runs as written, and each comment says what its line does."""

import re
from pathlib import Path

import pytest

README = (Path(__file__).parent.parent / "README.md").read_text()
BLOCK = re.search(r"## Use it\n\n```python\n(.*?)```", README, re.S).group(1)


@pytest.fixture(scope="module")
def scope():
    scope: dict = {}
    exec(compile(BLOCK, "README.md (Use it)", "exec"), scope)  # its own assert: greedy speculative == plain
    return scope


def test_the_prompts_continue_with_code(scope):
    """Equality and acceptance mean something only if the greedy continuation is code, not blank lines."""
    tok, plain = scope["tok"], scope["plain"]
    for row in plain.tokens:
        text = tok.decode(row)
        assert len(row) == 64 and sum(not c.isspace() for c in text) >= 20, repr(text)
        assert len({line.strip() for line in text.splitlines() if line.strip()}) >= 2, repr(text)
    shown = re.search(r'print\(tok.decode\(spec.tokens\[0\]\)\)  # "(.*?)\.\.\."', BLOCK).group(1)
    assert tok.decode(plain.tokens[0]).startswith(shown.encode().decode("unicode_escape"))


def test_every_draft_drafts_and_the_greedy_ones_give_plain_tokens(scope):
    ms, target, prompts, plain = scope["minispec"], scope["target"], scope["prompts"], scope["plain"]
    for name in ("spec", "lookup", "skip", "tree", "both"):
        out = scope[name]
        assert out.stats.draft_tokens > 0 and out.stats.accepted_tokens > 0, name
        assert out.tokens == plain.tokens, name
    assert target.config.num_hidden_layers == 8 and "# Drafts with no draft model" in BLOCK  # "first 4 of its 8"
    assert scope["skip"].stats.draft == "LayerSkipDraft(4 of 8 layers)"
    sampled = scope["sampled"]
    assert sampled.tokens != plain.tokens and sampled.stats.draft_tokens > 0
    again = ms.speculative_generate(target, scope["draft"], prompts, temperature=0.8, seed=[7, 8], max_new_tokens=64)
    assert again.tokens == sampled.tokens  # "a seed per row makes each row repeatable"


def test_the_trees_run_at_the_depth_they_are_given(scope):
    """TreeDraft(draft, budget=16, depth=5) drafts to depth 5 with gamma left at its default, 16 nodes a step; the
    static tree (4, 2, 1) to depth 3 with 4 + 8 + 8 nodes; a tree gains more tokens per pass than the chain."""
    tree, both, spec = scope["tree"].stats, scope["both"].stats, scope["spec"].stats
    assert (tree.tree_depth, tree.tree_nodes) == (5, 16) and "# 5 16," in BLOCK
    assert len(tree.accepted_per_position) == 5  # a node at depth 5 was accepted: the tree was not cut at 4
    assert (both.tree_depth, both.tree_nodes) == (3, 20)
    assert tree.mean_acceptance_length > spec.mean_acceptance_length


def test_the_roofline_lines_say_what_they_return(scope):
    ms = scope["minispec"]
    assert "# 0.74:" in BLOCK and f"{ms.speculative_speedup(batch=256):.2f}" == "0.74"
    assert "# 17 nodes per row" in BLOCK and ms.roofline.best_tree_budget(batch=16) == 17
