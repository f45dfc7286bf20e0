"""What gamma="auto" chooses for a tree draft, beside the tree search (issue 23): the 8B reference on an H100.

    python scripts/auto_tree_policy.py

For ``TreeDraft(draft, branching=(4, 2, 2, 1))`` (44 nodes, depth 4) the loop builds its policy from the draft
(``speculative.loop._tree_of``): gamma caps the tree's depth, and each depth's tree is priced as every row verifying
all its nodes. Beside it: what the same policy predicted when it priced a chain of gamma (before issue 23), the
whole tree on the tree model, and ``best_tree_budget``'s best tree of any shape. Llama-3-8B target, c = 0.05 per
draft pass, alpha 0.8 (the policy's prior before it has observed anything), context 0: the defaults of
``best_tree_budget``, so the columns compare.
"""


from minispec import TreeDraft, roofline
from minispec.model.random import random_model
from minispec.roofline.policy import auto_policy
from minispec.speculative.loop import _tree_of

BATCHES = (1, 16, 64, 128)


def main() -> None:
    draft = TreeDraft(random_model("tiny"), branching=(4, 2, 2, 1))  # any draft model: only the tree's shape counts
    hw, ref = roofline.H100_SXM, dict(draft_cost=0.05, alpha0=0.8)
    tree_policy = auto_policy(roofline.LLAMA_8B, None, hw, **ref, **_tree_of(draft))
    chain_policy = auto_policy(roofline.LLAMA_8B, None, hw, **ref)
    whole = _tree_of(draft)["tree"]
    print(f"{draft!r}: {whole.nodes} nodes, depth {whole.depth}; H100 SXM, Llama-3-8B, c 0.05, alpha 0.8")
    print("batch | auto: depth  nodes  speedup | priced as a chain: gamma  speedup | whole tree | "
          "best_tree_budget: nodes depth speedup")
    for B in BATCHES:
        g, c = tree_policy.choose(B), chain_policy.choose(B)
        nodes = tree_policy.verified(g, 0.8)[0].nodes if g else 0
        best = roofline.tree_speedup_table([B])[0]
        print(f"{B:>5} | {g:>11} {nodes:>6} {tree_policy.speedup(B, g):>7.2f}x | {c:>23} "
              f"{chain_policy.speedup(B, c):>7.2f}x | {roofline.tree_speedup(B, whole):>9.2f}x | "
              f"{best['budget']:>22} {best['depth']:>5} {best['speedup']:>6.2f}x")


if __name__ == "__main__":
    main()
