"""Saving and loading strategies: optimise once, release many times.

A strategy file is a numpy ``.npz`` archive holding a JSON description of the matrix tree
(``format``, ``version``, the tree with each node's class and parameters) and one array per
dense parameter. Only hdmm's own matrix classes are written; nothing is unpickled on load.
"""

from __future__ import annotations

import contextlib
import json
import os
import zipfile
from typing import Any

import numpy as np
import scipy.sparse as sp

from .block_diagonal import BlockDiagonal
from .marginals import Marginals, Residuals
from .matrix import Diagonal, Explicit, Identity, Kronecker, Matrix, Ones, Sum, VStack, Weighted
from .workload import AllRange, Prefix, Ranges
from .optimizers.api import OptimizationResult
from .optimizers.pidentity import PIdentity
from .optimizers.root import SquareRootStrategy
from .spectral import DenseBasis, SineBasis, Spectrum

__all__ = [
    "save_strategy",
    "load_strategy",
    "encode_matrix",
    "decode_matrix",
    "write_archive",
    "read_archive",
    "FORMAT",
    "VERSION",
]

FORMAT = "hdmm-strategy"
#: Version 2 adds workload matrices (ranges, labelled predicates, weighted unions) and plans;
#: version 1 files (strategies only) are read as before.
VERSION = 2


class _Writer:
    def __init__(self, arrays: dict[str, np.ndarray] | None = None):
        self.arrays: dict[str, np.ndarray] = {} if arrays is None else arrays

    def array(self, a: np.ndarray) -> str:
        key = f"a{len(self.arrays)}"
        self.arrays[key] = np.asarray(a)
        return key

    def node(self, M: Matrix) -> dict[str, Any]:
        if isinstance(M, Identity):
            return {"type": "Identity", "n": M.n}
        if isinstance(M, Ones):
            return {"type": "Ones", "shape": list(M.shape)}
        if isinstance(M, Diagonal):
            return {"type": "Diagonal", "d": self.array(M.d)}
        if isinstance(M, (Prefix, AllRange)):
            return {"type": type(M).__name__, "n": M.n}
        if isinstance(M, Ranges):
            return {"type": "Ranges", "n": M.n, "lo": self.array(M.lo), "hi": self.array(M.hi)}
        if isinstance(M, PIdentity):
            return {"type": "PIdentity", "T": self.array(M.params), "norm": M.norm}
        if isinstance(M, SquareRootStrategy):
            basis = M.gram_spectrum.basis
            node = {"type": "SquareRoot", "values": self.array(M.gram_spectrum.values), "theta": M.theta}
            if isinstance(basis, SineBasis):
                return {**node, "sine": basis.kind, "n": basis.n}
            return {**node, "Q": self.array(basis.Q)}
        if isinstance(M, (Marginals, Residuals)):
            return {"type": type(M).__name__, "domain": M.domain.to_dict(),
                    "members": self.array(M.members), "weights": self.array(M.weights)}
        if isinstance(M, Explicit):
            if M.is_sparse:
                csr = sp.csr_array(M.matrix)
                return {"type": "SparseExplicit", "shape": list(M.shape), "data": self.array(csr.data),
                        "indices": self.array(csr.indices), "indptr": self.array(csr.indptr)}
            node = {"type": "Explicit", "matrix": self.array(M.matrix)}
            return node if M.row_labels is None else {**node, "labels": list(M.row_labels)}
        if isinstance(M, BlockDiagonal):
            return {"type": "BlockDiagonal", "copies": M.copies, "tail": M.tail, "block": self.node(M.block)}
        if isinstance(M, Kronecker):
            # attribute names and value labels only label queries: kept, labels as text
            return {"type": "Kronecker", "factors": [self.node(f) for f in M.factors], "sep": M.sep,
                    "names": [None if n is None else str(n) for n in M.names],
                    "values": [None if v is None else [str(x) for x in v] for v in M.values]}
        if isinstance(M, VStack):
            node = {"type": "VStack", "names": None if M.names is None else [str(n) for n in M.names]}
            if M.weights is None:
                return {**node, "blocks": [self.node(b) for b in M.blocks]}
            return {**node, "blocks": [self.node(b) for b in M.parts], "weights": list(M.weights)}
        if isinstance(M, Sum):
            return {"type": "Sum", "terms": [self.node(t) for t in M.terms]}
        if isinstance(M, Weighted):
            return {"type": "Weighted", "weight": M.weight, "base": self.node(M.base)}
        raise TypeError(f"cannot save a {type(M).__name__}: only hdmm's own matrix classes can be saved")


def encode_matrix(M: Matrix, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """The JSON tree of matrix ``M``; its dense parameters are added to ``arrays`` (keys ``a0, a1, ...``)."""
    return _Writer(arrays).node(M)


def decode_matrix(node: dict, arrays: dict[str, np.ndarray]) -> Matrix:
    """The matrix of a tree written by :func:`encode_matrix`, with its ``arrays``."""
    return _read(node, arrays)


def write_archive(path, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Write a JSON ``header`` and named ``arrays`` as one ``.npz`` archive (a path, written as given, or a file)."""
    with contextlib.nullcontext(path) if hasattr(path, "write") else open(path, "wb") as file:
        np.savez_compressed(file, header=np.array(json.dumps(header)), **arrays)


def read_archive(path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read an hdmm archive: ``(header, arrays)``, after checking its format and version."""
    try:
        archive = np.load(path, allow_pickle=False)
    except (ValueError, zipfile.BadZipFile, EOFError):
        raise ValueError(f"{path} is not an hdmm strategy file (not a numpy .npz archive)") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError(f"{path} is not an hdmm strategy file (a single array, not an archive)")
    with archive:
        try:
            header = json.loads(str(archive["header"]))
        except KeyError:
            raise ValueError(f"{path} is not an hdmm strategy file (no header)") from None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            found = header.get("format") if isinstance(header, dict) else None
            raise ValueError(f"{path} is not an hdmm strategy file (format {found!r})")
        version = header.get("version", 0)
        if not isinstance(version, int) or isinstance(version, bool):
            raise ValueError(f"{path} is not a valid hdmm strategy file (version {version!r} is not a whole number)")
        if version > VERSION:
            raise ValueError(
                f"{path} was written by a newer hdmm (strategy file version {version}, "
                f"this hdmm reads up to {VERSION}); upgrade hdmm"
            )
        arrays = {key: archive[key] for key in archive.files if key != "header"}
    return header, arrays


def save_strategy(A: Matrix | OptimizationResult, path: str | os.PathLike, metadata: dict | None = None) -> None:
    """Write strategy ``A`` (and optional JSON-serialisable ``metadata``) to ``path``.

    ``path`` is a file name, written exactly as given (``.npz`` is the conventional suffix; none
    is added, so :func:`load_strategy` reads it back from the same path), or a binary file
    object. Given the result of :func:`hdmm.optimize`, its strategy is written and the metadata
    also records the privacy it was optimized for (``Privacy.to_dict()``, which
    ``Privacy.from_dict`` reads back), the optimizer, its expected total squared error and the
    number of queries.
    """
    if isinstance(A, OptimizationResult):
        metadata = {"privacy": A.privacy.to_dict(), "optimizer": A.optimizer,
                    "total_squared_error": float(A.error), "queries": int(A.error.queries), **(metadata or {})}
        A = A.strategy
    arrays: dict[str, np.ndarray] = {}
    header = {"format": FORMAT, "version": VERSION, "tree": encode_matrix(A, arrays), "metadata": metadata or {}}
    write_archive(path, header, arrays)


def _read(node: dict, arrays) -> Matrix:
    kind = node["type"]
    get = lambda key: arrays[node[key]]  # noqa: E731
    if kind == "Identity":
        return Identity(node["n"])
    if kind == "Ones":
        return Ones(*node["shape"])
    if kind == "Diagonal":
        return Diagonal(get("d"))
    if kind == "Prefix":
        return Prefix(node["n"])
    if kind == "AllRange":
        return AllRange(node["n"])
    if kind == "Ranges":
        return Ranges(node["n"], np.column_stack([get("lo"), get("hi")]))
    if kind == "PIdentity":
        return PIdentity(get("T"), node["norm"])
    if kind == "SquareRoot":
        basis = SineBasis(node["n"], node["sine"]) if "sine" in node else DenseBasis(get("Q"))
        return SquareRootStrategy(Spectrum(basis, get("values")), node["theta"])
    if kind in ("Marginals", "Residuals"):
        from .domain import Domain

        cls = Marginals if kind == "Marginals" else Residuals
        return cls.from_members(Domain.from_dict(node["domain"]), get("members"), get("weights"))
    if kind == "SparseExplicit":
        return Explicit(sp.csr_array((get("data"), get("indices"), get("indptr")), shape=tuple(node["shape"])))
    if kind == "Explicit":
        return Explicit(get("matrix"), node.get("labels"))
    if kind == "BlockDiagonal":
        return BlockDiagonal(_read(node["block"], arrays), node["copies"], node.get("tail", 0))
    if kind == "Kronecker":
        return Kronecker([_read(f, arrays) for f in node["factors"]], node.get("names"), node.get("values"),
                         node.get("sep", " & "))
    if kind == "VStack":
        return VStack([_read(b, arrays) for b in node["blocks"]], names=node.get("names"), weights=node.get("weights"))
    if kind == "Sum":
        return Sum([_read(t, arrays) for t in node["terms"]])
    if kind == "Weighted":
        return Weighted(_read(node["base"], arrays), node["weight"])
    raise ValueError(f"unknown matrix type {kind!r} in strategy file")


def load_strategy(path: str | os.PathLike) -> tuple[Matrix, dict]:
    """Read a strategy written by :func:`save_strategy`; returns ``(strategy, metadata)``.

    A plan file (:meth:`hdmm.Plan.save`) holds a strategy too, and is read the same way.
    """
    header, arrays = read_archive(path)
    if "tree" not in header:
        raise ValueError(f"{path} is not a valid hdmm strategy file (no strategy tree)")
    return _read(header["tree"], arrays), header.get("metadata", {})
