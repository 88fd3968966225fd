"""Tests for the built-in data: census_workloads.synthetic_persons and hdmm.datasets."""

import fnmatch
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import census_workloads as cw
from census_workloads.synthetic import RELATIONSHIP_MIN_AGE
from hdmm import Domain
from hdmm.datasets import load_adult

N = 1_000_000  # large enough for shares within ~0.1 percentage point, drawn in ~0.1 s


@pytest.fixture(scope="module")
def persons() -> pd.DataFrame:
    return cw.synthetic_persons(N, seed=2010, states=True)


@pytest.fixture(scope="module")
def codes(persons: pd.DataFrame) -> dict[str, np.ndarray]:
    return {name: persons[name].cat.codes.to_numpy() for name in persons.columns}


def percent(mask: np.ndarray) -> float:
    return 100.0 * mask.mean()


# ------------------------------------------------------------ synthetic_persons
def test_columns_are_the_cph_domain(persons: pd.DataFrame) -> None:
    for states, df in ((True, persons), (False, cw.synthetic_persons(10, seed=1))):
        domain = cw.cph_domain(state=states)
        assert tuple(df.columns) == domain.names
        assert isinstance(df.index, pd.RangeIndex) and len(df) == (N if states else 10)
        for name in domain.names:
            assert isinstance(df[name].dtype, pd.CategoricalDtype)
            assert tuple(df[name].cat.categories) == domain.values(name)
    assert persons.memory_usage(deep=False).sum() < 8 * N


def test_vectorizes_to_n_records(persons: pd.DataFrame) -> None:
    x = cw.cph_domain(state=True).vectorize(persons)
    assert x.shape == (25_125_660,) and x.sum() == N
    national = cw.cph_domain().vectorize(persons)
    np.testing.assert_array_equal(national, x.reshape(-1, 51).sum(axis=1))
    with pytest.warns(UserWarning, match="no records"):
        assert cw.cph_domain().vectorize(cw.synthetic_persons(0)).sum() == 0


def test_reproducible_with_a_seed() -> None:
    a = cw.synthetic_persons(2000, seed=7, states=True)
    pd.testing.assert_frame_equal(a, cw.synthetic_persons(2000, seed=7, states=True))
    assert not a.equals(cw.synthetic_persons(2000, seed=8, states=True))
    assert not cw.synthetic_persons(2000).equals(cw.synthetic_persons(2000))  # OS entropy
    pd.testing.assert_frame_equal(  # a Generator is accepted as the seed
        cw.synthetic_persons(50, seed=np.random.default_rng(3)),
        cw.synthetic_persons(50, seed=3),
    )


def test_rows_are_shuffled(codes: dict[str, np.ndarray]) -> None:
    age = codes["age"][:1000]
    assert (np.diff(age) < 0).any() and (np.diff(age) > 0).any()
    assert (np.diff(codes["state"]) >= 0).all()  # state-ordered, as documented


# Published 2010 Census shares (percent) and the tolerance of the comparison.
@pytest.mark.parametrize(
    ("name", "share", "target", "tolerance"),
    [
        ("male", lambda c: c["sex"] == 0, 49.2, 0.3),
        ("Hispanic or Latino", lambda c: c["hispanic"] == 0, 16.3, 0.3),
        ("under 18", lambda c: c["age"] < 18, 24.0, 0.3),
        ("65 and over", lambda c: c["age"] >= 65, 13.0, 0.3),
        ("White alone", lambda c: c["race"] == 0, 72.4, 0.3),
        ("Black alone", lambda c: c["race"] == 1, 12.6, 0.3),
        ("AIAN alone", lambda c: c["race"] == 3, 0.9, 0.1),
        ("Asian alone", lambda c: c["race"] == 7, 4.8, 0.15),
        ("NHPI alone", lambda c: c["race"] == 15, 0.2, 0.05),
        ("Some Other Race alone", lambda c: c["race"] == 31, 6.2, 0.15),
        ("two or more races", lambda c: ~np.isin(c["race"], [0, 1, 3, 7, 15, 31]), 2.9, 0.15),
        ("White and Black", lambda c: c["race"] == 2, 0.59, 0.05),
        ("householders", lambda c: c["relationship"] == 0, 37.8, 0.5),
        ("spouses", lambda c: c["relationship"] == 1, 18.3, 0.5),
        ("unmarried partners", lambda c: c["relationship"] == 13, 2.5, 0.2),
        ("group quarters", lambda c: c["relationship"] >= 15, 2.6, 0.15),
        ("California", lambda c: c["state"] == 4, 12.07, 0.15),
        ("Texas", lambda c: c["state"] == 43, 8.14, 0.15),
        ("Wyoming", lambda c: c["state"] == 50, 0.18, 0.03),
    ],
)
def test_shares_match_2010_figures(codes, name, share, target, tolerance) -> None:
    assert percent(share(codes)) == pytest.approx(target, abs=tolerance), name


def test_correlations(codes: dict[str, np.ndarray]) -> None:
    age, sex, hispanic = codes["age"], codes["sex"], codes["hispanic"]
    assert percent(hispanic[age < 18] == 0) == pytest.approx(23.1, abs=0.4)
    assert percent(hispanic[age >= 65] == 0) == pytest.approx(6.9, abs=0.4)
    old = age >= 85
    assert 100 * (sex[old] == 0).sum() / (sex[old] == 1).sum() == pytest.approx(51, abs=3)
    some_other_race = codes["race"] == 31
    assert percent(hispanic[some_other_race] == 0) > 90  # Some Other Race is mostly Hispanic
    assert percent(codes["relationship"][age < 15] == 2) > 80  # children are children


def test_structural_zeros(codes: dict[str, np.ndarray]) -> None:
    age, relationship = codes["age"], codes["relationship"]
    assert RELATIONSHIP_MIN_AGE["Householder"] == 15
    for category, min_age in RELATIONSHIP_MIN_AGE.items():
        ages = age[relationship == cw.RELATIONSHIP.index(category)]
        assert ages.size > 0 and ages.min() >= min_age, category
    # the same holds for every cell with a positive count, not just this sample
    x = cw.cph_domain().vectorize(cw.synthetic_persons(2_000_000, seed=0))
    counts = x.reshape(cw.cph_domain().shape).sum(axis=(0, 1, 2))  # relationship x age
    for category, min_age in RELATIONSHIP_MIN_AGE.items():
        assert counts[cw.RELATIONSHIP.index(category), :min_age].sum() == 0, category


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"n": -1}, ValueError, "n must be a non-negative int .* got -1"),
        ({"n": 10.0}, TypeError, "n must be a non-negative int .* got 10.0"),
        ({"n": True}, TypeError, "n must be a non-negative int"),
        ({"n": 10, "states": "yes"}, TypeError, "states must be True or False"),
    ],
)
def test_synthetic_persons_errors(kwargs, error, message) -> None:
    with pytest.raises(error, match=message):
        cw.synthetic_persons(**kwargs)


def test_numpy_int_n() -> None:
    assert len(cw.synthetic_persons(np.int64(3), seed=0)) == 3


# ------------------------------------------------------------------ load_adult
def test_load_adult() -> None:
    df, domain = load_adult()
    assert isinstance(domain, Domain) and len(domain) == 14
    assert df.shape == (48_842, 14) and tuple(df.columns) == domain.names
    assert domain["age"] == 85 and domain["native-country"] == 42 and domain["income>50K"] == 2
    assert not any(domain.has_labels(name) for name in domain)
    for name in domain:  # every column holds codes within its attribute
        assert domain.project([name]).vectorize(df).sum() == 48_842, name
    x = domain.project(["age", "sex", "income>50K"]).vectorize(df)
    assert x.shape == (85 * 2 * 2,) and x.sum() == 48_842


def test_adult_files_are_package_data() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    data = resources.files("hdmm") / "data"
    shipped = sorted(p.name for p in data.iterdir() if p.is_file())
    assert shipped == ["README.md", "adult-domain.json", "adult.csv"]
    readme = (data / "README.md").read_text(encoding="utf-8")
    assert "private-pgm" in readme and "Apache License 2.0" in readme
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    patterns = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-data"]["hdmm"]
    for name in shipped:
        assert any(fnmatch.fnmatch(f"data/{name}", p) for p in patterns), name
