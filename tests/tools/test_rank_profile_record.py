"""The measured acceptance profile in the package is the one scripts/tree_bench.py --profile recorded (issue 23)."""

import json
from pathlib import Path

import pytest

from minispec.roofline import EMBEDDED_PROFILE, profile

RECORD = Path(__file__).parents[2] / "results" / "cpu" / "rank_profile.json"


def test_the_package_constants_are_the_recorded_measurement():
    """Counts, made non-increasing in rank, over every position and split by the previous position's rank: a rerun
    that changes the profile must change the constants too (or this fails)."""
    rec = json.loads(RECORD.read_text())
    for (n, counts), row, positions in ((profile._EMBEDDED_ALL, rec["profile"], rec["positions"]),
                                        (profile._EMBEDDED_AFTER_FIRST, rec["after_rank0"],
                                         rec["positions_after_rank0"]),
                                        (profile._EMBEDDED_AFTER_OTHER, rec["after_other"],
                                         rec["positions_after_other"])):
        assert n == positions
        assert [c / n for c in counts] + [0.0] * (len(row) - len(counts)) == pytest.approx(row, abs=1e-6)  # float32
    assert EMBEDDED_PROFILE.after_first[0] == pytest.approx(rec["p_rank0_after_rank0"])
    assert EMBEDDED_PROFILE.after_other[0] == pytest.approx(rec["p_rank0_after_other"])
    assert rec["positions_after_rank0"] + rec["positions_after_other"] == rec["positions"] - 64  # 64 rows' firsts
