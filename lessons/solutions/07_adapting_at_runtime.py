"""Worked solutions to the exercises of lesson 07, adapting at runtime.

Run from the repository root: ``python lessons/solutions/07_adapting_at_runtime.py``.
Every number a solution claims is asserted; everything here is the roofline model, nothing is timed.
"""

from dataclasses import dataclass

from minispec import roofline
from minispec.roofline.policy import GammaPolicy, RooflinePolicy


def next_token_pays(alpha: float, gamma: int, c: float) -> bool:
    """At batch 1: does gamma + 1 beat gamma? E(g) / (1 + g c) grows iff alpha^(g+1) (1 + g c) > c E(g).

    E(g + 1) = E(g) + alpha^(g+1), so E(g+1) / (1 + (g+1) c) > E(g) / (1 + g c)
    <=> (E(g) + alpha^(g+1)) (1 + g c) > E(g) (1 + g c + c) <=> alpha^(g+1) (1 + g c) > c E(g).
    """
    return alpha ** (gamma + 1) * (1 + gamma * c) > c * roofline.expected_tokens(alpha, gamma)


def predicted_best(alpha: float, c: float) -> int:
    """The first gamma whose next token no longer pays: the optimum, since the gain only shrinks after it."""
    g = 0
    while next_token_pays(alpha, g, c):
        g += 1
    return g


def exercise_1():
    """The best gamma is interior: the marginal rule predicts it, and it moves with alpha and c."""
    print("Exercise 1: the best gamma at batch 1, from the marginal rule")
    for alpha, c, expected in ((0.9, 0.05, 13), (0.8, 0.05, 8), (0.8, 0.25, 3), (0.6, 0.05, 4)):
        g = predicted_best(alpha, c)
        s = [roofline.speculative_speedup(1, alpha, k, c) for k in (g - 1, g, g + 1)]
        print(f"  alpha {alpha}, c {c}: the rule stops at gamma {g} ({s[0]:.3f}x, {s[1]:.3f}x, {s[2]:.3f}x "
              f"for gamma {g - 1}, {g}, {g + 1})")
        assert g == expected == roofline.best_gamma(1, alpha, gamma_max=32, draft_cost=c)
        assert s[1] > s[0] and s[1] > s[2]  # a peak, not a plateau or the end of the range
    # The rule and the model agree everywhere on a grid, and the optimum is never the cap of 64 there.
    grid = [(a / 20, c / 100) for a in range(2, 20) for c in (1, 2, 5, 10, 25, 50)]
    assert all(predicted_best(a, c) == roofline.best_gamma(1, a, gamma_max=64, draft_cost=c) < 64 for a, c in grid)
    assert predicted_best(0.95, 0.01) == 40  # a near-perfect, nearly free draft: long, but still finite
    print(f"  the rule matches roofline.best_gamma on all {len(grid)} (alpha, c) pairs of the grid")
    print("  The g-th draft token adds alpha^g expected tokens (it counts only if all before it were accepted) but")
    print("  always costs c: a geometric gain against a linear cost, so the speedup peaks. Higher alpha moves the")
    print("  peak out (13 at 0.9, past the default cap of 8), a dearer draft moves it in (3 at c = 0.25).")


def exercise_2():
    """Hysteresis: a margin stops gamma flapping between two neighbouring choices."""
    print("Exercise 2: a running batch alternating between 126 and 136 rows")
    batches = [126, 136] * 10
    changes, chosen = {}, {}
    for margin in (0.0, 0.02, 0.05):
        policy = RooflinePolicy(alpha0=0.8, margin=margin)
        chosen[margin] = [policy.choose(B) for B in batches]
        changes[margin] = sum(a != b for a, b in zip(chosen[margin], chosen[margin][1:]))
        print(f"  margin {margin}: gammas {chosen[margin][:4]}..., {changes[margin]} changes in {len(batches)} steps")
    assert chosen[0.0][:2] == [2, 1] and changes[0.0] == changes[0.02] == len(batches) - 1
    assert changes[0.05] == 0 and set(chosen[0.05]) == {2}
    at_136 = {g: roofline.speculative_speedup(136, 0.8, g) for g in (1, 2)}
    cost = 1 - at_136[2] / at_136[1]
    print(f"  the price: at 136 rows gamma 2 gives {at_136[2]:.3f}x where gamma 1 gives {at_136[1]:.3f}x "
          f"({cost:.1%} less); at 126 rows gamma 2 is the better one anyway")
    assert 0.03 < cost < 0.05  # below the 5 % margin, above 2 %: which is why 0.02 did not hold it
    print("  A serving engine pays for each switch: a captured CUDA graph or compiled step per draft length,")
    print("  a different verify shape, and vLLM's table keys K by batch range. A margin a few percent wide")
    print("  trades a little modelled speed for a stable choice.")


@dataclass
class BatchGate(GammaPolicy):
    """Draft ``gamma`` tokens below ``threshold`` rows and none from there on: the simplest gate."""

    threshold: float = 187.0
    gamma: int = 4

    def choose(self, batch_size: int) -> int:
        return self.gamma if batch_size < self.threshold else 0


def exercise_3():
    """A threshold gate against the roofline policy, in the reference model."""
    print("Exercise 3: gamma 4 below a batch threshold, off above it")
    gate, policy = BatchGate(threshold=roofline.break_even_batch()), RooflinePolicy(alpha0=0.8)
    batches = range(1, 401)
    s_gate = {B: roofline.speculative_speedup(B, 0.8, gate.choose(B)) for B in batches}
    s_pol = {B: roofline.speculative_speedup(B, 0.8, policy.choose(B)) for B in batches}
    worst = max(batches, key=lambda B: s_pol[B] - s_gate[B])
    print(f"  never slower than plain: the gate's lowest speedup is {min(s_gate.values()):.3f}x")
    print(f"  largest loss at batch {worst}: gate {s_gate[worst]:.2f}x, policy {s_pol[worst]:.2f}x "
          f"(gamma {policy.choose(worst)}); at batch 1 gate {s_gate[1]:.2f}x, policy {s_pol[1]:.2f}x")
    assert min(s_gate.values()) >= 1 and all(s_pol[B] >= s_gate[B] for B in batches)
    assert worst == 148 and round(s_pol[worst] - s_gate[worst], 2) == 0.47
    assert round(s_gate[1], 2) == 2.80 and round(s_pol[1], 2) == 3.09  # gamma 8 beats gamma 4 even at batch 1
    # The gate's threshold belongs to one alpha. Traffic the draft predicts worse moves break-even down.
    low = {B: roofline.speculative_speedup(B, 0.6, gate.choose(B)) for B in batches}
    adapts = RooflinePolicy(alpha0=0.6)
    slow = [B for B in batches if low[B] < 1]
    print(f"  at alpha 0.6 the same gate is slower than plain from batch {slow[0]} to {slow[-1]} "
          f"({min(low.values()):.2f}x at worst); the roofline policy at alpha 0.6 never is (in this model, which it\n"
          "  maximises by construction, and given the right alpha)")
    assert slow[0] == round(roofline.break_even_batch(0.6)) + 1 and slow[-1] == 186 and min(low.values()) < 0.9
    assert all(roofline.speculative_speedup(B, 0.6, adapts.choose(B)) >= 1 for B in batches)
    print("  A gate must be re-measured when traffic changes; a policy with a running alpha follows it.")


if __name__ == "__main__":
    exercise_1()
    exercise_2()
    exercise_3()
