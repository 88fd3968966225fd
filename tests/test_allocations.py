"""Production's PL94 allocation against hdmm's (census_workloads.allocations)."""

import itertools

import numpy as np
import pytest

from census_workloads.allocations import bounded_factor, compare_allocations, total_first
from census_workloads.das2020 import PL94_2020
from census_workloads.pl94_2020 import pl94_2020
from hdmm.matrix import Explicit


def _brute_force(A: np.ndarray) -> float:
    """max over one record added/removed (a column) or changed (two columns), squared, over the add/remove one."""
    columns = [A[:, j] for j in range(A.shape[1])]
    add = max(float(c @ c) for c in columns)
    change = max(float((a - b) @ (a - b)) for a, b in itertools.permutations(columns, 2))
    # a record that changes unit at every level: a_i in one unit, -a_j in another
    return max(change, 2 * add) / add


@pytest.mark.parametrize("seed", range(5))
def test_bounded_factor_matches_brute_force(seed):
    A = np.random.default_rng(seed).normal(size=(4, 5))
    assert bounded_factor(Explicit(A)) == pytest.approx(_brute_force(A), rel=1e-12)


def test_bounded_factor_of_partitions_is_two_and_of_helmert_residuals_more():
    assert bounded_factor(PL94_2020.strategy("tract")) == pytest.approx(2.0, abs=1e-12)
    helmert = np.array([[1.0, -1.0, 0.0], [1.0, 1.0, -2.0]]) / np.sqrt([[2.0], [6.0]])
    assert bounded_factor(Explicit(helmert)) == pytest.approx(3.0)  # columns 0 and 2 are 1.5 apart, squared


def test_total_first_puts_a_weighted_total_on_top():
    W = pl94_2020()
    steered = total_first(W, 10.0)
    x = np.arange(W.shape[1], dtype=float)
    assert steered.shape == (W.shape[0] + 1, W.shape[1])
    np.testing.assert_allclose((steered @ x)[1:], W @ x)
    assert (steered @ x)[0] == pytest.approx(10.0 * x.sum())


@pytest.mark.slow
def test_compare_allocations_on_a_small_tree():
    from hdmm.geography import GeographyTree

    tree = GeographyTree.from_parents({"a": "US", "b": "US", "a1": "a", "a2": "a", "b1": "b"},
                                      ["nation", "state", "county"])
    df = compare_allocations(tree)
    assert list(df["level"]) == ["nation", "state", "county", "level-weighted"]
    # production's own measurements: the state total's sigma is the configuration's (shares of 3 levels' budget)
    shares = sum(PL94_2020.level(name).share for name in tree.levels)
    state = df.set_index("level").loc["state"]
    rho = float(PL94_2020.rho * shares) * float(PL94_2020.level("state").share / shares)
    assert state["production total sd"] <= 1 / np.sqrt(rho * 3773 / 4097) + 1e-9  # GLS at most the total query's
    assert (df["hdmm RMSE"] > 0).all() and "ZCDP" in df.attrs["privacy"]
    assert df["hdmm / production"].iloc[-1] < 1
