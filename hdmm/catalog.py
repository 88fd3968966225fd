"""Workloads by name and from JSON files: what the command line and notebooks ask for.

Named workloads (:data:`WORKLOADS`) pair a workload with its domain and the built-in data set
that fits it. A workload file is JSON::

    {
      "domain": {"age": 85, "sex": ["female", "male"], "income": 2},
      "queries": [
        {"name": "age by sex", "age": "prefix", "sex": "identity"},
        {"age": "width-10"},
        {"marginals": 2}
      ],
      "weights": [1.0, 2.0, 1.0]
    }

``domain`` is :meth:`hdmm.Domain.from_dict` input. Each entry of ``queries`` is one part of
the workload: either a product of one building block per attribute (attributes not named get
``total``) or ``{"marginals": k}`` (every marginal on ``k`` attributes). The building blocks
are :data:`BLOCKS`: ``identity``, ``total``, ``identity+total``, ``prefix``, ``allrange`` and
``width-K`` (every range of ``K`` consecutive values). ``name`` labels a part (without one, a
name is made from the part's spec: ``age (prefix) by sex``, ``2-way marginals``; a repeated one
gets ``(query i)``) and ``weights`` (one per part, optional) multiplies its queries.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

from .domain import Domain
from .marginals import DimKMarginals
from .matrix import Identity, Matrix
from .workload import AllRange, IdentityTotal, Prefix, Total, WidthKRange, product, union

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["NamedWorkload", "WORKLOADS", "BLOCKS", "ADULT_ATTRIBUTES", "named_workload", "workload_from_spec",
           "load_workload"]

#: Per-attribute building blocks of a workload file: name -> constructor from the attribute size.
BLOCKS: dict[str, Callable[[int], Matrix]] = {
    "identity": Identity,
    "total": Total,
    "identity+total": IdentityTotal,
    "prefix": Prefix,
    "allrange": AllRange,
}

#: The Adult attributes of the named ``adult`` workload (190,400 cells).
ADULT_ATTRIBUTES = ("age", "education-num", "marital-status", "race", "sex", "income>50K")


@dataclass(frozen=True)
class NamedWorkload:
    """A workload with its domain and the built-in data set that fits it.

    Attributes
    ----------
    workload : Matrix
    domain : Domain
    data : str or None
        ``"synthetic-persons"``, ``"synthetic-persons-states"``, ``"adult"`` or None.
    description : str
    """

    workload: Matrix
    domain: Domain
    data: str | None
    description: str

    def built_in_records(self, people: pd.DataFrame) -> pd.DataFrame:
        """The built-in synthetic persons seen over this workload's domain (the DAS's 2020 PL94 attributes
        for ``pl94-2020``; the CPH attributes, unchanged, otherwise)."""
        if self.data is not None and self.data.endswith("pl94-2020"):
            from census_workloads.pl94_2020 import pl94_2020_records

            return pl94_2020_records(people)
        return people


def _census(name: str) -> NamedWorkload:
    from census_workloads import cph_domain, pl94, sf1_persons, sf1_plus

    builders = {
        "sf1": (sf1_persons, False, "SF1 person tables P1-PCT12 (4,151 queries), national"),
        "sf1-states": (sf1_plus, True, "SF1+: the SF1 person tables nationally and for each state (215,852 queries)"),
        "pl94": (pl94, False, "PL94-171 person tables P1-P4 (288 queries), national"),
        "pl94-states": (lambda: pl94(state=True), True, "PL94-171 person tables nationally and for each state"),
    }
    if name == "pl94-2020":
        from census_workloads.pl94_2020 import pl94_2020, pl94_2020_domain

        return NamedWorkload(pl94_2020(), pl94_2020_domain(), "synthetic-persons-pl94-2020",
                             "PL94-171 person tables P1-P5 of 2020 (298 queries) over the 2,016 cells the 2020 "
                             "Census measured (hhgq, voting age, Hispanic origin, race)")
    build, state, description = builders[name]
    data = "synthetic-persons-states" if state else "synthetic-persons"
    return NamedWorkload(build(), cph_domain(state=state), data, description)


def _adult() -> NamedWorkload:
    from .datasets import load_adult

    domain = load_adult()[1].project(ADULT_ATTRIBUTES)
    return NamedWorkload(DimKMarginals(domain, 2), domain, "adult",
                         "Adult: every 2-way marginal of " + ", ".join(ADULT_ATTRIBUTES))


#: Named workloads: name -> builder.
WORKLOADS: dict[str, Callable[[], NamedWorkload]] = {
    "sf1": lambda: _census("sf1"),
    "sf1-states": lambda: _census("sf1-states"),
    "pl94": lambda: _census("pl94"),
    "pl94-states": lambda: _census("pl94-states"),
    "pl94-2020": lambda: _census("pl94-2020"),
    "adult": _adult,
}


def named_workload(name: str) -> NamedWorkload:
    """The workload called ``name`` (see :data:`WORKLOADS`).

    Raises
    ------
    ValueError
        For an unknown name, listing the known ones.
    """
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)} or give a JSON workload file")
    return WORKLOADS[name]()


def _block(spec: Any, attribute: str, size: int) -> Matrix:
    if isinstance(spec, str) and spec.startswith("width-"):
        width = spec[len("width-"):]
        if not width.isdigit() or not 1 <= int(width) <= size:
            raise ValueError(f"attribute {attribute!r}: {spec!r} needs a width between 1 and {size}, e.g. 'width-2'")
        return WidthKRange(size, int(width))
    if not isinstance(spec, str) or spec not in BLOCKS:
        raise ValueError(f"attribute {attribute!r}: unknown query block {spec!r}; use one of "
                         f"{', '.join(BLOCKS)} or 'width-K'")
    return BLOCKS[spec](size)


def _default_name(entry: Mapping[str, Any]) -> str:
    """A readable name for an unnamed part, from its spec: ``{"age": "prefix", "sex": "identity"}`` is
    ``"age (prefix) by sex"``, ``{"marginals": 2}`` is ``"2-way marginals"``, ``{}`` is ``"total"``."""
    if "marginals" in entry:
        return f"{entry['marginals']}-way marginals"
    words = [str(a) if spec == "identity" else f"{a} ({spec})" for a, spec in entry.items()]
    return " by ".join(words) or "total"


def _part(entry: Any, domain: Domain, position: int) -> tuple[str, Matrix]:
    where = f"queries[{position}]"
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where} must be an object such as {{\"age\": \"prefix\"}}, got {entry!r}")
    entry = dict(entry)
    name = entry.pop("name") if "name" in entry else _default_name(entry)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: 'name' must be non-empty text, got {name!r}")
    if "marginals" in entry:
        k = entry.pop("marginals")
        if entry or isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= len(domain):
            raise ValueError(f"{where}: 'marginals' stands alone and needs a number of attributes between 1 and "
                             f"{len(domain)}")
        return str(name), DimKMarginals(domain, k)
    unknown = [a for a in entry if a not in domain]
    if unknown:
        raise ValueError(f"{where} names attributes {unknown} that are not in the domain {list(domain.names)}")
    blocks = {a: _block(spec, a, domain[a]) for a, spec in entry.items()}
    return str(name), product(domain, blocks)


def workload_from_spec(spec: Mapping[str, Any]) -> tuple[Matrix, Domain]:
    """Build the workload and domain a parsed workload file describes (module docstring)."""
    if not isinstance(spec, Mapping) or "domain" not in spec or "queries" not in spec:
        raise ValueError("a workload file is a JSON object with a 'domain' and a list of 'queries'")
    domain = Domain.from_dict(spec["domain"])
    queries = spec["queries"]
    if not isinstance(queries, list) or not queries:
        raise ValueError("'queries' must be a non-empty list")
    names, parts = zip(*(_part(entry, domain, i) for i, entry in enumerate(queries)))
    names = [name if name not in names[:i] else f"{name} (query {i + 1})" for i, name in enumerate(names)]
    weights = spec.get("weights")
    if weights is not None and (not isinstance(weights, list) or len(weights) != len(parts)):
        raise ValueError(f"'weights' must be a list with one number per query part ({len(parts)})")
    return union(list(parts), weights, names=list(names)), domain


def _check_text(value: Any, where: str = "the file") -> None:
    """Refuse text that cannot be written out again: JSON's ``\\ud800`` escapes give lone surrogates, which
    no output file can hold (the release would fail after its noise was drawn)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{where} holds text that is not valid Unicode ({value!r}): a lone surrogate escape "
                             "such as \\ud800; fix the text") from None
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _check_text(key, where)
            _check_text(item, where)
    elif isinstance(value, list):
        for item in value:
            _check_text(item, where)


def load_workload(path: str | os.PathLike[str]) -> tuple[Matrix, Domain]:
    """Read a JSON workload file (module docstring) into a workload and its domain."""
    source = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as handle:
            spec = json.load(handle)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source} is not valid JSON: {exc}") from None
    except RecursionError:
        raise ValueError(f"{source} is not a workload file (its JSON is nested too deeply)") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{source} is not UTF-8 text: {exc}") from None
    _check_text(spec, source)
    try:
        return workload_from_spec(spec)
    except (TypeError, KeyError, AttributeError) as exc:  # a value of the wrong kind somewhere in the spec
        raise ValueError(f"{source} is not a valid workload file: {exc!r}") from None
