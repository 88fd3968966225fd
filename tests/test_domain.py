"""Tests for hdmm.domain."""

import itertools
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hdmm.domain import Domain


@pytest.fixture
def person() -> Domain:
    return Domain(["sex", "race", "age"], [2, 3, 4], {"sex": ["M", "F"], "race": ["w", "b", "a"]})


# ------------------------------------------------------------------ basics
def test_basic_properties(person: Domain) -> None:
    assert person.names == ("sex", "race", "age")
    assert person.shape == (2, 3, 4)
    assert person.size == 24
    assert len(person) == 3
    assert list(person) == ["sex", "race", "age"]
    assert person["race"] == 3 and person[2] == 4 and person[-1] == 4
    assert "age" in person and "income" not in person and 0 not in person
    assert repr(person) == "Domain(sex=2, race=3, age=4)"
    assert repr(Domain(["hh size"], [3])) == "Domain('hh size'=3)"


def test_size_is_exact_python_int() -> None:
    d = Domain([f"a{i}" for i in range(10)], [10**4] * 10)
    assert d.size == 10**40
    assert isinstance(d.size, int)
    assert isinstance(Domain(["a"], [np.int64(3)]).shape[0], int)


def test_empty_domain_has_one_cell() -> None:
    d = Domain([], [])
    assert d.size == 1 and len(d) == 0 and d.shape == ()
    assert d.cell(0) == {}


def test_index_and_indices(person: Domain) -> None:
    assert person.index("age") == 2
    assert person.index(1) == 1
    assert person.index(-3) == 0
    assert person.index(np.int64(2)) == 2
    assert person.indices(["age", 0]) == (2, 0)
    assert person.indices([]) == ()


def test_index_errors(person: Domain) -> None:
    with pytest.raises(KeyError, match=r"unknown attribute 'income'.*\['sex', 'race', 'age'\]"):
        person.index("income")
    with pytest.raises(IndexError, match="position 3 is out of range"):
        person.index(3)
    with pytest.raises(IndexError, match="position -4"):
        person.index(-4)
    with pytest.raises(TypeError, match="by name"):
        person.index(True)
    with pytest.raises(TypeError, match="by name"):
        person.index(1.0)
    with pytest.raises(ValueError, match=r"\['age'\] are listed more than once"):
        person.indices(["age", 2])
    with pytest.raises(TypeError, match=r"write \['age'\]"):
        person.indices("age")
    with pytest.raises(KeyError, match="income"):
        person["income"]


def test_values_and_labels(person: Domain) -> None:
    assert person.values("sex") == ("M", "F")
    assert person.values("age") == (0, 1, 2, 3)
    assert person.has_labels("race") and not person.has_labels("age")
    assert person.has_labels(0)


def test_numpy_labels_become_python_scalars() -> None:
    d = Domain(["a", "b"], [2, 3], {"a": np.array(["x", "y"]), "b": np.arange(10, 13)})
    assert d.values("a") == ("x", "y")
    assert all(type(v) is int for v in d.values("b"))
    assert d.to_json() == '{"a": ["x", "y"], "b": [10, 11, 12]}'


def test_project(person: Domain) -> None:
    sub = person.project(["age", "sex"])
    assert sub.names == ("sex", "age")
    assert sub.shape == (2, 4)
    assert sub.values("sex") == ("M", "F")
    assert not sub.has_labels("age")
    assert person.project([]) == Domain([], [])
    assert person.project([0, 1, 2]) == person


def test_equality_and_hash(person: Domain) -> None:
    same = Domain(
        ("sex", "race", "age"), (2, 3, 4), {"race": ("w", "b", "a"), "sex": ("M", "F")}
    )
    assert same == person and hash(same) == hash(person)
    assert person != Domain(["sex", "race", "age"], [2, 3, 4])
    assert person != Domain(["sex", "race", "age"], [2, 3, 4], {"sex": ["F", "M"]})
    assert Domain(["a", "b"], [2, 3]) != Domain(["b", "a"], [3, 2])
    assert person != {"sex": 2}
    assert len({person, same}) == 1


def test_pickle_round_trip(person: Domain) -> None:
    assert pickle.loads(pickle.dumps(person)) == person


# ------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("names", "sizes", "values", "error", "message"),
    [
        (["a", "a"], [2, 2], None, ValueError, r"unique, got duplicates \['a'\]"),
        (["a", ""], [2, 2], None, TypeError, "non-empty strings, got ''"),
        (["a", 3], [2, 2], None, TypeError, "non-empty strings, got 3"),
        ("ab", [2, 2], None, TypeError, r"got the string 'ab'; write \['ab'\]"),
        (["a", "b"], [2], None, ValueError, "2 attribute names but 1 sizes"),
        (["a"], 3, None, TypeError, r"single int 3; write \[3\]"),
        (["a"], [0], None, ValueError, "size of attribute 'a' must be a positive int, got 0"),
        (["a"], [-2], None, ValueError, "positive int, got -2"),
        (["a"], [2.0], None, TypeError, "positive int, got 2.0 of type float"),
        (["a"], [True], None, TypeError, "positive int, got True"),
        (["a"], [2], {"a": ["x"]}, ValueError, "'a' has size 2 but 1 value labels"),
        (["a"], [2], {"a": ["x", "x"]}, ValueError, r"unique, got duplicates \['x'\]"),
        (["a"], [2], {"a": [1, 1.0]}, ValueError, "duplicates"),
        (["a"], [2], {"b": ["x", "y"]}, ValueError, r"unknown attributes \['b'\]"),
        (["a"], [2], {"a": "xy"}, TypeError, "got the string 'xy'"),
        (["a"], [2], {"a": {"x", "y"}}, TypeError, "ordered sequence"),
        (["a"], [2], {"a": ["x", float("nan")]}, ValueError, "must be finite"),
        (["a"], [2], {"a": ["x", (1, 2)]}, TypeError, "str, int or float"),
        (["a"], [2], {"a": ["x", None]}, TypeError, "got None"),
        (["a"], [2], [("a", ["x", "y"])], TypeError, "values must be a mapping"),
    ],
)
def test_constructor_errors(names, sizes, values, error, message) -> None:
    with pytest.raises(error, match=message):
        Domain(names, sizes, values)


# ---------------------------------------------------------- serialisation
def test_from_dict_with_labels() -> None:
    d = Domain.from_dict({"sex": ["M", "F"], "age": 115, "hisp": (0, 1)})
    assert d.names == ("sex", "age", "hisp")
    assert d.shape == (2, 115, 2)
    assert d.values("sex") == ("M", "F")
    assert d.has_labels("hisp") and not d.has_labels("age")
    assert d.to_dict() == {"sex": ["M", "F"], "age": 115, "hisp": [0, 1]}
    assert Domain.from_dict(d.to_dict()) == d


def test_from_dict_errors() -> None:
    with pytest.raises(TypeError, match="got the string 'MF'"):
        Domain.from_dict({"sex": "MF"})
    with pytest.raises(ValueError, match="positive int, got 0"):
        Domain.from_dict({"sex": 0})
    with pytest.raises(TypeError, match="expects a mapping"):
        Domain.from_dict([("sex", 2)])


def test_json_round_trip(person: Domain, tmp_path) -> None:
    d = Domain.from_dict(
        {"größe": ["klein", "groß", "ünbekannt"], "n": 7, "f": [0.5, 1.5], "b": [False, True]}
    )
    for domain in (person, d, Domain([], [])):
        text = domain.to_json()
        back = Domain.from_json(text)
        assert back == domain
        assert back.names == domain.names  # order survives
        assert [type(v) for n in back for v in back.values(n)] == [
            type(v) for n in domain for v in domain.values(n)
        ]
        path = tmp_path / "domain.json"
        domain.save(path)
        assert Domain.load(str(path)) == domain
    assert Domain.from_json(person.to_json(indent=2)) == person


def test_from_json_errors() -> None:
    with pytest.raises(ValueError, match="must be an object"):
        Domain.from_json('[["sex", 2]]')
    with pytest.raises(ValueError, match="duplicate attribute names"):
        Domain.from_json('{"sex": 2, "sex": 3}')


labels = st.one_of(
    st.text(max_size=5),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.text(min_size=1, max_size=8),
            st.one_of(st.integers(1, 10**6), st.lists(labels, min_size=1, max_size=6, unique=True)),
        ),
        max_size=5,
        unique_by=lambda t: t[0],
    )
)
def test_json_round_trip_property(entries) -> None:
    d = Domain.from_dict(dict(entries))
    assert Domain.from_json(d.to_json()) == d
    assert Domain.from_dict(d.to_dict()) == d


# -------------------------------------------------------------------- cell
def test_cell_hand_example() -> None:
    d = Domain(["sex", "age"], [2, 3], {"sex": ["M", "F"]})
    assert [d.cell(j) for j in range(6)] == [
        {"sex": s, "age": a} for s, a in itertools.product("MF", range(3))
    ]


def test_cell_matches_unravel_index(person: Domain) -> None:
    for j in range(person.size):
        codes = np.unravel_index(j, person.shape)
        expected = {n: person.values(n)[c] for n, c in zip(person.names, codes)}
        assert person.cell(j) == expected


def test_cell_huge_domain_and_errors(person: Domain) -> None:
    big = Domain([f"a{i}" for i in range(8)], [10**5] * 8)
    assert big.cell(big.size - 1) == {f"a{i}": 10**5 - 1 for i in range(8)}
    with pytest.raises(IndexError, match=r"cell index 24 is out of range \[0, 24\)"):
        person.cell(24)
    with pytest.raises(IndexError, match="-1"):
        person.cell(-1)
    with pytest.raises(TypeError, match="must be an int"):
        person.cell(1.0)
