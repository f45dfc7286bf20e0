"""Stats.to_dict, the row benchmarks and serve-bench write as JSON: every derived metric under its name, the per-row
lists left out, and NaN (a metric with nothing to measure) written as null, so the row is strict JSON."""

import json
import math

from support import random_model

import minispec


def test_a_stats_row_names_every_metric_and_is_strict_json():
    target, draft = random_model(seed=0), random_model(seed=1, layers=1, hidden=32, heads=2, kv_heads=1)
    prompts = [[1, 2, 3], [4, 5]]
    spec = minispec.speculative_generate(target, draft, prompts, gamma=3, max_new_tokens=6).stats
    d = spec.to_dict()
    for name in ("acceptance_rate", "node_acceptance_rate", "mean_acceptance_length", "alpha_estimate",
                 "tpot_mean_s"):
        value = getattr(spec, name)
        assert d[name] == (None if isinstance(value, float) and math.isnan(value) else value), name
    assert "row_tokens" not in d and "row_tpot_s" not in d  # per-row lists stay out of a row
    one = minispec.generate(target, [[1, 2, 3]], max_new_tokens=1).stats  # one token: no TPOT to measure
    assert math.isnan(one.tpot_mean_s)
    row = one.to_dict()
    assert row["tpot_mean_s"] is None
    json.dumps(row, allow_nan=False)  # strict JSON: no NaN left
    json.dumps(d, allow_nan=False)
