"""Issue 22, items 11 and 13: direct Counts are checked, the exact-probability search ends, absurd privacy is
refused, and the command line speaks in flags."""

from __future__ import annotations

import json
import time

import numpy as np
import pandas as pd
import pytest

import hdmm
from hdmm import kernel
from hdmm.kernel import Counts
from hdmm.cli import in_cli_words
from hdmm.noise import _Probability
from hdmm.planning import Plan
from cli_files import fails


# ------------------------------------------------------------------ Counts built directly
@pytest.mark.parametrize("bad, match", [
    ([1.0, 2e15, 3.0], "MAX_COUNT"),
    ([1.0, -1.0], "negative"),
    ([1.0, float("nan")], "NaN"),
    ([[1.0, 2.0]], "1-D"),
])
def test_counts_built_directly_are_checked(bad, match):
    with pytest.raises(ValueError, match=match):
        Counts(np.array(bad))


def test_direct_counts_cannot_smuggle_a_count_above_the_cap_into_measure():
    p = hdmm.plan(hdmm.Identity(2), hdmm.Identity(2), hdmm.PureDP(1.0))
    with pytest.raises(ValueError, match="MAX_COUNT"):
        hdmm.measure(p, Counts(np.array([1.0, 1e16])), rng=0)


def test_counts_check_scans_the_data_once(monkeypatch):
    calls = []
    original = kernel.check_data_vector

    def counting(x, n):
        calls.append(n)
        return original(x, n)

    monkeypatch.setattr(kernel, "check_data_vector", counting)
    counts = Counts.check([1, 2, 3], 3)
    assert calls == [3] and counts.values.dtype == np.float64
    with pytest.raises(ValueError, match="3 entries but the domain has 4"):
        Counts.check([1, 2, 3], 4)


# ------------------------------------------------------------------ the exact-probability search
def test_a_probability_that_is_an_exact_dyadic_number_raises_instead_of_looping():
    # p = 1/2 known only through intervals that always straddle it: floor(p * 2**1) = 1 is never decided
    def straddling(bits: int) -> tuple[int, int]:
        half = 1 << (bits - 1)
        return half - 1, half + 1

    p = _Probability(straddling)
    start = time.perf_counter()
    with pytest.raises(ArithmeticError, match="undecided"):
        p.bits(1)
    assert time.perf_counter() - start < 5.0


def test_an_irrational_probability_is_still_decided():
    p = _Probability(lambda bits: ((1 << bits) // 3, (1 << bits) // 3 + 1))  # 1/3, never dyadic
    assert p.bits(4) == 5  # floor(16 / 3)


# ------------------------------------------------------------------ absurd privacy parameters
@pytest.mark.parametrize("privacy", [hdmm.PureDP(1e308), hdmm.PureDP(1e12), hdmm.ZCDP(1e300)])
def test_privacy_that_leaves_no_noise_is_refused_before_any_noise(privacy, monkeypatch):
    drawn = []
    monkeypatch.setattr(kernel, "draw", lambda *a, **k: drawn.append(a))
    with pytest.raises(ValueError, match="below one step"):
        hdmm.run(hdmm.Prefix(4), np.array([3.0, 1, 4, 1]), privacy, strategy=hdmm.Identity(4), rng=0)
    with pytest.raises(ValueError, match="below one step"):
        privacy.sample(3, 1.0, rng=0)
    assert drawn == []


def test_approx_dp_with_a_huge_epsilon_ends():
    start = time.perf_counter()
    try:
        privacy = hdmm.ApproxDP(1e300, 1e-9)
    except ValueError as exc:  # refused as uncomputable is fine too
        assert "epsilon" in str(exc)
    else:
        with pytest.raises(ValueError, match="below one step"):
            hdmm.plan(hdmm.Prefix(4), hdmm.Identity(4), privacy)
    assert time.perf_counter() - start < 5.0


def test_large_but_meaningful_parameters_still_release():
    release = hdmm.run(hdmm.Prefix(4), np.array([3.0, 1, 4, 1]), hdmm.ZCDP(1e8), strategy=hdmm.Identity(4), rng=0)
    np.testing.assert_allclose(release.answers, [3, 4, 8, 9], atol=0.01)


# ------------------------------------------------------------------ the command line's words
REGIONS = {"domain": {"region": [str(k) for k in range(1, 10)], "sex": ["f", "m"]},
           "queries": [{"name": "region by sex", "region": "identity", "sex": "identity"}]}


def test_the_python_api_speaks_python_and_the_cli_speaks_flags(tmp_path, capsys):
    domain = hdmm.Domain.from_dict(REGIONS["domain"])
    ambiguous = pd.DataFrame({"region": [1, 2, 8], "sex": ["f", "m", "f"]})
    with pytest.raises(ValueError) as api:
        domain.vectorize(ambiguous)
    assert "codes=True" in str(api.value) and "--codes" not in str(api.value) and "--labels" not in str(api.value)

    workload = tmp_path / "w.json"
    workload.write_text(json.dumps(REGIONS))
    data = tmp_path / "ambiguous.csv"
    ambiguous.to_csv(data, index=False)
    base = ["release", "--workload", str(workload), "--epsilon", "1", "--strategy", "identity", "--data", str(data)]
    message = fails(base, capsys)
    assert "--labels" in message and "--codes" in message and "codes=True" not in message
    data.write_text("region,sex\n1,f\n12,m\n")  # codes out of range under --codes
    message = fails([*base, "--codes"], capsys)
    assert "codes=True" not in message and "--codes" in message


def test_in_cli_words_leaves_other_messages_alone():
    assert in_cli_words("the data vector holds 2 negative entries") == "the data vector holds 2 negative entries"


def test_an_uncomputable_approx_dp_suggests_the_rho_flag_on_the_command_line(capsys):
    message = fails(["release", "--workload", "pl94", "--epsilon", "1e300", "--delta", "1e-9", "--people", "100"],
                    capsys)
    assert "--rho" in message and "ZCDP" not in message


def test_the_plan_rmse_is_hdmm_rmse_of_the_unweighted_queries():
    parts = [hdmm.Prefix(8), hdmm.Total(8)]
    weighted = hdmm.union(parts, weights=[1.0, 10.0])
    p = hdmm.plan(weighted, hdmm.Identity(8), hdmm.PureDP(1.0))
    counts = float(hdmm.rmse(hdmm.union(parts), hdmm.Identity(8), hdmm.PureDP(1.0)))
    assert p.rmse == pytest.approx(counts, rel=1e-6)
    assert float(hdmm.rmse(weighted, hdmm.Identity(8), hdmm.PureDP(1.0))) > 4 * p.rmse  # weighted rows
    assert "unweighted" in Plan.rmse.__doc__ and "weights included" in hdmm.rmse.__doc__
