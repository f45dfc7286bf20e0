"""Temperature, top-k and top-p as distributions; Philox4x32-10; the inverse-CDF sampler at its boundaries."""

import pytest
import torch

from minispec.decoding import sampling
from minispec.decoding.sampling import SamplingParams, philox4x32, probabilities, row_keys, row_seeds, sample, uniforms

LOGITS = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
MASK = 0xFFFFFFFF


def test_greedy_is_one_hot_and_never_divides_by_zero():
    p = probabilities(LOGITS, SamplingParams(0.0))
    assert p.tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_argmax_is_torchs_argmax_first_on_ties_nan_as_largest_at_128k(dtype):
    """The engine's greedy token (sampling.argmax, read from max) is torch.argmax's on a real vocabulary: the first
    index among tied maxima, a NaN the largest, and +inf above every finite value; 1-D, 2-D and 3-D."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, 128_256, generator=g).to(dtype)  # (B, T, V) a Llama-3 vocabulary
    x[0, 0, [7, 90_000, 128_255]] = 50.0  # ties: the first wins
    x[1, :, :] = 0.0  # a whole row tied
    x[2, 1, [64_000, 3]] = float("nan")  # NaN counts as the largest, the first one
    x[3, 2, [100_000, 5]] = float("inf")
    x[4, 3, :] = float("-inf")
    x[4, 3, 128_000] = -1e4 if dtype == torch.float16 else -1e30
    for t in (x, x[0], x[0, 0]):
        assert torch.equal(sampling.argmax(t), t.argmax(-1))
    assert sampling.argmax(x)[0, 0] == 7 and sampling.argmax(x)[2, 1] == 3 and sampling.argmax(x)[4, 3] == 128_000


def test_temperature_softmax():
    p = probabilities(LOGITS, SamplingParams(0.5))
    assert torch.allclose(p, (LOGITS / 0.5).softmax(-1))


def test_top_k_keeps_k_tokens():
    p = probabilities(LOGITS, SamplingParams(1.0, top_k=2))
    ref = torch.zeros_like(p)
    ref[0, :2] = LOGITS[0, :2].softmax(-1)
    assert torch.allclose(p, ref)


def test_top_p_keeps_the_smallest_nucleus():
    full = LOGITS.softmax(-1)[0]  # about 0.55, 0.20, 0.12, 0.07, 0.03
    p = probabilities(LOGITS, SamplingParams(1.0, top_p=0.7))[0]
    # 0.55 < 0.7, 0.55 + 0.20 >= 0.7: the nucleus is the first two tokens
    assert (p > 0).tolist() == [True, True, False, False, False]
    assert torch.allclose(p[:2], full[:2] / full[:2].sum())
    assert torch.allclose(probabilities(LOGITS, SamplingParams(1.0, top_p=0.5))[0], torch.eye(5)[0])


# --- Philox4x32-10 -------------------------------------------------------------------------------

# Random123's tests/kat_vectors (github.com/DEShawResearch/random123), the three "philox4x32 10" lines:
# counter (4 words), key (2 words), expected output (4 words).
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((MASK,) * 4, (MASK, MASK), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def test_philox_known_answers():
    counters = torch.tensor([c for c, _, _ in KAT])  # (3, 4)
    keys = torch.tensor([k for _, k, _ in KAT])  # (3, 2)
    assert philox4x32(counters, keys).tolist() == [list(e) for _, _, e in KAT]
    # one key broadcast over many counters gives each counter's own answer
    out = philox4x32(counters[None].expand(5, 3, 4), keys)  # (5, 3, 4)
    assert (out == torch.tensor([list(e) for _, _, e in KAT])).all()


def test_philox_with_fewer_rounds_is_a_different_function():
    """A negative control: Random123's 7-round vector differs, so the KAT does pin the round count."""
    assert philox4x32(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long), rounds=7).tolist() \
        != [list(KAT[0][2])]


def keys(n, seed=0):
    return row_keys(row_seeds(seed, n))  # (n, 2)


def test_uniforms_are_strictly_inside_0_1_even_at_the_extreme_raw_words(monkeypatch):
    """u = (k + 0.5) / 2^52 with k the 52 top bits of two words: k = 0 and k = 2^52 - 1 give 2^-53 and
    1 - 2^-53, never 0 or 1 (the old 24-bit float32 uniform rounded its top value to 1.0)."""
    for word in (0, MASK):
        monkeypatch.setattr(sampling, "philox4x32", lambda c, k, word=word: torch.full((*c.shape[:-1], 4), word))
        u = uniforms(keys(3), 1, torch.zeros(3, dtype=torch.long), 4)  # (3, 4)
        assert (u > 0).all() and (u < 1).all()
        assert u.flatten().unique().tolist() == [2.0**-53 if word == 0 else 1 - 2.0**-53]


def test_no_zero_weight_token_at_the_extreme_uniforms():
    """At V = 131,072 with half the weights zero, the smallest and largest possible uniforms (and u = 0 and
    1 themselves) pick a positive-weight token; the old float32 race picked a zero-weight one at u = 1."""
    V = 131_072
    w = torch.rand(4, V)  # (4, V)
    w[:, ::2] = 0  # every other token has weight zero, the first and last included
    w[:, -1] = 0
    u = torch.tensor([0.0, 2.0**-53, 1 - 2.0**-53, 1.0], dtype=torch.float64)  # (4,)
    t = sample(w, u)  # (4,)
    assert (w.gather(1, t[:, None]) > 0).all()
    assert t[0] == 1 and t[3] == V - 3  # the first and the last positive-weight tokens

    def old_race(w, u):  # the exponential race of the previous sampler, with its float32 uniform
        return (w / -u.float().log()).argmax(-1)

    assert w[0, old_race(w[:1], torch.ones(1, V))] == 0  # u = 1.0: -log 1 = -0, 0 / -0 = NaN wins the argmax


def test_sample_follows_unnormalised_weights():
    w = torch.tensor([1.0, 0.0, 3.0, 4.0])  # target 0.125, 0, 0.375, 0.5
    n = 200_000
    draws = sample(w.expand(n, 4), uniforms(keys(n), 1, torch.zeros(n, dtype=torch.long), 1)[:, 0])
    freq = torch.bincount(draws, minlength=4) / n
    assert freq[1] == 0
    assert torch.allclose(freq, w / w.sum(), atol=0.005)  # 4.5 sigma for p = 0.5 and 200,000 draws
    assert torch.equal(sample(w.expand(5, 4), None), torch.full((5,), 3))  # no uniforms: the argmax (greedy)


def test_counter_based_uniforms_are_uniform_and_independent():
    u = uniforms(keys(4096), 1, torch.zeros(4096, dtype=torch.long), 64)  # (4096, 64)
    assert u.dtype == torch.float64 and 0 < u.min() and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.002 and abs(u.var().item() - 1 / 12) < 0.002
    counts = torch.histc(u, bins=16, min=0, max=1)  # 16,384 expected per bin
    assert ((counts - 16384).abs() < 5 * 128).all()  # 5 sigma, sigma = sqrt(16384 * 15/16) ~ 124
    corr = torch.corrcoef(torch.stack([u[:, :-1].flatten(), u[:, 1:].flatten()]))[0, 1]
    assert abs(corr.item()) < 0.01  # neighbouring draws of a row are uncorrelated
    rows = torch.corrcoef(torch.stack([u[:-1].flatten(), u[1:].flatten()]))[0, 1]
    assert abs(rows.item()) < 0.01  # and so are neighbouring rows


def test_a_rows_numbers_depend_on_its_seed_stream_and_position_only():
    pos = torch.tensor([5, 5, 5])
    a = uniforms(row_keys([7, 8, 2**64 - 1]), 1, pos, 3)  # (3, 3)
    b = uniforms(row_keys([2**64 - 1]), 1, pos[:1], 3)  # (1, 3)
    assert torch.equal(a[2], b[0]) and len(set(a.flatten().tolist())) == 9
    assert not torch.equal(uniforms(row_keys([2**64 - 1]), 2, pos[:1], 3), b)  # another stream
    assert not torch.equal(uniforms(row_keys([2**64 - 1]), 1, pos[:1] + 1, 3), b)  # another position
    assert not torch.equal(uniforms(row_keys([2**63 - 1]), 1, pos[:1], 3), b)  # the seed's high bits count
    assert row_seeds(3, 2) == row_seeds(3, 2) != row_seeds(4, 2) and row_seeds([1, 2], 2) == [1, 2]


@pytest.mark.parametrize("kw", [dict(temperature=-1), dict(top_k=0), dict(top_k=2.5), dict(top_p=0), dict(top_p=1.01)])
def test_invalid_params(kw):
    with pytest.raises(ValueError):
        SamplingParams(**kw)
