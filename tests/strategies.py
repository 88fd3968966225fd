"""Hypothesis strategies for small implicit matrices, each paired with a dense reference.

Every strategy here draws a :class:`Pair`: an ``hdmm`` matrix together with the numpy array it
is supposed to equal. The reference is built *independently* of the library (``np.kron``,
``np.vstack``, ``np.tril``, hand-written range and marginal tables, ...), never with
``Matrix.dense()``, so a test comparing the two checks the implicit code against plain numpy.

Sizes are kept tiny (domains of at most ~60 cells, a few hundred rows) so that the dense
reference computations are instantaneous.
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import scipy.sparse as sp
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from hdmm import workload as wl
from hdmm.domain import Domain
from hdmm.marginals import AllMarginals, DimKMarginals, Marginal, Marginals
from hdmm.matrix import (
    Diagonal,
    Explicit,
    Identity,
    Kronecker,
    Matrix,
    Ones,
    Product,
    Sum,
    Transpose,
    VStack,
    Weighted,
)
from hdmm.privacy import ApproxDP, PureDP, ZCDP

#: Settings for the property tests: few examples, no deadline (the first call of a numpy
#: routine can be slow), and no complaints about the size of the drawn data. Set
#: HDMM_TEST_EXAMPLES to run more (and fresh random) examples locally, e.g. 1000 for a
#: soak run; by default the examples are derandomized so that CI runs are reproducible.
EXAMPLES = int(os.environ.get("HDMM_TEST_EXAMPLES", "40"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    derandomize="HDMM_TEST_EXAMPLES" not in os.environ,
    report_multiple_bugs=False,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

#: Number of columns (domain sizes) the composite strategies draw from.
SIZES = (1, 2, 3, 4, 5, 6, 8, 9, 10, 12, 16, 18, 24, 30, 36, 48, 60)

#: Largest number of rows a composite matrix may have before it is replaced by a leaf.
MAX_ROWS = 240


@dataclass
class Pair:
    """An implicit matrix and the dense array it must equal."""

    mat: Matrix
    ref: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return self.ref.shape

    def __repr__(self) -> str:
        return f"Pair({self.mat!r}, ref shape={self.ref.shape})"


# ====================================================================== dense references
def prefix_ref(n: int) -> np.ndarray:
    """Row ``b`` counts the values ``0..b``."""
    return np.tril(np.ones((n, n)))


def interval_rows(n: int, intervals: Sequence[tuple[int, int]]) -> np.ndarray:
    out = np.zeros((len(intervals), n))
    for r, (lo, hi) in enumerate(intervals):
        out[r, lo:hi] = 1.0
    return out


def all_intervals(n: int) -> list[tuple[int, int]]:
    """All ``[a, b)`` with ``0 <= a < b <= n``, ordered by ``a`` then ``b``."""
    return [(a, b) for a in range(n) for b in range(a + 1, n + 1)]


def allrange_ref(n: int) -> np.ndarray:
    return interval_rows(n, all_intervals(n))


def width_k_ref(n: int, k: int) -> np.ndarray:
    return interval_rows(n, [(a, a + k) for a in range(n - k + 1)])


def marginal_block_ref(shape: Sequence[int], subset: Sequence[int]) -> np.ndarray:
    """The marginal over ``subset``: identity on those attributes, a row of ones elsewhere."""
    out = np.ones((1, 1))
    for i, n in enumerate(shape):
        out = np.kron(out, np.eye(n) if i in subset else np.ones((1, n)))
    return out


def marginals_ref(shape: Sequence[int], subsets: Sequence[Sequence[int]], weights: Sequence[float]) -> np.ndarray:
    return np.vstack([w * marginal_block_ref(shape, s) for s, w in zip(subsets, weights)])


def kron_ref(parts: Sequence[np.ndarray]) -> np.ndarray:
    out = np.ones((1, 1))
    for p in parts:
        out = np.kron(out, p)
    return out


def factorizations(n: int) -> list[tuple[int, ...]]:
    """Ordered factorizations of ``n`` into factors >= 2 (``(n,)`` itself included)."""
    if n == 1:
        return [(1,)]
    out = [(n,)]
    for a in range(2, n):
        if n % a == 0:
            out.extend((a,) + rest for rest in factorizations(n // a))
    return out


def all_subsets(d: int) -> list[tuple[int, ...]]:
    return [s for k in range(d + 1) for s in itertools.combinations(range(d), k)]


# ====================================================================== random arrays
def _rng(draw) -> np.random.Generator:
    return np.random.default_rng(draw(st.integers(0, 2**32 - 1)))


@st.composite
def dense_arrays(draw, m: int, n: int, integer: bool | None = None) -> np.ndarray:
    rng = _rng(draw)
    if integer is None:
        integer = draw(st.booleans())
    if integer:
        return rng.integers(-2, 3, size=(m, n)).astype(float)
    return rng.standard_normal((m, n))


def _sparse_of_kind(draw, A: np.ndarray):
    kind = draw(st.sampled_from(["csr_array", "csc_array", "coo_array", "csr_matrix", "coo_matrix"]))
    return getattr(sp, kind)(A)


# ====================================================================== one-attribute leaves
@st.composite
def interval_lists(draw, n: int, max_size: int = 6) -> list[tuple[int, int]]:
    """Random half-open intervals ``[lo, hi)`` inside ``[0, n)``."""
    out = []
    for _ in range(draw(st.integers(1, max_size))):
        lo = draw(st.integers(0, n - 1))
        out.append((lo, lo + draw(st.integers(1, n - lo))))
    return out


@st.composite
def workload_blocks(draw, n: int, max_rows: int = 80) -> Pair:
    """One-attribute workload blocks (and explicit queries) over ``n`` values."""
    choices = ["identity", "total", "identity_total", "prefix", "ranges", "width", "predicates", "explicit", "sparse"]
    if n * (n + 1) // 2 <= max_rows:
        choices.append("allrange")
    kind = draw(st.sampled_from(choices))
    if kind == "identity":
        return Pair(Identity(n), np.eye(n))
    if kind == "total":
        return Pair(wl.Total(n), np.ones((1, n)))
    if kind == "identity_total":
        return Pair(wl.IdentityTotal(n), np.vstack([np.eye(n), np.ones((1, n))]))
    if kind == "prefix":
        return Pair(wl.Prefix(n), prefix_ref(n))
    if kind == "allrange":
        return Pair(wl.AllRange(n), allrange_ref(n))
    if kind == "ranges":
        intervals = draw(interval_lists(n))
        return Pair(wl.Ranges(n, intervals), interval_rows(n, intervals))
    if kind == "width":
        k = draw(st.integers(1, n))
        return Pair(wl.WidthKRange(n, k), width_k_ref(n, k))
    m = draw(st.integers(1, 5))
    if kind == "predicates":
        P = _rng(draw).integers(0, 2, size=(m, n)).astype(float)
        if draw(st.booleans()):
            return Pair(wl.Predicates(_sparse_of_kind(draw, P)), P)
        return Pair(wl.Predicates(P), P)
    A = draw(dense_arrays(m, n))
    if kind == "sparse":
        return Pair(Explicit(_sparse_of_kind(draw, A)), A)
    return Pair(Explicit(A), A)


@st.composite
def structural_leaves(draw, n: int) -> Pair:
    """The structural matrices of hdmm.matrix with ``n`` columns."""
    kind = draw(st.sampled_from(["identity", "ones", "diagonal", "explicit", "sparse", "prefix_gram", "allrange_gram"]))
    if kind == "identity":
        return Pair(Identity(n), np.eye(n))
    if kind == "ones":
        m = draw(st.integers(1, 5))
        return Pair(Ones(m, n), np.ones((m, n)))
    if kind == "diagonal":
        d = _rng(draw).integers(-2, 3, size=n).astype(float) if draw(st.booleans()) else _rng(draw).standard_normal(n)
        return Pair(Diagonal(d), np.diag(d))
    if kind == "prefix_gram":
        i = np.arange(n)
        return Pair(wl.PrefixGram(n), (n - np.maximum.outer(i, i)).astype(float))
    if kind == "allrange_gram":
        return Pair(wl.AllRangeGram(n), allrange_ref(n).T @ allrange_ref(n))
    m = draw(st.integers(1, 6))
    A = draw(dense_arrays(m, n))
    if kind == "sparse":
        return Pair(Explicit(_sparse_of_kind(draw, A)), A)
    return Pair(Explicit(A), A)


@st.composite
def marginal_leaves(draw, n: int) -> Pair:
    """Marginal workloads over a domain of ``n`` cells (a factorization of ``n``)."""
    shape = draw(st.sampled_from(factorizations(n)))
    d = len(shape)
    dom = tuple(shape)
    kind = draw(st.sampled_from(["marginals", "marginal", "dimk", "all"]))
    subsets = all_subsets(d)
    if kind == "marginal":
        s = draw(st.sampled_from(subsets))
        return Pair(Marginal(dom, s), marginal_block_ref(shape, s))
    if kind == "dimk":
        k = draw(st.integers(0, d))
        chosen = [s for s in subsets if len(s) == k]
        return Pair(DimKMarginals(dom, k), marginals_ref(shape, chosen, [1.0] * len(chosen)))
    if kind == "all":
        k = draw(st.integers(0, d))
        chosen = [s for s in subsets if len(s) <= k]
        return Pair(AllMarginals(dom, k), marginals_ref(shape, chosen, [1.0] * len(chosen)))
    chosen = draw(st.lists(st.sampled_from(subsets), min_size=1, max_size=4, unique=True))
    weights = draw(st.lists(st.floats(0.0, 3.0), min_size=len(chosen), max_size=len(chosen)))
    return Pair(Marginals(dom, dict(zip(chosen, weights))), marginals_ref(shape, chosen, weights))


@st.composite
def product_leaves(draw, n: int) -> Pair:
    """``workload.product`` over a domain of ``n`` cells; unnamed attributes are totals."""
    shape = draw(st.sampled_from(factorizations(n)))
    names = [f"x{i}" for i in range(len(shape))]
    dom = Domain(names, shape)
    chosen = draw(st.lists(st.sampled_from(range(len(shape))), unique=True, max_size=len(shape)))
    blocks, refs = {}, []
    for i, size in enumerate(shape):
        if i in chosen:
            block = draw(workload_blocks(size, max_rows=15))
            blocks[names[i] if draw(st.booleans()) else i] = block.mat
            refs.append(block.ref)
        else:
            refs.append(np.ones((1, size)))
    return Pair(wl.product(dom, blocks), kron_ref(refs))


def leaves(n: int) -> st.SearchStrategy[Pair]:
    return st.one_of(structural_leaves(n), workload_blocks(n), marginal_leaves(n), product_leaves(n))


# ====================================================================== compositions
def _proper_splits(n: int) -> list[tuple[int, int]]:
    return [(a, n // a) for a in range(1, n + 1) if n % a == 0 and 1 < a < n]


@st.composite
def weighting(draw, p: Pair) -> Pair:
    """``c * A`` written in one of the many ways numpy users would write it."""
    c = draw(st.sampled_from([0.0, -1.0, 0.5, 2.0, -3.0, 1.5]))
    how = draw(st.sampled_from(["rmul", "mul", "np_rmul", "np_mul", "div", "neg", "class", "np_int"]))
    if how == "rmul":
        return Pair(c * p.mat, c * p.ref)
    if how == "mul":
        return Pair(p.mat * c, c * p.ref)
    if how == "np_rmul":
        return Pair(np.float64(c) * p.mat, c * p.ref)
    if how == "np_mul":
        return Pair(p.mat * np.float64(c), c * p.ref)
    if how == "np_int":
        return Pair(np.int64(3) * p.mat, 3 * p.ref)
    if how == "div":
        return Pair(p.mat / 4, p.ref / 4)
    if how == "neg":
        return Pair(-p.mat, -p.ref)
    return Pair(Weighted(p.mat, c), c * p.ref)


@st.composite
def with_rows(draw, m: int, depth: int) -> Pair:
    """Matrices with exactly ``m`` rows (any number of columns)."""
    kinds = ["explicit", "sparse", "identity", "ones", "diagonal"]
    if depth > 0:
        kinds += ["transpose", "Transpose", "gram"]
        if _proper_splits(m):
            kinds.append("kron")
    kind = draw(st.sampled_from(kinds))
    if kind in ("explicit", "sparse"):
        k = draw(st.integers(1, 6))
        A = draw(dense_arrays(m, k))
        return Pair(Explicit(_sparse_of_kind(draw, A) if kind == "sparse" else A), A)
    if kind == "identity":
        return Pair(Identity(m), np.eye(m))
    if kind == "ones":
        k = draw(st.integers(1, 6))
        return Pair(Ones(m, k), np.ones((m, k)))
    if kind == "diagonal":
        d = _rng(draw).standard_normal(m)
        return Pair(Diagonal(d), np.diag(d))
    if kind == "kron":
        a, b = draw(st.sampled_from(_proper_splits(m)))
        left, right = draw(with_rows(a, depth - 1)), draw(with_rows(b, depth - 1))
        return Pair(Kronecker([left.mat, right.mat]), np.kron(left.ref, right.ref))
    inner = draw(matrices(m, depth - 1))
    if kind == "transpose":
        return Pair(inner.mat.T, inner.ref.T)
    if kind == "Transpose":
        return Pair(Transpose(inner.mat), inner.ref.T)
    return Pair(inner.mat.gram(), inner.ref.T @ inner.ref)


@st.composite
def same_shape(draw, m: int, n: int, depth: int) -> Pair:
    """A second matrix of shape ``(m, n)`` to add to a first one."""
    kinds = ["explicit", "sparse", "ones"]
    if m == n:
        kinds += ["identity", "diagonal"]
    if depth > 0 and m <= 40:
        kinds.append("product")
    kind = draw(st.sampled_from(kinds))
    if kind in ("explicit", "sparse"):
        A = draw(dense_arrays(m, n))
        return Pair(Explicit(_sparse_of_kind(draw, A) if kind == "sparse" else A), A)
    if kind == "ones":
        return Pair(2.0 * Ones(m, n), 2.0 * np.ones((m, n)))
    if kind == "identity":
        return Pair(Identity(n), np.eye(n))
    if kind == "diagonal":
        d = _rng(draw).standard_normal(n)
        return Pair(Diagonal(d), np.diag(d))
    right = draw(matrices(n, depth - 1))
    left = draw(dense_arrays(m, right.shape[0]))
    return Pair(Product(Explicit(left), right.mat), left @ right.ref)


@st.composite
def matrices(draw, n: int | None = None, depth: int = 2) -> Pair:
    """A random composition with ``n`` columns: Kronecker products, unions, weights, sums,
    products, transposes and Grams of leaves."""
    if n is None:
        n = draw(st.sampled_from(SIZES))
    kinds = ["leaf"]
    if depth > 0:
        kinds += ["vstack", "union", "weighted", "sum", "product", "transpose", "gram"]
        if _proper_splits(n):
            kinds += ["kron", "kron", "kron_product"]
    kind = draw(st.sampled_from(kinds))
    out = _compose(draw, kind, n, depth)
    if out is None or out.shape[0] > MAX_ROWS:
        out = draw(leaves(n))
    assert out.shape[1] == n
    return out


def _compose(draw, kind: str, n: int, depth: int) -> Pair | None:
    if kind == "leaf":
        return draw(leaves(n))
    if kind == "kron":
        a, b = draw(st.sampled_from(_proper_splits(n)))
        splits = [a, b]
        if draw(st.booleans()) and _proper_splits(b):
            b1, b2 = draw(st.sampled_from(_proper_splits(b)))
            splits = [a, b1, b2]
        parts = [draw(matrices(s, depth - 1)) for s in splits]
        return Pair(Kronecker([p.mat for p in parts]), kron_ref([p.ref for p in parts]))
    if kind == "kron_product":
        # Kronecker @ Kronecker with matching factors (simplified factor by factor)
        a, b = draw(st.sampled_from(_proper_splits(n)))
        right = [draw(matrices(a, depth - 1)), draw(matrices(b, depth - 1))]
        if max(r.shape[0] for r in right) > 30:
            return None
        left = [draw(matrices(r.shape[0], 0)) for r in right]
        L = Pair(Kronecker([p.mat for p in left]), kron_ref([p.ref for p in left]))
        R = Pair(Kronecker([p.mat for p in right]), kron_ref([p.ref for p in right]))
        return Pair(L.mat @ R.mat, L.ref @ R.ref)
    if kind in ("vstack", "union"):
        parts = draw(st.lists(matrices(n, depth - 1), min_size=1, max_size=3))
        if kind == "vstack":
            return Pair(VStack([p.mat for p in parts]), np.vstack([p.ref for p in parts]))
        weights = draw(st.lists(st.sampled_from([1.0, 0.5, 2.0, 3.0]), min_size=len(parts), max_size=len(parts)))
        names = [f"part{j}" for j in range(len(parts))]
        mat = wl.union([p.mat for p in parts], weights=weights, names=names)
        return Pair(mat, np.vstack([w * p.ref for w, p in zip(weights, parts)]))
    if kind == "weighted":
        return draw(weighting(draw(matrices(n, depth - 1))))
    if kind == "sum":
        first = draw(matrices(n, depth - 1))
        second = draw(same_shape(first.shape[0], n, depth - 1))
        how = draw(st.sampled_from(["add", "sub", "class"]))
        if how == "add":
            return Pair(first.mat + second.mat, first.ref + second.ref)
        if how == "sub":
            return Pair(first.mat - second.mat, first.ref - second.ref)
        return Pair(Sum([first.mat, second.mat, first.mat]), 2 * first.ref + second.ref)
    if kind == "product":
        right = draw(matrices(n, depth - 1))
        if right.shape[0] > 40:
            return None
        left = draw(matrices(right.shape[0], depth - 1))
        if draw(st.booleans()):
            return Pair(left.mat @ right.mat, left.ref @ right.ref)
        return Pair(Product(left.mat, right.mat), left.ref @ right.ref)
    if kind == "transpose":
        inner = draw(with_rows(n, depth - 1))
        if draw(st.booleans()):
            return Pair(inner.mat.T, inner.ref.T)
        return Pair(Transpose(inner.mat), inner.ref.T)
    if kind == "gram":
        inner = draw(matrices(n, depth - 1))
        return Pair(inner.mat.gram(), inner.ref.T @ inner.ref)
    raise AssertionError(kind)


@st.composite
def square_matrices(draw, n: int | None = None, depth: int = 2) -> Pair:
    """Square ``n x n`` matrices built from square pieces (Grams especially)."""
    if n is None:
        n = draw(st.sampled_from(SIZES))
    kinds = ["identity", "ones", "diagonal", "explicit", "sparse", "prefix_gram", "allrange_gram"]
    if depth > 0:
        kinds += ["gram", "gram", "marginals_gram", "weighted", "sum", "transpose", "product", "kron_of_grams"]
        if _proper_splits(n):
            kinds += ["kron", "kron"]
    kind = draw(st.sampled_from(kinds))
    if kind == "identity":
        return Pair(Identity(n), np.eye(n))
    if kind == "ones":
        return Pair(Ones(n, n), np.ones((n, n)))
    if kind == "diagonal":
        d = _rng(draw).standard_normal(n)
        return Pair(Diagonal(d), np.diag(d))
    if kind in ("explicit", "sparse"):
        A = draw(dense_arrays(n, n))
        return Pair(Explicit(_sparse_of_kind(draw, A) if kind == "sparse" else A), A)
    if kind == "prefix_gram":
        return Pair(wl.Prefix(n).gram(), prefix_ref(n).T @ prefix_ref(n))
    if kind == "allrange_gram":
        return Pair(wl.AllRange(n).gram() if n <= 12 else wl.AllRangeGram(n), allrange_ref(n).T @ allrange_ref(n))
    if kind == "gram":
        inner = draw(matrices(n, depth - 1))
        return Pair(inner.mat.gram(), inner.ref.T @ inner.ref)
    if kind == "marginals_gram":
        inner = draw(marginal_leaves(n))
        return Pair(inner.mat.gram(), inner.ref.T @ inner.ref)
    if kind == "kron_of_grams":
        shape = draw(st.sampled_from(factorizations(n)))
        parts = [draw(workload_blocks(s, max_rows=30)) for s in shape]
        return Pair(Kronecker([p.mat for p in parts]).gram(), kron_ref([p.ref.T @ p.ref for p in parts]))
    if kind == "weighted":
        return draw(weighting(draw(square_matrices(n, depth - 1))))
    if kind == "sum":
        parts = draw(st.lists(square_matrices(n, depth - 1), min_size=1, max_size=3))
        return Pair(Sum([p.mat for p in parts]), sum(p.ref for p in parts))
    if kind == "transpose":
        inner = draw(square_matrices(n, depth - 1))
        return Pair(Transpose(inner.mat) if draw(st.booleans()) else inner.mat.T, inner.ref.T)
    if kind == "product":
        left, right = draw(square_matrices(n, depth - 1)), draw(square_matrices(n, depth - 1))
        return Pair(left.mat @ right.mat, left.ref @ right.ref)
    a, b = draw(st.sampled_from(_proper_splits(n)))
    left, right = draw(square_matrices(a, depth - 1)), draw(square_matrices(b, depth - 1))
    return Pair(Kronecker([left.mat, right.mat]), np.kron(left.ref, right.ref))


@st.composite
def pinv_matrices(draw, n: int | None = None, depth: int = 2) -> Pair:
    """Matrices whose pseudo-inverse is structural: Explicit, Identity, Ones, Diagonal,
    Kronecker, Weighted and Transpose (rank-deficient ones included)."""
    if n is None:
        n = draw(st.sampled_from(SIZES[:12]))
    kinds = ["explicit", "deficient", "sparse", "identity", "ones", "diagonal"]
    if depth > 0:
        kinds += ["weighted", "transpose", "Transpose"]
        if _proper_splits(n):
            kinds += ["kron", "kron"]
    kind = draw(st.sampled_from(kinds))
    if kind in ("explicit", "sparse"):
        m = draw(st.integers(1, 7))
        A = _rng(draw).standard_normal((m, n))
        return Pair(Explicit(_sparse_of_kind(draw, A) if kind == "sparse" else A), A)
    if kind == "deficient":
        # exact low rank: repeated rows and a zero column
        m = draw(st.integers(2, 7))
        base = _rng(draw).integers(-2, 3, size=(1, n)).astype(float)
        A = np.vstack([base * (j + 1) for j in range(m)])
        A[:, 0] = 0.0
        return Pair(Explicit(A), A)
    if kind == "identity":
        return Pair(Identity(n), np.eye(n))
    if kind == "ones":
        m = draw(st.integers(1, 5))
        return Pair(Ones(m, n), np.ones((m, n)))
    if kind == "diagonal":
        d = _rng(draw).integers(-3, 4, size=n).astype(float)
        return Pair(Diagonal(d), np.diag(d))
    if kind == "weighted":
        inner = draw(pinv_matrices(n, depth - 1))
        c = draw(st.sampled_from([2.0, -0.5, 3.0, 0.0]))
        return Pair(Weighted(inner.mat, c), c * inner.ref)
    if kind in ("transpose", "Transpose"):
        inner = draw(pinv_matrices(draw(st.integers(1, 6)), depth - 1))
        # a transpose with n columns needs an inner matrix with n rows
        m = inner.shape[0]
        if m != n:
            A = _rng(draw).standard_normal((n, inner.shape[1]))
            inner = Pair(Explicit(A), A)
        return Pair(Transpose(inner.mat) if kind == "Transpose" else inner.mat.T, inner.ref.T)
    a, b = draw(st.sampled_from(_proper_splits(n)))
    left, right = draw(pinv_matrices(a, depth - 1)), draw(pinv_matrices(b, depth - 1))
    return Pair(Kronecker([left.mat, right.mat]), np.kron(left.ref, right.ref))


# ====================================================================== privacy
def privacies(gaussian_only: bool = False) -> st.SearchStrategy:
    gaussian = st.one_of(
        st.floats(0.05, 5.0).map(ZCDP),
        st.tuples(st.floats(0.1, 3.0), st.sampled_from([1e-3, 1e-6, 1e-9])).map(lambda t: ApproxDP(*t)),
    )
    if gaussian_only:
        return gaussian
    return st.one_of(st.floats(0.1, 5.0).map(PureDP), gaussian)


# ====================================================================== workloads and strategies over a domain
@st.composite
def domain_shapes(draw, max_cells: int = 48, max_dims: int = 3) -> tuple[int, ...]:
    d = draw(st.integers(1, max_dims))
    shape = tuple(draw(st.lists(st.integers(2, 5), min_size=d, max_size=d)))
    if math.prod(shape) > max_cells:
        shape = tuple(min(s, 3) for s in shape)
    if math.prod(shape) > max_cells:
        shape = shape[:2]
    return shape


@st.composite
def kron_terms(draw, shape: tuple[int, ...]) -> Pair:
    """A weighted Kronecker product with mixed one-attribute factors."""
    parts = [draw(workload_blocks(n, max_rows=21)) for n in shape]
    c = draw(st.sampled_from([1.0, 0.5, 2.0, -1.5]))
    how = draw(st.sampled_from(["kronecker", "product"]))
    if how == "product":
        mat = wl.product(shape, {i: p.mat for i, p in enumerate(parts)})
    else:
        mat = Kronecker([p.mat for p in parts]) if len(parts) > 1 else parts[0].mat
    ref = kron_ref([p.ref for p in parts])
    return Pair(mat if c == 1.0 else c * mat, c * ref)


@st.composite
def marginals_on(draw, shape: tuple[int, ...], min_weight: float = 0.3) -> Pair:
    subsets = all_subsets(len(shape))
    chosen = draw(st.lists(st.sampled_from(subsets), min_size=1, max_size=len(subsets), unique=True))
    weights = draw(st.lists(st.floats(min_weight, 2.0), min_size=len(chosen), max_size=len(chosen)))
    return Pair(Marginals(shape, dict(zip(chosen, weights))), marginals_ref(shape, chosen, weights))


@st.composite
def workloads_on(draw, shape: tuple[int, ...]) -> Pair:
    """A union of weighted Kronecker products with mixed factors, and/or marginals."""
    kinds = draw(st.lists(st.sampled_from(["kron", "kron", "marginals"]), min_size=1, max_size=3))
    parts = [draw(kron_terms(shape)) if k == "kron" else draw(marginals_on(shape)) for k in kinds]
    if len(parts) == 1 and draw(st.booleans()):
        return parts[0]
    return Pair(wl.union([p.mat for p in parts]), np.vstack([p.ref for p in parts]))


@st.composite
def strategies_on(draw, shape: tuple[int, ...]) -> Pair:
    """Strategies of every structure the error code distinguishes."""
    N = math.prod(shape)
    kind = draw(st.sampled_from(["kron_explicit", "identity", "marginals", "identity_total_union", "generic"]))
    rng = _rng(draw)
    if kind == "kron_explicit":
        parts = []
        for n in shape:
            if draw(st.integers(0, 3)) == 0:
                parts.append(Pair(Identity(n), np.eye(n)))
            else:
                A = rng.standard_normal((n + draw(st.integers(0, 2)), n))
                parts.append(Pair(Explicit(A), A))
        c = draw(st.sampled_from([1.0, 3.0, 0.25]))
        mat = Kronecker([p.mat for p in parts]) if len(parts) > 1 else parts[0].mat
        return Pair(mat if c == 1.0 else c * mat, c * kron_ref([p.ref for p in parts]))
    if kind == "identity":
        if draw(st.booleans()):
            return Pair(Identity(N), np.eye(N))
        return Pair(Kronecker([Identity(n) for n in shape]), np.eye(N))
    if kind == "marginals":
        return draw(marginals_on(shape))
    if kind == "identity_total_union":
        subsets = all_subsets(len(shape))
        chosen = draw(st.lists(st.sampled_from(subsets), min_size=2, max_size=len(subsets) + 1, unique=True)) if len(subsets) > 1 else subsets
        blocks, refs = [], []
        for s in chosen:
            w = draw(st.floats(0.3, 2.0))
            factors = [Identity(n) if i in s else wl.Total(n) for i, n in enumerate(shape)]
            mat = Kronecker(factors) if len(factors) > 1 else factors[0]
            blocks.append(w * mat)
            refs.append(w * marginal_block_ref(shape, s))
        return Pair(VStack(blocks), np.vstack(refs))
    # generic: no structured formula applies, the dense fall-back must be used
    how = draw(st.sampled_from(["explicit", "vstack", "product"]))
    if how == "explicit":
        A = rng.standard_normal((N + 2, N))
        return Pair(Explicit(A), A)
    if how == "vstack":
        B = rng.standard_normal((3, N))
        P = prefix_ref(N)
        return Pair(VStack([wl.Prefix(N), Explicit(B)]), np.vstack([P, B]))
    # a well-conditioned B, so that support is never a matter of rounding
    B = np.eye(N) + 0.2 * rng.standard_normal((N, N)) / np.sqrt(N)
    return Pair(Product(Explicit(B), wl.Prefix(N)), B @ prefix_ref(N))


# ====================================================================== dense formulas (docs/math.md, section 1.4)
def column_norm(ref: np.ndarray, p: int) -> float:
    return float(np.max(np.sum(np.abs(ref) ** p, axis=0)) ** (1.0 / p))


@dataclass
class DenseError:
    supported: bool
    variance: float
    total: float
    per_query: np.ndarray


def dense_error(W: np.ndarray, A: np.ndarray, privacy) -> DenseError:
    """TSE, per-query variances and support by the dense formulas of docs/math.md, section 1.4."""
    X = A.T @ A
    Xp = np.linalg.pinv(X)
    supported = np.linalg.norm(W - W @ Xp @ X) <= 1e-6 * max(np.linalg.norm(W), 1e-300)
    var = privacy.noise_variance(column_norm(A, privacy.norm))
    per_query = var * np.einsum("ij,ij->i", W @ Xp, W)
    return DenseError(bool(supported), var, float(var * np.trace(Xp @ W.T @ W)), per_query)


def dense_svd_bound(W: np.ndarray, privacy) -> float:
    s = np.linalg.svd(W, compute_uv=False)
    return privacy.noise_variance(1.0) * float(np.sum(s)) ** 2 / W.shape[1]
