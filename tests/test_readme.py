"""The README's "Use it" example runs as written, and its commented results are what the code returns."""

import re
from pathlib import Path

README = (Path(__file__).parent.parent / "README.md").read_text()


def test_the_use_it_example_runs():
    block = re.search(r"## Use it\n\n```python\n(.*?)```", README, re.S).group(1)
    scope: dict = {}
    exec(compile(block, "README.md (Use it)", "exec"), scope)  # its own assert: greedy speculative == plain
    ms, target, prompts = scope["minispec"], scope["target"], scope["prompts"]
    for name in ("tree", "both"):  # greedy through a tree of the draft model and of the EAGLE head: plain's tokens
        out = scope[name]
        assert out.stats.draft_tokens > 0, name
        assert out.tokens == ms.generate(target, prompts, max_new_tokens=len(out.tokens[0])).tokens, name
    assert "# 0.74:" in block and f"{ms.speculative_speedup(batch=256):.2f}" == "0.74"
    assert "# 17 nodes per row" in block and ms.roofline.best_tree_budget(batch=16) == 17
