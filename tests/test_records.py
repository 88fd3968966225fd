"""Tests for hdmm.records and hdmm.columns: records -> cell indices -> data vector, and back."""

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hdmm.columns import AmbiguousColumnError, reads_numbers_as_codes
from hdmm.domain import Domain
from hdmm.records import MAX_DENSE_CELLS, cell_index, to_records, vectorize


@pytest.fixture
def person() -> Domain:
    return Domain(["sex", "race", "age"], [2, 3, 4], {"sex": ["M", "F"], "race": ["w", "b", "a"]})


def naive_vector(domain: Domain, df: pd.DataFrame) -> np.ndarray:
    """Count records cell by cell, the slow obvious way."""
    x = np.zeros(domain.size)
    for row in df.itertuples(index=False):
        record = row._asdict()
        flat = 0
        for name, n in zip(domain.names, domain.shape):
            value = record[name]
            code = domain.values(name).index(value) if isinstance(value, str) else int(value)
            flat = flat * n + code
        x[flat] += 1
    return x



# --------------------------------------------------------------- vectorize
def test_vectorize_hand_example() -> None:
    d = Domain(["sex", "age"], [2, 3], {"sex": ["M", "F"]})
    df = pd.DataFrame({"age": [0, 2, 2, 1, 2], "sex": ["M", "F", "F", "F", "M"], "x": 9})
    # cells: (M,0)=0, (M,1)=1, (M,2)=2, (F,0)=3, (F,1)=4, (F,2)=5
    x = d.vectorize(df)
    assert x.dtype == np.float64
    np.testing.assert_array_equal(x, [1, 0, 1, 0, 1, 2])
    codes = pd.DataFrame({"sex": [0, 1, 1, 1, 0], "age": [0.0, 2.0, 2.0, 1.0, 2.0]})
    np.testing.assert_array_equal(d.vectorize(codes), x)


def test_vectorize_column_kinds() -> None:
    d = Domain(["a", "b"], [2, 3], {"a": ["no", "yes"]})
    expected = np.array([0, 1, 0, 0, 0, 1.0])
    variants = {
        "object": pd.Series(["no", "yes"], dtype=object),
        "string": pd.Series(["no", "yes"], dtype="string"),
        "category": pd.Series(["no", "yes"], dtype=pd.CategoricalDtype(["yes", "no", "maybe"])),
        "bool": pd.Series([False, True]),
        "int8": pd.Series([0, 1], dtype=np.int8),
        "uint64": pd.Series([0, 1], dtype=np.uint64),
        "Int64": pd.Series([0, 1], dtype="Int64"),
    }
    for kind, a in variants.items():
        for b in ([1, 2], pd.Series([1, 2], dtype="Int64"), pd.Series([1, 2], dtype=object)):
            df = pd.DataFrame({"a": a, "b": b})
            np.testing.assert_array_equal(d.vectorize(df), expected, err_msg=kind)


def test_vectorize_empty_inputs() -> None:
    d = Domain(["a", "b"], [2, 3])
    empty = pd.DataFrame({"a": pd.Series([], dtype=int), "b": pd.Series([], dtype=int)})
    with pytest.warns(UserWarning, match="no records, so every count is 0"):
        np.testing.assert_array_equal(d.vectorize(empty), np.zeros(6))
    np.testing.assert_array_equal(Domain([], []).vectorize(pd.DataFrame({"z": [1, 2, 3]})), [3.0])


@pytest.mark.parametrize("use_labels", [True, False])
def test_vectorize_matches_naive_loop(use_labels: bool) -> None:
    rng = np.random.default_rng(7)
    d = Domain.from_dict({"sex": ["M", "F"], "race": ["w", "b", "a", "o"], "age": 5, "hh": 3})
    n = 2000
    codes = {name: rng.integers(0, size, n) for name, size in zip(d.names, d.shape)}
    df = pd.DataFrame(
        {
            name: (
                np.array(d.values(name), dtype=object)[c]
                if use_labels and d.has_labels(name)
                else c
            )
            for name, c in codes.items()
        }
    )
    x = d.vectorize(df)
    assert x.sum() == n
    np.testing.assert_array_equal(x, naive_vector(d, df))
    flat = np.ravel_multi_index(tuple(codes.values()), d.shape)
    np.testing.assert_array_equal(x, np.bincount(flat, minlength=d.size))


@pytest.mark.filterwarnings("ignore:vectorize. the DataFrame has no records")
@settings(max_examples=40, deadline=None)
@given(st.data())
def test_vectorize_property(data) -> None:
    shape = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    d = Domain([f"a{i}" for i in range(len(shape))], shape)
    rows = data.draw(
        st.lists(st.tuples(*[st.integers(0, n - 1) for n in shape]), max_size=30)
    )
    df = pd.DataFrame(rows, columns=list(d.names)) if rows else pd.DataFrame(
        {n: pd.Series([], dtype=int) for n in d.names}
    )
    x = d.vectorize(df)
    assert x.sum() == len(rows)
    for row in set(rows):
        assert x[np.ravel_multi_index(row, shape)] == rows.count(row)


def test_vectorize_projection_is_marginal(person: Domain) -> None:
    rng = np.random.default_rng(3)
    df = pd.DataFrame({n: rng.integers(0, s, 500) for n, s in zip(person.names, person.shape)})
    full = person.vectorize(df).reshape(person.shape)
    sub = person.project(["sex", "age"])
    np.testing.assert_array_equal(sub.vectorize(df), full.sum(axis=1).ravel())


# ------------------------------------------------------- vectorize errors
def test_vectorize_missing_column(person: Domain) -> None:
    df = pd.DataFrame({"sex": [0], "AGE": [1], "race": [0]})
    message = r"no column for attribute\(s\) \['age'\].*\['sex', 'AGE', 'race'\]"
    with pytest.raises(ValueError, match=message):
        person.vectorize(df)


@pytest.mark.parametrize(
    ("column", "message"),
    [
        (
            pd.Series([1.0, np.nan, 2.0]),
            r"column 'age' has 1 missing value\(s\) \(NaN/None\), e\.g\. in rows \[1\]",
        ),
        (pd.Series([1, None, 2], dtype="Int64"), r"'age' has 1 missing value"),
        (pd.Series([1, None, None], dtype=object), r"has 2 missing value\(s\) .* rows \[1, 2\]"),
        (pd.Series([0, 4, 7, -1, 4]), r"column 'age' holds codes \[-1, 4, 7\] outside \[0, 4\)"),
        (pd.Series([0, 10, 11, 12, 13, 14, 15]), r"codes \[10, 11, 12, 13, 14, \.\.\.\]"),
        (pd.Series([0.0, 1.5, 2.25]), r"column 'age' holds non-integer numbers \[1\.5, 2\.25\]"),
        (pd.Series([0.0, np.inf]), r"column 'age' holds codes \[inf\] outside"),
        (
            pd.Series(["0", "1"], dtype=object),
            r"unknown values \['0', '1'\] .* no value labels, so values must be codes 0\.\.3",
        ),
        (pd.Series(pd.to_datetime(["2020-01-01"])), r"column 'age' has dtype datetime64"),
    ],
)
def test_vectorize_bad_codes(person: Domain, column: pd.Series, message: str) -> None:
    df = pd.DataFrame({"sex": 0, "race": 0, "age": column})
    with pytest.raises(ValueError, match=message):
        person.vectorize(df)


@pytest.mark.parametrize(
    ("column", "message"),
    [
        (
            ["w", "x", "b", "y"],
            r"column 'race' holds unknown values \['x', 'y'\] .* its labels are \['w', 'b', 'a'\]",
        ),
        (pd.Categorical(["w", None]), r"column 'race' has 1 missing value"),
        (pd.Series(["w", None], dtype="string"), r"column 'race' has 1 missing value"),
        (pd.Categorical(["w", "z"], categories=["w", "z", "q"]), r"unknown values \['z'\]"),
    ],
)
def test_vectorize_bad_labels(person: Domain, column, message: str) -> None:
    df = pd.DataFrame({"sex": 0, "race": column, "age": 0})
    with pytest.raises(ValueError, match=message):
        person.vectorize(df)


def test_vectorize_unused_unknown_category_is_fine(person: Domain) -> None:
    race = pd.Categorical(["w", "a"], categories=["w", "a", "never-seen"])
    x = person.vectorize(pd.DataFrame({"sex": 0, "race": race, "age": 0}))
    assert x.sum() == 2


def test_vectorize_numeric_labels_are_matched_as_labels() -> None:
    # Replaces test_vectorize_numeric_labels_hint, which encoded the old behaviour:
    # a numeric column was read as codes even for an attribute with numeric labels.
    d = Domain(["year"], [3], {"year": [2020, 2021, 2022]})
    df = pd.DataFrame({"year": [2020, 2022]})
    np.testing.assert_array_equal(d.vectorize(df), [1, 0, 1])
    np.testing.assert_array_equal(d.vectorize(df.astype(object)), [1, 0, 1])
    np.testing.assert_array_equal(d.vectorize(df.astype(float)), [1, 0, 1])
    codes = pd.DataFrame({"year": [0, 2]})
    np.testing.assert_array_equal(d.vectorize(codes, codes=True), [1, 0, 1])
    with pytest.raises(ValueError, match=r"unknown values \[0, 2\] .* pass codes=True"):
        d.vectorize(codes)


def test_vectorize_labels_overlapping_codes_are_not_misread() -> None:
    # The bug: labels 1..3 of "size" were read as codes 1..3 (shifted by one cell).
    d = Domain(["size", "sex"], [3, 2], {"size": [1, 2, 3], "sex": ["M", "F"]})
    df = pd.DataFrame({"size": [1, 2, 2, 3], "sex": ["M", "F", "F", "M"]})
    np.testing.assert_array_equal(d.vectorize(df), [1, 0, 0, 2, 1, 0])
    assert not reads_numbers_as_codes(d, "size") and reads_numbers_as_codes(d, "sex")
    assert reads_numbers_as_codes(Domain(["a"], [2]), 0)
    assert not reads_numbers_as_codes(Domain(["a"], [2], {"a": ["x", 1]}), "a")
    # the same records as codes, numeric or not, with codes=True
    as_codes = pd.DataFrame({"size": [0, 1, 1, 2], "sex": [0, 1, 1, 0]})
    np.testing.assert_array_equal(d.vectorize(as_codes, codes=True), d.vectorize(df))
    np.testing.assert_array_equal(
        d.vectorize(as_codes.astype(object), codes=True), d.vectorize(df)
    )
    np.testing.assert_array_equal(
        d.vectorize(as_codes.astype("category"), codes=True), d.vectorize(df)
    )


def test_vectorize_codes_flag_errors() -> None:
    d = Domain(["sex", "size"], [2, 3], {"sex": ["M", "F"], "size": [1, 2, 3]})
    labels = pd.DataFrame({"sex": ["M"], "size": [3]})
    message = r"unknown values \['M'\] .* with codes=True values must be codes 0\.\.1; to pass"
    with pytest.raises(ValueError, match=message + " value labels call vectorize without codes"):
        d.vectorize(labels, codes=True)
    message = r"'size' holds codes \[3\] outside \[0, 3\) .* call vectorize without codes=True"
    with pytest.raises(ValueError, match=message):
        d.vectorize(labels.assign(sex=0), codes=True)
    with pytest.raises(TypeError, match="codes must be True or False, got 'yes'"):
        d.vectorize(labels, codes="yes")


def test_vectorize_error_messages_name_the_fix(person: Domain) -> None:
    message = r"rename: df\.rename\(columns=\{'AGE': 'age'\}\).*Domain\.project"
    with pytest.raises(ValueError, match=message):
        person.vectorize(pd.DataFrame({"sex": [0], "race": [0], "AGE": [1]}))
    message = r"labels are \['w', 'b', 'a'\]; map those values to labels or drop"
    with pytest.raises(ValueError, match=message):
        person.vectorize(pd.DataFrame({"sex": 0, "race": ["x"], "age": 0}))
    message = r"outside \[0, 2\) \(attribute 'sex' has size 2\); recode or drop"
    with pytest.raises(ValueError, match=message):
        person.vectorize(pd.DataFrame({"sex": [2], "race": "w", "age": 0}))


def test_vectorize_category_columns() -> None:
    d = Domain(["a", "b"], [3, 2], {"a": ["x", "y", "z"]})
    expected = np.array([0, 0, 1, 1, 1, 0.0])
    for categories in (["x", "y", "z"], ["z", "y", "x", "unused"], ["y", "z"]):
        a = pd.Categorical(["y", "z", "y"], categories=categories)
        np.testing.assert_array_equal(d.vectorize(pd.DataFrame({"a": a, "b": [1, 0, 0]})), expected)
    b = pd.Categorical([1, 0, 0], categories=[1, 0])  # no labels: categories are codes
    df = pd.DataFrame({"a": ["y", "z", "y"], "b": b})
    np.testing.assert_array_equal(d.vectorize(df), expected)


def test_vectorize_other_errors(person: Domain) -> None:
    df = pd.DataFrame([[0, 0, 0, 0]], columns=["sex", "race", "age", "age"])
    with pytest.raises(ValueError, match="2 columns named 'age'"):
        person.vectorize(df)
    with pytest.raises(TypeError, match="expects a pandas DataFrame"):
        person.vectorize({"sex": [0], "race": [0], "age": [0]})
    big = Domain(["a", "b"], [2**16, 2**16])
    assert big.size == 2**32 > MAX_DENSE_CELLS
    with pytest.raises(ValueError, match=r"4294967296 cells, more than .*\(Domain\.project\)"):
        big.vectorize(pd.DataFrame({"a": [0], "b": [0]}))


def test_vectorize_many_records_quickly() -> None:
    rng = np.random.default_rng(0)
    d = Domain.from_dict({"sex": ["M", "F"], "age": 115, "race": list("abcdefg")})
    n = 1_000_000
    df = pd.DataFrame(
        {
            "sex": pd.Categorical.from_codes(rng.integers(0, 2, n), ["M", "F"]),
            "age": rng.integers(0, 115, n),
            "race": np.array(list("abcdefg"), dtype=object)[rng.integers(0, 7, n)],
        }
    )
    x = d.vectorize(df)
    assert x.shape == (d.size,) and x.sum() == n
    assert math.isclose(x.reshape(d.shape).sum(axis=(0, 2)).mean(), n / 115)


# ----------------------------------------------------------------- records
def test_records_hand_example() -> None:
    d = Domain(["sex", "age"], [2, 3], {"sex": ["M", "F"]})
    df = to_records(d, np.array([0, 2.0, 0, 0, 0, 1]))
    assert df.to_dict("list") == {"sex": ["M", "M", "F"], "age": [1, 1, 2]}
    assert isinstance(df["sex"].dtype, pd.CategoricalDtype)
    assert list(df["sex"].cat.categories) == ["M", "F"] and df["age"].dtype == np.uint8
    assert list(df.index) == [0, 1, 2]
    codes = to_records(d, [0, 2, 0, 0, 0, 1], codes=True)
    assert codes.to_dict("list") == {"sex": [0, 0, 1], "age": [1, 1, 2]}
    assert (codes.dtypes == np.uint8).all()
    assert to_records(d, np.zeros(6, dtype=int)).shape == (0, 2)
    assert to_records(Domain([], []), [4]).shape == (4, 0)


def test_records_compact_dtypes() -> None:
    d = Domain(["a", "b"], [300, 2], {"b": [10, 20]})
    x = np.zeros(d.size)
    x[-1] = 1
    df = to_records(d, x)
    assert df["a"].dtype == np.uint16 and df["b"].cat.codes.dtype == np.int8
    assert df.to_dict("list") == {"a": [299], "b": [20]}


def test_dataframe_vectorize_records_round_trip() -> None:
    rng = np.random.default_rng(11)
    d = Domain.from_dict({"size": [1, 2, 3], "sex": ["M", "F"], "age": 5, "w": [0.5, 0.25]})
    n = 500
    df = pd.DataFrame(
        {
            "size": rng.integers(1, 4, n),  # labels, numbers overlapping the codes
            "sex": rng.integers(0, 2, n),  # codes of a string-labelled attribute
            "age": rng.integers(0, 5, n),
            "w": rng.choice([0.5, 0.25], n),
        }
    )
    x = d.vectorize(df)
    assert x.sum() == n
    records = to_records(d, x)
    np.testing.assert_array_equal(d.vectorize(records), x)
    np.testing.assert_array_equal(d.vectorize(to_records(d, x, codes=True), codes=True), x)
    # the records are the original rows, sorted by cell
    back = records.astype(object)
    back["sex"] = back["sex"].map({"M": 0, "F": 1})
    original = df.astype(object).sort_values(list(d.names), kind="stable")
    ordered = back.sort_values(list(d.names), kind="stable")
    assert ordered.to_numpy().tolist() == original.to_numpy().tolist()


round_trip_labels = st.one_of(
    st.lists(st.text(max_size=3), min_size=1, max_size=4, unique=True),
    st.lists(st.integers(-2, 5), min_size=1, max_size=4, unique=True),
    st.lists(st.floats(-3, 3, allow_nan=False), min_size=1, max_size=4, unique=True),
)


@pytest.mark.filterwarnings("ignore:vectorize. the DataFrame has no records")
@settings(max_examples=40, deadline=None)
@given(st.data())
def test_records_round_trip_property(data) -> None:
    specs = data.draw(
        st.lists(st.one_of(st.integers(1, 4), round_trip_labels), min_size=1, max_size=4)
    )
    d = Domain.from_dict({f"a{i}": spec for i, spec in enumerate(specs)})
    x = np.array(data.draw(st.lists(st.integers(0, 3), min_size=d.size, max_size=d.size)))
    for codes in (False, True):
        np.testing.assert_array_equal(d.vectorize(to_records(d, x, codes=codes), codes=codes), x)


@pytest.mark.parametrize(
    ("x", "error", "message"),
    [
        (np.ones(5), ValueError, r"x has shape \(5,\) but the domain has 24 cells.*x\.ravel\(\)"),
        (np.ones((2, 3, 4)), ValueError, r"shape \(2, 3, 4\) .* pass a vector of shape \(24,\)"),
        (np.r_[-1.0, np.ones(23)], ValueError, r"counts \[-1\.0\] in cells \[0\] .* np\.clip"),
        (np.r_[np.ones(23), 0.5], ValueError, r"counts \[0\.5\] in cells \[23\] that are not"),
        (np.r_[np.nan, np.inf, np.ones(22)], ValueError, r"counts \[nan, inf\] in cells \[0, 1\]"),
        (np.array(["1"] * 24), TypeError, "x must hold numbers, got dtype <U1"),
    ],
)
def test_records_errors(person: Domain, x, error, message) -> None:
    with pytest.raises(error, match=message):
        to_records(person, x)


def test_records_codes_flag_must_be_bool(person: Domain) -> None:
    with pytest.raises(TypeError, match="codes must be True or False"):
        to_records(person, np.ones(24), codes=1)


# ------------------------------------------------- labels that spell numbers (issue 11, defect 2)
REGIONS = Domain(["region", "sex"], [9, 2], {"region": [str(k) for k in range(1, 10)], "sex": ["f", "m"]})


def test_spelled_number_labels_are_not_read_as_codes() -> None:
    # The defect: region labels "1".."9" read from an integer CSV column were taken for codes,
    # so every count moved to the next region (and region 9 failed or vanished).
    df = pd.DataFrame({"region": [1, 2, 9, 9], "sex": ["f", "m", "f", "f"]})
    x = REGIONS.vectorize(df)
    expected = REGIONS.vectorize(df.astype({"region": str}))  # text: matched exactly
    np.testing.assert_array_equal(x, expected)
    assert x[16] == 2  # region "9" (code 8), sex "f" (code 0)
    assert not reads_numbers_as_codes(REGIONS, "region") and reads_numbers_as_codes(REGIONS, "sex")


def test_spelled_number_labels_read_from_a_csv(tmp_path) -> None:
    path = tmp_path / "people.csv"
    path.write_text("region,sex\n1,f\n2,m\n9,f\n")
    x = REGIONS.vectorize(pd.read_csv(path))
    assert x.tolist() == REGIONS.vectorize(pd.read_csv(path, dtype={"region": str})).tolist()
    assert x[0] == 1 and x[3] == 1 and x[16] == 1


@pytest.mark.parametrize("region", [[1, 2, 8], [1.0, 3.0], pd.array([1, 5], dtype="Int64")])
def test_numbers_that_read_both_ways_differently_are_refused(region) -> None:
    df = pd.DataFrame({"region": region, "sex": ["f"] * len(region)})
    with pytest.raises(AmbiguousColumnError, match=r"column 'region' is ambiguous") as info:
        REGIONS.vectorize(df)
    message = str(info.value)
    assert info.value.attribute == "region" and isinstance(info.value, ValueError)
    assert "the value 1 is the label '1', and also code 1, the label '2'" in message
    assert "df.astype({'region': str})" in message and "codes=True" in message
    # either fix works
    as_text = REGIONS.vectorize(df.astype({"region": int}).astype({"region": str}))
    as_codes = REGIONS.vectorize(df.assign(sex=0), codes=True)
    assert as_text.sum() == as_codes.sum() == len(region)
    assert as_text[0] == 1 and as_codes[2] == 1  # value 1: label "1" (cell 0), or code 1 (cell 2)


def test_numbers_that_read_only_one_way_or_the_same_both_ways() -> None:
    # labels "0".."8" equal their codes: both readings agree, nothing to refuse
    same = Domain(["d"], [9], {"d": [str(k) for k in range(9)]})
    np.testing.assert_array_equal(same.vectorize(pd.DataFrame({"d": [1, 2, 2]})), [0, 1, 2, 0, 0, 0, 0, 0, 0])
    # top-coded ages: 114 is only a code, and 0..113 read the same either way
    ages = Domain(["age"], [115], {"age": [str(a) for a in range(114)] + ["114 and over"]})
    x = ages.vectorize(pd.DataFrame({"age": [0, 40, 114]}))
    assert x[0] == x[40] == x[114] == 1
    # FIPS codes with leading zeros, parsed as numbers by read_csv: matched by the number they spell
    fips = Domain(["state"], [3], {"state": ["01", "02", "04"]})
    np.testing.assert_array_equal(fips.vectorize(pd.DataFrame({"state": [1, 4, 4]})), [1, 0, 2])
    # labels that spell no number: numbers are codes, as before
    d = Domain(["sex"], [2], {"sex": ["0-4", "5+"]})
    assert reads_numbers_as_codes(d, "sex")
    np.testing.assert_array_equal(d.vectorize(pd.DataFrame({"sex": [0, 1, 1]})), [1, 2])


def test_numbers_that_fit_neither_reading_are_refused() -> None:
    with pytest.raises(ValueError, match=r"holds values \[12\] that are neither labels .* nor codes 0\.\.8"):
        REGIONS.vectorize(pd.DataFrame({"region": [1, 12], "sex": ["f", "f"]}))
    # 0 is only a code (of label "1"), while 1 would then be read as code 1, label "2": refused
    with pytest.raises(AmbiguousColumnError, match="the value 1 is the label '1'"):
        REGIONS.vectorize(pd.DataFrame({"region": [0, 1], "sex": ["f", "f"]}))
    # 0 only a code and 9 only a label: no single reading fits
    with pytest.raises(ValueError, match=r"mixes values that are only labels .*\(\[9\], not codes.* only codes \(\[0\]"):
        REGIONS.vectorize(pd.DataFrame({"region": [0, 9], "sex": ["f", "f"]}))
    # two labels spell the same number: only their text tells them apart
    twice = Domain(["a"], [2], {"a": ["1", "01"]})
    with pytest.raises(ValueError, match=r"the number 1, which several labels .* dtype=\{'a': str\}"):
        twice.vectorize(pd.DataFrame({"a": [1]}))
    np.testing.assert_array_equal(twice.vectorize(pd.DataFrame({"a": ["01"]})), [0, 1])


def test_cell_index_private_counts_records_and_never_shows_values():
    dom = Domain(["sex", "age"], [2, 4], {"sex": ["F", "M"]})
    df = pd.DataFrame({"sex": ["F", "Mx", "Mx"], "age": [1, 2, 3]})
    with pytest.raises(ValueError, match=r"unknown values \['Mx'\]"):
        cell_index(dom, df)
    with pytest.raises(ValueError, match=r"unknown values <2 records; values not shown: private>") as info:
        cell_index(dom, df, private=True)
    assert "Mx" not in str(info.value)
    distinct = pd.DataFrame({"sex": ["F", "Mx"], "age": [1, 9]})       # distinct values with their record counts
    with pytest.raises(ValueError, match=r"unknown values <40 records") as info:
        cell_index(dom, distinct, private=True, counts=[7, 40])
    with pytest.raises(ValueError, match=r"codes <3 records; values not shown: private> outside \[0, 4\)") as info:
        cell_index(dom.project(["age"]), distinct[["age"]], private=True, counts=[7, 3])
    assert "9" not in str(info.value)
    assert cell_index(dom, pd.DataFrame({"sex": ["M"], "age": [3]}), private=True).tolist() == [7]


def test_empty_records_warning_points_at_the_caller(person: Domain) -> None:
    empty = pd.DataFrame({"sex": [], "race": [], "age": []})
    for count in (person.vectorize, lambda df: vectorize(person, df)):
        with pytest.warns(UserWarning, match="no records") as caught:
            count(empty)
        assert caught[0].filename == __file__


def test_domain_delegates_to_the_records_module(person: Domain) -> None:
    df = pd.DataFrame({"sex": ["F", "M"], "race": ["a", "w"], "age": [3, 0]})
    np.testing.assert_array_equal(person.vectorize(df), vectorize(person, df))
    assert not any(hasattr(person, name) for name in ("records", "reads_numbers_as_codes", "cell_index"))
