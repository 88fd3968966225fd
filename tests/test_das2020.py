"""The 2020 DAS PL94 histogram and tables (census_workloads.pl94_2020) and the production budget
(census_workloads.das2020): every fact against census_workloads/data/das2020_pl94.md, the
reconciliation with the CPH-domain PL94 tables, and the noise equivalence with hdmm's ZCDP."""

import math
import warnings
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

import hdmm
from census_workloads import cph_domain, pl94_tables
from census_workloads.das2020 import PL94_2020, LevelAllocation, ProductionConfig, production_pl94
from census_workloads.pl94_2020 import (
    CENRACE_MASKS,
    DAS_QUERIES,
    HHGQ,
    P5_CPH_ROWS,
    cph_to_pl94_2020,
    das_query,
    p5_cph,
    pl94_2020,
    pl94_2020_domain,
    pl94_2020_tables,
)
from census_workloads.schema import RACES, RELATIONSHIP
from hdmm.budget import Budget

RHO = Fraction(293764, 114921)


# ---------------------------------------------------------------------- the histogram
def test_domain_is_the_das_pl94_2020_histogram():
    d = pl94_2020_domain()
    assert d.names == ("hhgq", "votingage", "hispanic", "cenrace") and d.shape == (8, 2, 2, 63) and d.size == 2016
    assert d.values("hhgq")[0] == "Household" and d.values("hhgq")[7] == "Other noninstitutional facilities"
    assert d.values("votingage") == ("17 and under", "18 and over")
    assert d.values("hispanic") == ("Not Hispanic or Latino", "Hispanic or Latino")


def test_cenrace_codes_follow_the_das_order():
    w, b, ai, a, nh, so = (1 << k for k in range(len(RACES)))
    # cenrace.py: 0 white, 5 sor, 6 white-black, 10 white-sor, 11 black-aian, 20 nhopi-sor,
    # 21 white-black-aian, 41 white-black-aian-asian, 56 white-black-aian-asian-nhopi, 62 all six
    expected = {0: w, 5: so, 6: w | b, 10: w | so, 11: b | ai, 20: nh | so, 21: w | b | ai, 40: a | nh | so,
                41: w | b | ai | a, 55: ai | a | nh | so, 56: w | b | ai | a | nh, 61: b | ai | a | nh | so, 62: 63}
    assert {k: CENRACE_MASKS[k] for k in expected} == expected
    assert sorted(CENRACE_MASKS) == list(range(1, 64))
    counts = [m.bit_count() for m in CENRACE_MASKS]
    assert counts == sorted(counts)
    assert pl94_2020_domain().values("cenrace")[8] == "White; Asian"


@pytest.mark.parametrize("name, rows", [("total", 1), ("cenrace", 63), ("hispanic", 2), ("votingage", 2),
                                        ("hhinstlevels", 3), ("hhgq", 8), ("hispanic * cenrace", 126),
                                        ("votingage * cenrace", 126), ("votingage * hispanic", 4),
                                        ("votingage * hispanic * cenrace", 252), ("detailed", 2016)])
def test_das_queries_are_partitions(name, rows):
    Q = das_query(name).dense()
    assert Q.shape == (rows, 2016)
    assert set(np.unique(Q)) <= {0.0, 1.0} and np.all(Q.sum(axis=0) == 1)


def test_das_query_contents():
    cells = np.array(np.unravel_index(np.arange(2016), (8, 2, 2, 63)))
    hhinst = das_query("hhinstlevels").dense()
    assert [set(np.unique(cells[0][row == 1])) for row in hhinst] == [{0}, {1, 2, 3, 4}, {5, 6, 7}]
    assert np.array_equal(das_query("detailed").dense(), np.eye(2016))
    vh = das_query("votingage * hispanic").dense()
    assert np.array_equal(vh.argmax(axis=0), 2 * cells[1] + cells[2])
    with pytest.raises(ValueError, match="unknown DAS query"):
        das_query("sex")


# ---------------------------------------------------------------------- the tables, reconciled
@pytest.fixture(scope="module")
def histograms():
    rng = np.random.default_rng(23)
    x = rng.poisson(0.02, cph_domain().size).astype(float)
    x[rng.integers(0, x.size, 50)] += 1000  # a few large cells
    return x, cph_to_pl94_2020() @ x


def test_cph_map_moves_each_cell_where_it_belongs():
    M = cph_to_pl94_2020(institutional=2, noninstitutional=6)
    cph = cph_domain()
    # a Hispanic (CPH code 0) female, White and Asian (mask 9 = code 8), aged 17, institutionalized
    cell = np.ravel_multi_index((1, 0, 8, RELATIONSHIP.index("Institutionalized group quarters population"), 17),
                                cph.shape)
    das = np.ravel_multi_index((2, 0, 1, CENRACE_MASKS.index(9)), (8, 2, 2, 63))
    assert M[das, cell] == 1 and M[:, cell].sum() == 1
    spouse = np.ravel_multi_index((0, 1, 0, RELATIONSHIP.index("Husband or wife"), 40), cph.shape)
    assert M[np.ravel_multi_index((0, 1, 0, 0), (8, 2, 2, 63)), spouse] == 1
    with pytest.raises(ValueError, match="institutional must be one of"):
        cph_to_pl94_2020(institutional=5)


@pytest.mark.parametrize("table", ["P1", "P2", "P3", "P4"])
def test_p1_to_p4_answer_alike_on_both_domains(table, histograms):
    x, x_das = histograms
    cph, das = pl94_tables()[table], pl94_2020_tables()[table]
    assert cph.shape[0] == das.shape[0]
    np.testing.assert_array_equal(cph @ x, das @ x_das)
    for a, b in zip(cph.labels, das.labels):  # the same conditions, in each domain's attribute order
        assert set(a.split(", ")) == set(b.split(", "))


def test_p5_totals_match_the_cph_and_the_types_add_up(histograms):
    x, x_das = histograms
    p5 = pl94_2020_tables()["P5"] @ x_das
    assert p5.shape == (10,)
    np.testing.assert_array_equal(p5[list(P5_CPH_ROWS)], p5_cph() @ x)
    assert p5[0] == p5[1] + p5[6] and p5[1] == p5[2:6].sum() and p5[6] == p5[7:10].sum()
    assert list(pl94_2020_tables()["P5"].labels)[2:6] == list(HHGQ[1:5])


def test_das_queries_without_gq_types_are_cph_queries(histograms):
    x, x_das = histograms
    M = cph_to_pl94_2020()
    other = cph_to_pl94_2020(institutional=1, noninstitutional=5)
    for q in DAS_QUERIES:  # a query of the CPH domain iff it does not depend on the chosen types
        same = np.array_equal(das_query(q) @ (M @ x), das_query(q) @ (other @ x))
        assert same == (q not in ("hhgq", "detailed"))


def test_pl94_2020_union():
    W = pl94_2020(weights={"P5": 2.0})
    assert W.shape == (298, 2016) and W.labels[-1] == "PL94 P5: Other noninstitutional facilities"
    with pytest.raises(ValueError, match="unknown table"):
        pl94_2020(weights={"P6": 1.0})


# ---------------------------------------------------------------------- the production budget
def _same_row(query):
    """Q^T Q for a partition query Q: 1 where two cells are counted by the same row."""
    g = das_query(query).dense().argmax(axis=0)
    return (g[:, None] == g[None, :]).astype(float)


def test_production_facts():
    c = production_pl94()
    assert c is PL94_2020 and c.rho == RHO and isinstance(c.rho, Fraction) and c.delta == 1e-10
    assert c.level_names == ("nation", "state", "county", "tract", "block_group", "block")
    assert [a.das_name for a in c.levels] == ["US", "State", "County", "Tract", "Block_Group", "Block"]
    assert [a.share * 4099 for a in c.levels] == [104, 1440, 447, 687, 1256, 165]
    assert "total" not in c.level("US").queries and c.level("nation").queries == DAS_QUERIES[1:]
    assert dict(zip(c.level("County").queries, c.level("County").query_shares))["total"] == Fraction(3126, 4097)
    assert c.level("block").query_shares[-1] == Fraction(3945, 4097)
    assert c.level("tract").query_shares[6] == Fraction(1933, 4102)  # hispanic * cenrace
    assert c.level("nation").query_shares[-2:] == (Fraction(26, 241), Fraction(189, 241))
    assert all(sum(a.query_shares) == 1 for a in c.levels)
    assert sum(c.query_rho(a.level, q) for a in c.levels for q in a.queries) == RHO
    assert c.query_rho("nation", "total") == 0
    assert round(c.epsilon(), 2) == 17.14
    with pytest.raises(ValueError, match="unknown level"):
        c.level("place")


@pytest.mark.parametrize("level, sigma", [("state", 1.0996), ("county", 2.1683), ("tract", 2.4719),
                                          ("block_group", 1.7519), ("block", 89.237)])
def test_total_population_sigma(level, sigma):
    a = PL94_2020.level(level)
    share = dict(zip(a.queries, a.query_shares))["total"]
    assert PL94_2020.variance(level, "total") == Fraction(114921, 293764) / (a.share * share)
    assert PL94_2020.sigma(level) == pytest.approx(sigma, abs=5e-4)
    with pytest.raises(ValueError, match="does not measure"):
        PL94_2020.variance("nation", "total")


def test_combined_total_sigma_is_the_gls_variance():
    # the orbit reduction against the dense 2,016 x 2,016 precision matrix (county)
    level = "county"
    a = PL94_2020.level(level)
    P = sum(float(PL94_2020.query_rho(level, q)) * _same_row(q) for q in a.queries)  # sum of rho_q Q_q^T Q_q
    dense = math.sqrt(np.ones(2016) @ np.linalg.solve(P, np.ones(2016)))
    assert PL94_2020.combined_total_sigma(level) == pytest.approx(dense, rel=1e-10)
    got = {lv: round(PL94_2020.combined_total_sigma(lv), 3) for lv in PL94_2020.level_names}
    assert got == {"nation": 34.988, "state": 1.098, "county": 2.162, "tract": 2.452, "block_group": 1.745,
                   "block": 49.09}


@pytest.mark.parametrize("level", ["nation", "county", "block"])
def test_strategy_gives_production_noise_under_hdmm_zcdp(level):
    a = PL94_2020.level(level)
    A = PL94_2020.strategy(level)
    assert A.shape == (sum(das_query(q).shape[0] for q in a.queries), 2016)
    assert A.sensitivity(2) == pytest.approx(1.0, rel=1e-12)
    dense, row = A.dense(), 0
    for q, s in zip(a.queries, a.query_shares):  # the blocks: sqrt(s_q) Q_q, in order
        Q = das_query(q).dense()
        np.testing.assert_allclose(dense[row:row + Q.shape[0]], math.sqrt(s) * Q, rtol=1e-15)
        row += Q.shape[0]
    privacy = PL94_2020.hdmm_privacy(level)
    assert privacy.rho == RHO * a.share / 2 and isinstance(privacy.rho, Fraction)
    for q, s in zip(a.queries, a.query_shares):  # noise of Q_q's answers = row noise / s_q
        assert privacy.noise_variance(1.0) / float(s) == pytest.approx(float(PL94_2020.variance(level, q)), rel=1e-12)


def test_measured_noise_has_production_variance():
    level = "county"
    a = PL94_2020.level(level)
    A = PL94_2020.strategy(level)
    x = np.zeros(2016, dtype=np.int64)
    x[[3, 700, 2015]] = [5, 40, 2]
    truth = np.concatenate([das_query(q) @ x for q in a.queries])
    scale = np.concatenate([np.full(das_query(q).shape[0], math.sqrt(s)) for q, s in zip(a.queries, a.query_shares)])
    sd = np.concatenate([np.full(das_query(q).shape[0], PL94_2020.sigma(level, q)) for q in a.queries])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        z = np.array([(hdmm.measure(A, x, PL94_2020.hdmm_privacy(level), rng=i).answers / scale - truth) / sd
                      for i in range(30)])
    assert z.size == 30 * 2603
    assert abs(np.mean(z**2) - 1) < 0.03 and abs(np.mean(z)) < 0.03


def test_hdmm_terms_add_up():
    c = PL94_2020
    assert c.hdmm_rho() == Fraction(146882, 114921) == sum(c.hdmm_rho(lv) for lv in c.level_names)
    w = c.level_weights()
    assert sum(v**2 for v in w.values()) == pytest.approx(1.0, rel=1e-15)
    budget = Budget(c.hdmm_privacy())
    for lv in c.level_names:
        budget.charge(c.hdmm_privacy(lv), workload=lv)
    assert budget.remaining_exact == 0
    # one unit per level, weighted by sqrt(g_l): the stacked strategy has sensitivity 1
    stacked = hdmm.matrix.VStack([hdmm.matrix.Weighted(c.strategy(lv), w[lv]) for lv in c.level_names])
    assert stacked.sensitivity(2) == pytest.approx(1.0, rel=1e-12)


def test_allocation_table():
    t = PL94_2020.allocation()
    assert len(t) == 10 + 5 * 11
    assert sum(t["rho"]) == RHO and sum(t["hdmm_rho"]) == RHO / 2
    row = t[(t.level == "tract") & (t["query"] == "total")].iloc[0]
    assert row.sigma == pytest.approx(2.4719, abs=5e-4)


def test_config_validation():
    good = PL94_2020.level("county")
    with pytest.raises(ValueError, match="adding up to 1"):
        LevelAllocation("County", "county", Fraction(1), ("total",), (Fraction(1, 2),))
    with pytest.raises(ValueError, match="unknown queries"):
        LevelAllocation("County", "county", Fraction(1), ("sex",), (Fraction(1),))
    with pytest.raises(ValueError, match="add up to 1"):
        ProductionConfig("x", RHO, 1e-10, (good,))
    with pytest.raises(ValueError, match="positive Fraction"):
        ProductionConfig("x", 2.5, 1e-10, (LevelAllocation("County", "county", Fraction(1), good.queries,
                                                           good.query_shares),))


def test_pl94_histograms_map_a_cph_source_cell_by_cell():
    import scipy.sparse as sp

    from census_workloads.pl94_2020 import PL94Histograms, cph_to_pl94_2020
    from hdmm.georelease import ArrayHistograms

    rng = np.random.default_rng(0)
    H = sp.random(4, 492_660, density=1e-4, random_state=1, format="csr")
    H.data = rng.integers(1, 5, H.nnz).astype(float)
    mapped = PL94Histograms(ArrayHistograms(H))
    assert mapped.person_cells == 2016
    np.testing.assert_array_equal(mapped.leaf_totals(), np.asarray(H.sum(axis=1)).ravel())
    np.testing.assert_array_equal(mapped.histograms(1, 3).toarray(), (cph_to_pl94_2020() @ H[1:3].T).T.toarray())


def test_pl94_2020_records_map_record_by_record_as_the_histograms_do():
    from census_workloads import cph_domain, synthetic_persons
    from census_workloads.pl94_2020 import cph_to_pl94_2020, pl94_2020_domain, pl94_2020_records

    people = synthetic_persons(3000, seed=2).assign(state="06")
    mapped = pl94_2020_records(people)
    assert list(mapped.columns) == ["hhgq", "votingage", "hispanic", "cenrace", "state"]
    np.testing.assert_array_equal(pl94_2020_domain().vectorize(mapped.drop(columns="state")),
                                  cph_to_pl94_2020() @ cph_domain().vectorize(people.drop(columns="state")))


def test_the_command_line_releases_the_2020_tables_on_synthetic_people(tmp_path, capsys):
    from hdmm.cli import main

    out = tmp_path / "pl94.csv"
    assert main(["release", "--workload", "pl94-2020", "--rho", "146882/114921", "--people", "3000",
                 "--noise-seed", "1", "--postprocess", "integer", "--output", str(out)]) == 0
    assert "P5" in capsys.readouterr().out
    assert len(pd.read_csv(out)) == 298
