"""What decoding/sampling.py documents, pinned exactly where statistics cannot see a change (written from mutation
testing): the counter layout, the 52 bits a uniform is made of, SplitMix64's published outputs, the edges of
the sampling parameters and of top-p."""

import pytest
import torch

from minispec.decoding import sampling
from minispec.decoding.sampling import (
    MIN_TEMPERATURE,
    Sampler,
    SamplingParams,
    philox4x32,
    probabilities,
    row_keys,
    row_seeds,
    sample,
    uniforms,
)

MASK, GOLDEN = 2**32 - 1, 0x9E3779B97F4A7C15


def test_splitmix64_gives_its_published_outputs():
    """Seeded with 0, SplitMix64 (Steele et al. 2014; Vigna's splitmix64.c) outputs these three numbers first."""
    assert [sampling._splitmix64(k * GOLDEN % 2**64) for k in (0, 1, 2)] == [
        0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


def test_an_int_seed_gives_row_b_splitmix_of_splitmix_of_the_seed_plus_b():
    mix = sampling._splitmix64
    assert row_seeds(12345, 3) == [mix(mix(12345) + b) for b in range(3)]
    assert row_seeds(-1, 1) == [mix(mix(2**64 - 1))]  # an int seed is taken modulo 2^64
    assert row_seeds([2**64 + 5, -1], 2) == [5, 2**64 - 1]
    assert row_keys([0x0123456789ABCDEF]).tolist() == [[0x89ABCDEF, 0x01234567]]  # (low, high) 32-bit words


def test_a_uniform_is_draw_j_at_counter_j_position_stream_0_under_the_rows_key():
    """Draw j of row b is Philox4x32-10 of counter (j, position[b], stream, 0) under row b's key; its words 0 and 1
    give 52 bits k = w0 << 20 | w1 >> 12, and u = (k + 0.5) / 2^52 (computed here in Python integers)."""
    keys, position = row_keys([7, 2**64 - 3]), torch.tensor([11, 2**31 + 5])
    u = uniforms(keys, 3, position, 5)  # (2, 5)
    for b in range(2):
        for j in range(5):
            w = philox4x32(torch.tensor([j, int(position[b]), 3, 0]), keys[b]).tolist()
            k = (w[0] << 20) | (w[1] >> 12)
            assert 0 <= k < 2**52 and u[b, j].item() == (k + 0.5) / 2**52


def test_the_sampling_parameters_take_their_edges():
    for kw in (dict(temperature=0), dict(temperature=MIN_TEMPERATURE), dict(top_k=1), dict(top_p=1.0),
               dict(top_p=1e-9), dict(temperature=1, top_k=64, top_p=0.5)):
        SamplingParams(**kw)  # no error
    for kw, message in ((dict(temperature=float("nan")), "temperature must be a number >= 0"),
                        (dict(temperature="1"), "temperature must be a number >= 0"),
                        (dict(temperature=MIN_TEMPERATURE / 2), "overflows float32"),
                        (dict(temperature=True), "temperature must be a number"),
                        (dict(top_k=True), "top_k must be an integer >= 1"), (dict(top_p=-0.5), "top_p must be in")):
        with pytest.raises(ValueError, match=message):
            SamplingParams(**kw)
    assert SamplingParams(0.0).greedy and not SamplingParams(MIN_TEMPERATURE).greedy


def test_top_p_keeps_every_token_before_the_mass_is_reached_and_no_more():
    """Mass before a token already reaching top_p drops it: with p = (0.5, 0.25, 0.125, 0.125), top_p = 0.75 keeps
    two tokens (0.5 + 0.25 reaches 0.75 exactly: the third is dropped), 0.76 keeps three (the fourth's mass before it
    is 0.875); ties at the edge of top-k are all kept."""
    logits = torch.tensor([[0.5, 0.25, 0.125, 0.125]]).log()
    for top_p, kept in ((0.75, [1, 1, 0, 0]), (0.76, [1, 1, 1, 0]), (0.5, [1, 0, 0, 0]), (0.51, [1, 1, 0, 0])):
        p = probabilities(logits, SamplingParams(1.0, top_p=top_p))[0]
        assert (p > 0).int().tolist() == kept, top_p
        torch.testing.assert_close(p.sum(), torch.tensor(1.0))
    p = probabilities(logits, SamplingParams(1.0, top_k=3))[0]  # the 3rd and 4th tie: both kept
    assert (p > 0).int().tolist() == [1, 1, 1, 1]
    p = probabilities(torch.tensor([[0.0, 5.0, 5.0, 1.0]]), SamplingParams(1.0, top_k=1))[0]  # a tie for the top
    assert p.tolist() == [0.0, 0.5, 0.5, 0.0]


def test_temperature_divides_the_centred_logits():
    logits = torch.tensor([[2.0, 0.0, -1.0]])
    for T in (0.5, 1.0, 2.0, 1e-30):
        expected = (logits / T).double().softmax(-1).float()
        torch.testing.assert_close(probabilities(logits, SamplingParams(T)), expected)
    assert probabilities(torch.tensor([[1.0, 3.0, 3.0]]), SamplingParams(0.0)).tolist() == [[0.0, 1.0, 0.0]]


def test_the_inverse_cdf_picks_the_first_token_past_u_times_the_total():
    w = torch.tensor([0.0, 1.0, 0.0, 2.0, 1.0, 0.0])  # cumulative 0 1 1 3 4 4: boundaries at 1/4, 3/4
    u = torch.tensor([1e-9, 0.2499, 0.2501, 0.7499, 0.7501, 1 - 1e-9], dtype=torch.float64)
    assert sample(w.expand(6, 6), u).tolist() == [1, 1, 3, 3, 4, 4]
    assert sample(w * 1e-30, u[:1]).tolist() == [1]  # tiny totals: the grid scales by a power of two


def test_philox_broadcasts_counters_against_keys():
    """One counter under three keys (and three counters under one key) gives each pair's words, as alone."""
    keys, counter = row_keys([1, 2**40 + 7, 99]), torch.tensor([5, 6, 7, 0])  # (3, 2), (4,)
    words = philox4x32(counter, keys)  # (3, 4)
    assert words.shape == (3, 4)
    for b in range(3):
        assert torch.equal(words[b], philox4x32(counter, keys[b]))
    counters = torch.tensor([[0, 1, 2, 0], [3, 4, 5, 0], [6, 7, 8, 0]])  # (3, 4)
    assert torch.equal(philox4x32(counters, keys[0]), torch.stack([philox4x32(c, keys[0]) for c in counters]))


def test_a_samplers_keys_live_on_its_device():
    """The meta device shows a tensor left on the CPU without a GPU."""
    assert Sampler(SamplingParams(1.0), [1, 2], 2, "meta").keys.device.type == "meta"


def test_sample_takes_any_leading_shape():
    """Weights (..., V): one token per leading index, greedy (u None) and sampled alike."""
    g = torch.Generator().manual_seed(0)
    weights = torch.rand(2, 3, 5, generator=g)  # (2, 3, V)
    assert torch.equal(sample(weights), weights.argmax(-1))
    u = torch.rand(2, 3, generator=g, dtype=torch.float64)  # (2, 3)
    assert torch.equal(sample(weights, u), torch.stack([sample(w, v) for w, v in zip(weights, u)]))


def test_top_k_and_top_p_at_temperature_zero_are_named_in_one_warning():
    """Greedy ignores top-k and top-p: the warning names each setting given (and only those), once."""
    import warnings

    with pytest.warns(UserWarning) as caught:
        SamplingParams(0.0, top_k=5, top_p=0.9)
    assert len(caught) == 1 and "top_k=5" in str(caught[0].message) and "top_p=0.9" in str(caught[0].message)
    assert " them" in str(caught[0].message)
    with pytest.warns(UserWarning) as caught:
        SamplingParams(0.0, top_p=0.5)
    assert "top_p=0.5" in str(caught[0].message) and "top_k" not in str(caught[0].message)
    assert " it" in str(caught[0].message) and " them" not in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SamplingParams(0.0)
        SamplingParams(0.7, top_k=5, top_p=0.9)
