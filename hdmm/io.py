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
from .optimizers.optimize import OptimizationResult
from .optimizers.pidentity import PIdentity
from .optimizers.root import SquareRootStrategy
from .spectral import DenseBasis, SineBasis, Spectrum

__all__ = ["save_strategy", "load_strategy", "FORMAT", "VERSION"]

FORMAT = "hdmm-strategy"
VERSION = 1


class _Writer:
    def __init__(self):
        self.arrays: dict[str, np.ndarray] = {}

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
            return {"type": "Explicit", "matrix": self.array(M.matrix)}
        if isinstance(M, BlockDiagonal):
            return {"type": "BlockDiagonal", "copies": M.copies, "tail": M.tail, "block": self.node(M.block)}
        if isinstance(M, Kronecker):
            # attribute names and value labels only label queries: kept, labels as text
            return {"type": "Kronecker", "factors": [self.node(f) for f in M.factors], "sep": M.sep,
                    "names": [None if n is None else str(n) for n in M.names],
                    "values": [None if v is None else [str(x) for x in v] for v in M.values]}
        if isinstance(M, VStack):
            return {"type": "VStack", "blocks": [self.node(b) for b in M.blocks]}
        if isinstance(M, Sum):
            return {"type": "Sum", "terms": [self.node(t) for t in M.terms]}
        if isinstance(M, Weighted):
            return {"type": "Weighted", "weight": M.weight, "base": self.node(M.base)}
        raise TypeError(f"cannot save a {type(M).__name__}: only hdmm's strategy matrix classes can be saved")


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
    writer = _Writer()
    header = {"format": FORMAT, "version": VERSION, "tree": writer.node(A), "metadata": metadata or {}}
    with contextlib.nullcontext(path) if hasattr(path, "write") else open(path, "wb") as file:
        np.savez_compressed(file, header=np.array(json.dumps(header)), **writer.arrays)


def _read(node: dict, arrays) -> Matrix:
    kind = node["type"]
    get = lambda key: arrays[node[key]]  # noqa: E731
    if kind == "Identity":
        return Identity(node["n"])
    if kind == "Ones":
        return Ones(*node["shape"])
    if kind == "Diagonal":
        return Diagonal(get("d"))
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
        return Explicit(get("matrix"))
    if kind == "BlockDiagonal":
        return BlockDiagonal(_read(node["block"], arrays), node["copies"], node.get("tail", 0))
    if kind == "Kronecker":
        return Kronecker([_read(f, arrays) for f in node["factors"]], node.get("names"), node.get("values"),
                         node.get("sep", " & "))
    if kind == "VStack":
        return VStack([_read(b, arrays) for b in node["blocks"]])
    if kind == "Sum":
        return Sum([_read(t, arrays) for t in node["terms"]])
    if kind == "Weighted":
        return Weighted(_read(node["base"], arrays), node["weight"])
    raise ValueError(f"unknown matrix type {kind!r} in strategy file")


def load_strategy(path: str | os.PathLike) -> tuple[Matrix, dict]:
    """Read a strategy written by :func:`save_strategy`; returns ``(strategy, metadata)``."""
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
        if header.get("format") != FORMAT:
            raise ValueError(f"{path} is not an hdmm strategy file (format {header.get('format')!r})")
        if header.get("version", 0) > VERSION:
            raise ValueError(
                f"{path} was written by a newer hdmm (strategy file version {header['version']}, "
                f"this hdmm reads up to {VERSION}); upgrade hdmm"
            )
        arrays = {key: archive[key] for key in archive.files if key != "header"}
    return _read(header["tree"], arrays), header.get("metadata", {})
