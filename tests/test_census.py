"""Tests for census_workloads: the SF1, SF1+ and PL94-171 person workloads."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest

import census_workloads as cw
from census_workloads.tables import kron
from hdmm.kron_union import kron_union
from hdmm.error import expected_error
from hdmm.matrix import Identity, Matrix
from hdmm.privacy import PureDP
from hdmm.workload import union

SF1_COUNTS = {
    "P1": 1,
    "P3": 8,
    "P4": 3,
    "P5": 17,
    "P8": 71,
    "P9": 73,
    "P10": 71,
    "P11": 73,
    "P12": 49,
    "P12A-I": 441,
    "PCT12": 209,
    "PCT12A-O": 3135,
}
PL94_COUNTS = {"P1": 71, "P2": 73, "P3": 71, "P4": 73}
N = 492_660

# sex: 0 male, 1 female; hispanic: 0 Hispanic, 1 not; race: OMB bit mask (code = mask - 1).
WHITE, BLACK, AIAN, ASIAN, NHPI, SOR = (1 << bit for bit in range(6))
TOY = [
    # sex, hispanic, race mask, relationship, age
    (1, 1, WHITE, 0, 23),
    (0, 1, WHITE | ASIAN, 1, 22),
    (1, 0, SOR, 2, 24),
    (1, 1, WHITE | ASIAN, 2, 5),
    (0, 0, WHITE, 0, 40),
    (1, 1, BLACK, 0, 17),
    (0, 1, WHITE | BLACK | AIAN, 11, 18),
    (1, 1, ASIAN, 15, 114),
    (1, 0, WHITE | ASIAN, 3, 22),
    (0, 1, 63, 16, 99),
]


def error(W: Matrix) -> float:
    """Expected total squared error of the identity strategy at epsilon = 1."""
    return float(expected_error(W, Identity(W.shape[1]), PureDP(1.0)))


def answers(W: Matrix, x: np.ndarray) -> dict[str, float]:
    """``W @ x`` keyed by row label."""
    return dict(zip(W.labels, W @ x))


@pytest.fixture(scope="module")
def x() -> np.ndarray:
    df = pd.DataFrame(TOY, columns=["sex", "hispanic", "race", "relationship", "age"])
    df["race"] -= 1
    return cw.cph_domain().vectorize(df)


@pytest.fixture(scope="module")
def sf1_answers(x: np.ndarray) -> dict[str, float]:
    return answers(cw.sf1_persons(), x)


# ------------------------------------------------------------------ schema
def test_domain() -> None:
    dom = cw.cph_domain()
    assert dom.names == ("sex", "hispanic", "race", "relationship", "age")
    assert dom.shape == (2, 2, 63, 17, 115)
    assert dom.size == N
    assert dom.values("race")[(WHITE | ASIAN) - 1] == "White; Asian"
    assert dom.values("race")[0] == "White" and dom.values("race")[62].count("; ") == 5
    assert dom.values("age")[-2:] == ("113", "114 and over")
    assert dom.values("relationship")[-1] == "Noninstitutionalized group quarters population"
    with_state = cw.cph_domain(state=True)
    assert with_state.names[-1] == "state" and with_state.size == 25_125_660
    states = with_state.values("state")
    assert (states[0], states[8], states[-1]) == ("Alabama", "District of Columbia", "Wyoming")
    codes = [code for code, _ in cw.STATES]
    assert codes == sorted(codes) and len(set(codes)) == 51


# ------------------------------------------------------------------ query counts
def test_table_query_counts() -> None:
    assert {name: W.shape[0] for name, W in cw.sf1_tables().items()} == SF1_COUNTS
    assert tuple(cw.sf1_tables()) == cw.SF1_TABLES
    assert {name: W.shape[0] for name, W in cw.pl94_tables().items()} == PL94_COUNTS
    assert tuple(cw.pl94_tables()) == cw.PL94_TABLES
    assert {name: W.shape for name, W in cw.sf1_tables(state=True).items()} == {
        name: (52 * m, 25_125_660) for name, m in SF1_COUNTS.items()
    }


def test_workload_sizes() -> None:
    assert cw.sf1_persons().shape == (4151, N)
    assert cw.pl94().shape == (288, N)
    assert cw.sf1_plus().shape == (215_852, 25_125_660)


def test_construction_is_fast_and_shares_factors() -> None:
    for build in (cw.sf1_persons, cw.sf1_plus):
        start = time.perf_counter()
        W = build()
        assert time.perf_counter() - start < 0.05
        # one distinct factor per predicate set, none wider than its attribute
        factors = kron_union(W).factors
        assert [len(f) for f in factors[:5]] == [3, 5, 4, 1, 4]
        assert all(f.shape[1] <= 115 for fs in factors for f in fs)
    assert cw.race2() is cw.race2() and cw.identity_total("sex") is cw.identity_total("sex")


# ------------------------------------------------------------------ answers on toy data
@pytest.mark.parametrize(
    "label, count",
    [
        ("P1: total", 10),
        ("P3: White alone", 2),
        ("P3: Asian alone", 1),
        ("P3: Some Other Race alone", 1),
        ("P3: Two or More Races", 5),
        ("P3: total", 10),
        ("P4: Hispanic or Latino", 3),
        ("P4: Not Hispanic or Latino", 7),
        ("P5: Hispanic or Latino, White alone", 1),
        ("P5: Hispanic or Latino, Two or More Races", 1),
        ("P5: Not Hispanic or Latino, Two or More Races", 4),
        ("P5: Not Hispanic or Latino", 7),
        ("P8: White; Asian", 3),
        ("P8: Population of one race", 5),
        ("P8: Two races", 3),
        ("P8: Three races", 1),
        ("P8: Six races", 1),
        ("P9: Hispanic or Latino", 3),
        ("P9: Not Hispanic or Latino, White; Asian", 2),
        ("P9: Not Hispanic or Latino, Two races", 2),
        ("P10: 18 years and over", 8),
        ("P10: White alone, 18 years and over", 2),
        ("P10: White; Asian, 18 years and over", 2),
        ("P10: Two or More Races, 18 years and over", 4),
        ("P11: Hispanic or Latino, 18 years and over", 3),
        ("P11: Not Hispanic or Latino, 18 years and over", 5),
        ("P12: female, 22 to 24 years", 3),
        ("P12: male, 22 to 24 years", 1),
        ("P12: female, 5 to 9 years", 1),
        ("P12: female, 15 to 17 years", 1),
        ("P12: male, 18 and 19 years", 1),
        ("P12: male, 85 years and over", 1),
        ("P12: female, 85 years and over", 1),
        ("P12: female", 6),
        ("P12: male", 4),
        ("P12: total", 10),
        ("P12A-I: female, Hispanic or Latino, 22 to 24 years", 2),
        ("P12A-I: female, Not Hispanic or Latino, White alone, 22 to 24 years", 1),
        ("P12A-I: female, Two or More Races, 22 to 24 years", 1),
        ("P12A-I: male, Two or More Races", 3),
        ("PCT12: female, 22 years", 1),
        ("PCT12: male, 22 years", 1),
        ("PCT12: female, 23 years", 1),
        ("PCT12: female, 5 years", 1),
        ("PCT12: male, 99 years", 1),
        ("PCT12: female, 110 years and over", 1),
        ("PCT12: female, 24 years", 1),
        ("PCT12: female, 21 years", 0),
        ("PCT12A-O: female, Not Hispanic or Latino, Asian alone, 110 years and over", 1),
        ("PCT12A-O: male, Not Hispanic or Latino, Two or More Races", 3),
        ("PCT12A-O: female, Hispanic or Latino", 2),
    ],
)
def test_toy_answers(sf1_answers: dict[str, float], label: str, count: int) -> None:
    assert sf1_answers[label] == count


def test_labels_are_unique(sf1_answers: dict[str, float]) -> None:
    assert len(sf1_answers) == 4151
    assert len(set(cw.pl94().labels)) == 288


def test_pl94_answers(x: np.ndarray) -> None:
    pl94 = answers(cw.pl94(), x)
    assert pl94["PL94 P1: total"] == 10
    assert pl94["PL94 P2: Not Hispanic or Latino, White; Asian"] == 2
    assert pl94["PL94 P4: Not Hispanic or Latino, Two or More Races, 18 years and over"] == 3
    # PL94 P1-P4 ask the queries of SF1 P8-P11, in another order
    sf1 = cw.sf1_tables()
    for pl, sf in zip(cw.PL94_TABLES, ("P8", "P9", "P10", "P11")):
        assert sorted(answers(cw.pl94_tables()[pl], x).items()) == sorted(answers(sf1[sf], x).items())


# ------------------------------------------------------------------ labels
def test_labels() -> None:
    tables = cw.sf1_tables()
    assert cw.sf1_persons().labels[0] == "P1: total"
    assert tables["P1"].labels[0] == "total"
    assert tables["P3"].labels[:] == [f"{r} alone" for r in cw.RACES] + ["Two or More Races", "total"]
    assert tables["P8"].labels[63:71] == [
        "Population of one race", "Two races", "Three races", "Four races", "Five races", "Six races",
        "Two or More Races", "total",
    ]
    assert tables["P8"].labels[(WHITE | ASIAN) - 1] == "White; Asian"
    assert tables["P12"].labels[7] == "male, 22 to 24 years"
    assert tables["P12"].labels[23 + 7] == "female, 22 to 24 years"
    assert tables["P12"].labels[46:] == ["male", "female", "total"]
    assert tables["PCT12"].labels[:2] == ["male, Under 1 year", "male, 1 year"]
    assert tables["PCT12"].labels[102] == "male, 110 years and over"
    assert tables["P12A-I"].labels[-1] == "Not Hispanic or Latino, White alone"
    assert cw.sf1_plus().labels[0] == "P1: Alabama"
    assert cw.sf1_plus().labels[51] == "P1: total"
    assert cw.sf1_plus().labels[-2] == "PCT12A-O: Not Hispanic or Latino, Two or More Races, Wyoming"
    assert cw.pl94().labels[1] == "PL94 P1: White alone"
    assert cw.age1().row_labels[4:8] == ("18 and 19 years", "20 years", "21 years", "22 to 24 years")
    assert cw.age1().row_labels[15:19] == (
        "60 and 61 years", "62 to 64 years", "65 and 66 years", "67 to 69 years",
    )
    assert cw.age1().row_labels[-1] == "85 years and over"
    assert cw.age3().row_labels[-4:] == (
        "99 years", "100 to 104 years", "105 to 109 years", "110 years and over",
    )
    assert cw.adult().row_labels == ("18 years and over",)


# ------------------------------------------------------------------ predicate sets
PREDICATE_SETS: dict[str, tuple[Callable[[], Matrix], int, bool]] = {
    # name: (factory, number of queries, is a partition of the values)
    "total": (lambda: cw.total("race"), 1, True),
    "sex identity": (lambda: cw.identity("sex"), 2, True),
    "sex identity total": (lambda: cw.identity_total("sex"), 3, False),
    "hispanic identity": (lambda: cw.identity("hispanic"), 2, True),
    "hispanic identity total": (lambda: cw.identity_total("hispanic"), 3, False),
    "hispanic": (cw.hispanic, 1, False),
    "not hispanic": (cw.not_hispanic, 1, False),
    "race1": (cw.race1, 7, True),
    "race2": (cw.race2, 70, False),
    "white alone": (cw.white_alone, 1, False),
    "adult": (cw.adult, 1, False),
    "age1": (cw.age1, 23, True),
    "age3": (cw.age3, 103, True),
    "state identity total": (lambda: cw.identity_total("state"), 52, False),
}


@pytest.mark.parametrize("name", PREDICATE_SETS)
def test_predicate_sets(name: str) -> None:
    build, rows, partition = PREDICATE_SETS[name]
    M = build().dense()
    assert M.shape[0] == rows
    assert set(np.unique(M)) <= {0.0, 1.0}
    assert np.all(M.sum(axis=1) >= 1)
    assert np.all(M.sum(axis=0) == 1) == partition


def test_race_sets() -> None:
    masks = np.arange(1, 64)
    race2 = cw.race2().dense()
    np.testing.assert_array_equal(race2[:63], np.eye(63))
    np.testing.assert_array_equal(race2[63:69].sum(axis=0), np.ones(63))
    counts = np.array([bin(m).count("1") for m in masks])
    np.testing.assert_array_equal(race2[63:69].argmax(axis=0) + 1, counts)
    np.testing.assert_array_equal(race2[69], counts >= 2)
    np.testing.assert_array_equal(cw.race1().dense()[-1], race2[69])
    np.testing.assert_array_equal(cw.white_alone().dense()[0], masks == WHITE)
    np.testing.assert_array_equal(cw.adult().dense()[0], np.arange(115) >= 18)


# ------------------------------------------------------------------ weights
def test_table_weights(x: np.ndarray) -> None:
    plain, weighted = cw.sf1_persons() @ x, cw.sf1_persons(weights={"P1": 2.0, "P12": 0.5}) @ x
    scale = np.ones(4151)
    scale[0] = 2.0
    start = sum(SF1_COUNTS[name] for name in cw.SF1_TABLES[: cw.SF1_TABLES.index("P12")])
    scale[start : start + 49] = 0.5
    np.testing.assert_array_equal(weighted, scale * plain)
    assert cw.pl94(weights={"P3": 3.0}).labels[-1] == cw.pl94().labels[-1]
    with pytest.raises(ValueError, match=r"unknown table name.*'P2'.*PCT12A-O"):
        cw.sf1_persons(weights={"P2": 1.0})
    with pytest.raises(ValueError, match="unknown table name"):
        cw.pl94(weights={"P8": 1.0})


def test_unknown_attribute() -> None:
    with pytest.raises(ValueError, match=r"unknown attributes \['state'\]"):
        kron({"state": cw.identity("state")})
    assert kron({"state": cw.identity("state")}, state=True).shape == (51, 25_125_660)


def test_pl94_inside_sf1(x: np.ndarray) -> None:
    c = 3.0
    W = union([cw.sf1_persons(), cw.pl94()], weights=[1.0, c])
    assert W.shape == (4151 + 288, N)
    assert W.labels[4151] == "PL94 P1: total"
    np.testing.assert_array_equal(W @ x, np.concatenate([cw.sf1_persons() @ x, c * (cw.pl94() @ x)]))
    assert error(W) == pytest.approx(error(cw.sf1_persons()) + c**2 * error(cw.pl94()))


# ------------------------------------------------------------------ expected error
def test_identity_error() -> None:
    W = cw.sf1_persons()
    start = time.perf_counter()
    total = error(W)
    assert time.perf_counter() - start < 0.5
    # Laplace variance 2 at sensitivity 1, times ||W||_F^2 = number of (query, cell) incidences
    reference = 2.0 * float((W @ np.ones(N)).sum())
    assert np.isfinite(total) and total == pytest.approx(reference)
    assert total == pytest.approx(sum(error(T) for T in cw.sf1_tables().values()))
    assert error(cw.sf1_persons(weights={"P1": 3.0})) == pytest.approx(total + 8 * 2.0 * N)
    # each state column is counted twice by the state IdentityTotal (its state and the nation)
    assert error(cw.sf1_plus()) == pytest.approx(2 * 51 * total)
