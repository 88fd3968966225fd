"""Saving and loading strategies: optimise once, release many times.

A strategy file is a numpy ``.npz`` archive holding a JSON description of the matrix tree
(``format``, ``version``, the tree with each node's class and parameters) and one array per
dense parameter. Only hdmm's own matrix classes are written; nothing is unpickled on load.

The same tree names a workload: :func:`workload_fingerprint` hashes it (and the arrays it
refers to) into a short text that plans, releases and release files record, so that a plan
made for one workload is never used to answer another (:func:`hdmm.run` refuses it).

Plan and release files also carry a SHA-256 checksum of their header and arrays
(:func:`with_checksum`, :func:`check_checksum`). It detects a damaged file or one edited
without recomputing it; it has no secret key, so it does not detect a forger who recomputes it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import warnings
import zipfile
import zlib
from typing import Any

import numpy as np
import numpy.lib.format as npformat
import scipy.sparse as sp

from .block_diagonal import BlockDiagonal
from .files import write_atomically
from .marginals import Helmert, Marginals, Residuals
from .residual_bases import ResidualBases
from .matrix import Diagonal, Explicit, Identity, Kronecker, Matrix, Ones, Sum, VStack, Weighted
from .workload import AllRange, Prefix, Ranges, unweighted
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
    "workload_fingerprint",
    "with_checksum",
    "archive_checksum",
    "check_checksum",
    "FORMAT",
    "VERSION",
]

FORMAT = "hdmm-strategy"
#: Version 2 adds workload matrices (ranges, labelled predicates, weighted unions) and plans;
#: version 1 files (strategies only) are read as before.
VERSION = 2

#: Memory budget for reading one file, in bytes (1 GiB by default): the archive's total
#: uncompressed size and the memory its arrays take once loaded (declared in their ``.npy``
#: headers, added up before any array is allocated) must fit, and so must the vectors that
#: checking its matrices needs (:data:`CHECK_BYTES_PER_CELL` per column of each node).
#: Raise it per call (``load_strategy(path, max_bytes=...)``) to read a larger file you trust.
MAX_BYTES = 1024**3

#: Bytes per column of a matrix node that checking a loaded matrix may need: its column norms
#: (the sensitivity) are computed as vectors of one entry per column of each node (a
#: Kronecker product's per factor), and a few such float64 vectors are alive at once.
#: :func:`decode_matrix` counts this for every node against ``max_bytes`` before any is made,
#: so that a file declaring ``Identity(2**40)`` is refused, not a ``MemoryError``.
CHECK_BYTES_PER_CELL = 32

#: Deepest matrix tree a file may hold (levels below the root).
MAX_DEPTH = 64

#: Most matrix nodes (and arrays) a file may hold.
MAX_NODES = 100_000

#: Largest size a file may give one dimension of a node (rows, columns, copies).
MAX_DIMENSION = 2**40

#: Relative tolerance on the unit norms a loaded square-root strategy must have (rows and
#: columns of its orthogonal basis, columns of the strategy).
UNIT_TOL = 1e-6


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
        if isinstance(M, ResidualBases):  # Helmert bases (the default) as null
            return {"type": "ResidualBases", "domain": M.domain.to_dict(), "members": self.array(M.members),
                    "weights": self.array(M.weights),
                    "bases": [None if isinstance(B, Helmert) else self.node(B) for B in M.bases]}
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


def decode_matrix(node: dict, arrays: dict[str, np.ndarray], source: str = "the file", *,
                  max_bytes: int = MAX_BYTES) -> Matrix:
    """The matrix of a tree written by :func:`encode_matrix`, with its ``arrays``.

    Every node and array is checked before a matrix is built: node types and parameters,
    array dtypes (integer indices, finite float data), dimensions and sizes against the node's
    declared shape, sparse index structure, the tree's depth (``MAX_DEPTH``) and node count
    (``MAX_NODES``). A file that fails any check raises one ``ValueError`` naming ``source``,
    the node and the problem.

    The memory that checking the matrix later needs must fit ``max_bytes`` too: vectors of one
    entry per column of each node (``CHECK_BYTES_PER_CELL`` bytes per column, added up over
    the tree; a Kronecker product counts its factors' columns, not their product). An implicit
    node declaring a huge domain (``Identity(2**40)``, a sparse matrix of ``2**40`` columns) is
    refused here with a ``ValueError``, before anything of its size is made.
    """
    return _Reader(arrays, source, _check_limit(max_bytes)).node(node, "tree", 0)


#: What :func:`workload_fingerprint` hashes is described by this scheme name (hashed too): a new scheme
#: would give every workload a new fingerprint, never the old one for a different workload.
FINGERPRINT_SCHEME = "hdmm-workload-fingerprint-1"

#: Columns of the fixed probe matrix by which :func:`workload_fingerprint` describes a matrix class
#: hdmm cannot save.
FINGERPRINT_PROBES = 2


class _FingerprintWriter(_Writer):
    """:class:`_Writer` with canonical arrays, and a description of matrices hdmm cannot save.

    Arrays are canonical so that a matrix and its copy read back from a file hash alike:
    integers and booleans as int64, numbers as float64, sparse matrices with summed duplicate
    entries, sorted indices and no stored zeros. A node of a class hdmm cannot save (a user's
    subclass of :class:`hdmm.matrix.Matrix`) is described by its class name, its shape and its
    products with ``FINGERPRINT_PROBES`` fixed pseudo-random vectors: implicit (one product
    with an ``N x FINGERPRINT_PROBES`` array, as much memory as two data vectors; never a dense
    matrix), and stable on one installation of hdmm and numpy.
    """

    def array(self, a: np.ndarray) -> str:
        a = np.asarray(a)
        if a.dtype.kind in "biu":
            a = a.astype("<i8", copy=False)
        elif a.dtype.kind == "f":
            a = a.astype("<f8", copy=False)
        return super().array(a)

    def node(self, M: Matrix) -> dict[str, Any]:
        if isinstance(M, Explicit) and M.is_sparse:
            csr = sp.csr_array(M.matrix, copy=True)
            csr.sum_duplicates()
            csr.eliminate_zeros()
            csr.sort_indices()
            return {"type": "SparseExplicit", "shape": list(M.shape), "data": self.array(csr.data),
                    "indices": self.array(csr.indices), "indptr": self.array(csr.indptr)}
        try:
            return super().node(M)
        except TypeError:
            if not isinstance(M, Matrix):
                raise
        try:
            probes = np.random.default_rng(0).standard_normal((M.shape[1], FINGERPRINT_PROBES))
            products = np.asarray(M @ probes, dtype=np.float64)
        except (MemoryError, ValueError) as exc:
            raise ValueError(f"cannot fingerprint {M!r}: hdmm cannot save a {type(M).__name__}, and its products with "
                             f"{FINGERPRINT_PROBES} probe vectors of {M.shape[1]:,} cells failed ({exc}); build the "
                             "workload from hdmm's matrix classes") from None
        return {"type": "other", "class": f"{type(M).__module__}.{type(M).__qualname__}", "shape": list(M.shape),
                "probes": self.array(products)}


def _json_value(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot describe a {type(value).__name__} in a workload fingerprint")


def workload_fingerprint(W: Matrix, domain: Any = None, *, row_weights: np.ndarray | None = None) -> str:
    """A stable hash of a workload's queries and weights (and optionally its domain): ``"sha256:<64 hex digits>"``.

    A workload built the same way always has the same fingerprint; workloads that differ in
    their queries, labels, number of cells or :func:`hdmm.union` weight per query have different
    ones (barring a SHA-256 collision). It identifies the workload as written, not only its
    matrix: ``Identity(8)`` and ``Explicit(np.eye(8))`` differ. What is hashed is the workload's
    implicit structure, as
    :func:`save_strategy` writes it (each node's class and parameters, e.g. ``Kronecker`` with
    its factors, attribute names and value labels; ``Prefix`` with its size), and the arrays
    it refers to (dense or sparse entries, range bounds, marginal weights): a large implicit
    workload is never made dense. The weights enter as one weight per query
    (:func:`hdmm.workload.unweighted`), so a workload and its copy read back from a file, or
    two ways of writing the same weighted union, have the same fingerprint.

    A :class:`hdmm.planning.Plan` records the fingerprint of the workload it was made for
    (:attr:`hdmm.planning.Plan.fingerprint`), so does every release (:meth:`hdmm.release.Release.provenance`)
    and release file; :func:`hdmm.run` refuses a plan made for another workload.

    Parameters
    ----------
    W
        The workload (an hdmm matrix, :func:`hdmm.union` weights included).
    domain
        Optionally an :class:`hdmm.Domain` of ``W.shape[1]`` cells: its attribute names, sizes
        and value labels are hashed too (how records map to cells). ``None`` (default): the
        workload alone.
    row_weights
        For a workload already split into its queries and one weight per query (as a plan
        keeps them): those weights. ``W`` must then carry no union weights itself.

    Returns
    -------
    str

    Notes
    -----
    For hdmm's own matrix classes the fingerprint is the same on every machine and every
    run. A matrix class hdmm cannot save (a user's subclass of ``hdmm.matrix.Matrix``) is
    described by its class name, shape and its products with fixed probe vectors, which
    identifies it on one installation but may differ in the last bits across numpy builds.
    The fingerprint is a checksum, not a signature: it detects a mix-up or an edit, not a
    forger who recomputes it.

    Examples
    --------
    >>> import hdmm
    >>> workload_fingerprint(hdmm.Prefix(8)) == workload_fingerprint(hdmm.Prefix(8))
    True
    >>> workload_fingerprint(hdmm.Identity(8)) == workload_fingerprint(hdmm.matrix.Ones(8, 8))
    False
    """
    if not isinstance(W, Matrix):
        raise TypeError(f"the workload must be an hdmm matrix, got {type(W).__name__}")
    queries, weights = unweighted(W)
    if row_weights is not None:
        if weights is not None:
            raise ValueError("give row_weights only for a workload without union weights of its own")
        weights = np.asarray(row_weights, dtype=np.float64)
        if weights.shape != (W.shape[0],):
            raise ValueError(f"row_weights must hold one weight per query ({W.shape[0]:,}), got shape {weights.shape}")
    if weights is not None and np.all(weights == 1.0):
        weights = None  # as hdmm.workload.unweighted says of a union whose weights are all 1
    described = None
    if domain is not None:
        size = getattr(domain, "size", None)
        if not hasattr(domain, "to_dict") or size != W.shape[1]:
            raise ValueError(f"the domain must be an hdmm.Domain of the workload's {W.shape[1]:,} cells, "
                             f"got {domain!r}")
        described = [[str(name), spec] for name, spec in domain.to_dict().items()]
    writer = _FingerprintWriter()
    tree = writer.node(queries)
    if weights is not None:
        tree = {"type": "weights", "queries": tree, "weights": writer.array(weights)}
    header = json.dumps({"scheme": FINGERPRINT_SCHEME, "shape": list(W.shape), "workload": tree, "domain": described},
                        sort_keys=True, separators=(",", ":"), allow_nan=False, default=_json_value)
    digest = hashlib.sha256(header.encode())
    for key, a in writer.arrays.items():  # keys a0, a1, ... in the order the tree refers to them
        a = np.ascontiguousarray(a)
        digest.update(json.dumps([key, a.dtype.str, list(a.shape)]).encode())
        digest.update(a.reshape(-1).view(np.uint8))
    return "sha256:" + digest.hexdigest()


#: The header entry of a plan or release file that holds its checksum (:func:`archive_checksum`).
CHECKSUM_KEY = "checksum"


def archive_checksum(header: dict[str, Any], arrays: dict[str, np.ndarray]) -> str:
    """The SHA-256 checksum of an archive's contents: its JSON header (less ``CHECKSUM_KEY``) and every array.

    The header is hashed as canonical JSON (sorted keys, no spaces), each array by name, dtype,
    shape and bytes in C order, in the order of their names: ``"sha256:<64 hex digits>"``.
    """
    entries = {k: v for k, v in header.items() if k != CHECKSUM_KEY}
    digest = hashlib.sha256(json.dumps(entries, sort_keys=True, separators=(",", ":")).encode())
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        digest.update(json.dumps([name, a.dtype.str, list(a.shape)]).encode())
        digest.update(a.reshape(-1).view(np.uint8))
    return "sha256:" + digest.hexdigest()


def with_checksum(header: dict[str, Any], arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """``header`` as the file will hold it (its JSON read back), with the checksum of it and ``arrays`` added."""
    stored = json.loads(json.dumps(header))
    stored[CHECKSUM_KEY] = archive_checksum(stored, arrays)
    return stored


def check_checksum(header: dict[str, Any], arrays: dict[str, np.ndarray], source, kind: str) -> None:
    """Refuse a file whose contents do not match the checksum it records; warn when it records none.

    A file written before checksums were recorded is read with a ``UserWarning`` (its other
    checks still apply). The checksum detects damage and edits made without recomputing it, not
    a forger who recomputes it (it has no secret key).
    """
    stored = header.get(CHECKSUM_KEY)
    if stored is None:
        warnings.warn(f"{source} records no checksum (it was written by an earlier hdmm): the {kind} was checked "
                      "for consistency, but an edit that keeps it consistent cannot be detected", UserWarning,
                      stacklevel=3)
        return
    if stored != archive_checksum(header, arrays):
        raise ValueError(f"{source}: its contents do not match the checksum it records: the {kind} file was damaged "
                         f"or edited after it was written; use the file as hdmm wrote it, or make the {kind} again")


def write_archive(path, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Write a JSON ``header`` and named ``arrays`` as one ``.npz`` archive: to a file object, or to the path as
    given, whole or not at all and flushed to disk (:func:`hdmm.files.write_atomically`)."""
    def write(file) -> None:
        np.savez_compressed(file, header=np.array(json.dumps(header)), **arrays)

    if hasattr(path, "write"):
        write(path)
        return

    def write_path(temporary: str) -> None:
        with open(temporary, "wb") as file:
            write(file)

    write_atomically(path, write_path)


def read_archive(path, *, max_bytes: int = MAX_BYTES) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read an hdmm archive: ``(header, arrays)``, after checking its format and version.

    Nothing is unpickled, and nothing larger than ``max_bytes`` is read: the archive's total
    uncompressed size (from the zip directory) and the memory all its arrays take once loaded
    (from their ``.npy`` headers, every one read before any array is allocated) must fit, and
    loading peaks at about that total, which bounds the memory a hostile file (a zip bomb, a
    header declaring terabytes) can claim. Raise ``max_bytes`` to read a larger file you trust.

    Raises
    ------
    ValueError
        If the file is not an hdmm archive, is damaged, or exceeds ``max_bytes``.
    """
    limit = _check_limit(max_bytes)
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, EOFError, ValueError):
        raise ValueError(f"{path} is not an hdmm strategy file (not a numpy .npz archive)") from None
    with archive:
        try:
            arrays = _read_members(archive, path, limit)
        except (zipfile.BadZipFile, EOFError, OSError, zlib.error, NotImplementedError, RuntimeError) as exc:
            raise ValueError(f"{path} is not a valid hdmm strategy file (a damaged archive: {exc})") from None
    header_array = arrays.pop("header", None)
    if header_array is None:
        raise ValueError(f"{path} is not an hdmm strategy file (no header)")
    if header_array.ndim != 0 or header_array.dtype.kind != "U":
        raise ValueError(f"{path} is not an hdmm strategy file (the header is not a JSON text)")
    try:
        header = json.loads(str(header_array))
    except RecursionError:
        raise ValueError(f"{path} is not a valid hdmm strategy file (its header is nested too deeply: a matrix tree "
                         f"may be at most {MAX_DEPTH} levels deep)") from None
    except ValueError:
        raise ValueError(f"{path} is not an hdmm strategy file (the header is not valid JSON)") from None
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
    return header, arrays


def _check_limit(max_bytes) -> int:
    if not isinstance(max_bytes, (int, np.integer)) or isinstance(max_bytes, bool) or max_bytes < 1:
        raise ValueError(f"max_bytes must be a positive integer (bytes), got {max_bytes!r}")
    return int(max_bytes)


def _read_members(archive: zipfile.ZipFile, path, limit: int) -> dict[str, np.ndarray]:
    """Every ``.npy`` member of ``archive``, all their sizes checked against ``limit`` before any is read.

    Two passes: the first reads only each member's ``.npy`` header and adds up the memory its
    array will take once loaded (:func:`_held_bytes`); the second, run only if the total fits,
    reads the arrays in chunks straight into their buffers, so that loading peaks at that total
    (not at twice it, as one ``read`` of a whole member would).
    """
    members = archive.infolist()
    if len(members) > MAX_NODES:
        raise ValueError(f"{path} is not a valid hdmm strategy file ({len(members):,} arrays, more than {MAX_NODES:,})")
    total = sum(info.file_size for info in members)
    if total > limit:
        raise ValueError(
            f"{path} holds {total:,} bytes uncompressed, more than the limit of {limit:,}: refused unread; if you "
            "trust the file, raise the limit (max_bytes=...)"
        )
    names: set[str] = set()
    declared = []
    held = 0
    for info in members:
        name = info.filename[:-4]
        if not info.filename.endswith(".npy") or name in names:
            raise ValueError(f"{path} is not a valid hdmm strategy file (unexpected member {info.filename!r})")
        names.add(name)
        where = f"{path}: array {name!r}"
        with archive.open(info) as member:
            shape, fortran, dtype = _npy_header(member, where)
        size = math.prod(shape) * dtype.itemsize
        held += _held_bytes(shape, dtype)
        if held > limit:
            raise ValueError(
                f"{where} declares {size:,} bytes (shape {shape}, {dtype}); with the arrays before it, loading the "
                f"file would take {held:,} bytes of memory, more than the limit of {limit:,}: refused unread; if you "
                "trust the file, raise the limit (max_bytes=...)"
            )
        if size > info.file_size:
            raise ValueError(f"{where} declares {size:,} bytes (shape {shape}) but the archive holds only "
                             f"{info.file_size:,}")
        declared.append((info, name, where, shape, fortran, dtype))
    arrays: dict[str, np.ndarray] = {}
    for info, name, where, shape, fortran, dtype in declared:
        with archive.open(info) as member:
            if _npy_header(member, where) != (shape, fortran, dtype):
                raise ValueError(f"{where} changed while it was read")
            arrays[name] = _read_data(member, where, shape, fortran, dtype)
    return arrays


def _npy_header(member, where: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    """``(shape, fortran_order, dtype)`` of one ``.npy`` member, checked; nothing after its header is read."""
    try:
        version = npformat.read_magic(member)
        if version == (1, 0):
            shape, fortran, dtype = npformat.read_array_header_1_0(member)
        elif version == (2, 0):
            shape, fortran, dtype = npformat.read_array_header_2_0(member)
        else:
            raise ValueError(f"unsupported .npy version {version}")
    except ValueError as exc:
        raise ValueError(f"{where} has an invalid .npy header ({exc})") from None
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise ValueError(f"{where} has an invalid .npy header: shape {shape} must hold whole numbers >= 0")
    if dtype.kind not in "biufU" or dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise ValueError(f"{where} has dtype {dtype}: hdmm files hold only numbers and text (no objects)")
    return shape, fortran, dtype


def _held_bytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    """The memory an array of ``shape`` and ``dtype`` takes once loaded and checked.

    Its own bytes, plus, for numbers not stored as 64-bit, the float64 or int64 copy the checks
    of :func:`decode_matrix` make of it (both are kept: the archive's arrays and the matrix).
    """
    count = math.prod(shape)
    own = count * dtype.itemsize
    if dtype.kind in "biuf" and dtype not in (np.dtype(np.float64), np.dtype(np.int64)):
        own += 8 * count
    return own


#: Bytes :func:`_read_data` reads at a time: a whole member in one ``read`` would first be a
#: second copy of the array.
READ_CHUNK = 2**20


def _read_data(member, where: str, shape: tuple[int, ...], fortran: bool, dtype: np.dtype) -> np.ndarray:
    """The data after a ``.npy`` header, read in chunks of ``READ_CHUNK`` into one array of ``shape``."""
    count = math.prod(shape)
    size = count * dtype.itemsize
    out = np.empty(count, dtype=dtype)
    view = memoryview(out.view(np.uint8))
    filled = 0
    while filled < size:
        got = member.readinto(view[filled:filled + READ_CHUNK])
        if not got:
            raise ValueError(f"{where} is truncated ({filled:,} of {size:,} bytes)")
        filled += got
    return out.reshape(shape, order="F" if fortran else "C")


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


def _message(exc: BaseException) -> str:
    return str(exc.args[0]) if len(exc.args) == 1 and isinstance(exc.args[0], str) else str(exc)


class _FileError(ValueError):
    """A file that fails a check (raised once, with the node's place in the tree)."""


class _Reader:
    """Builds a matrix tree from its JSON nodes and arrays, checking each before use."""

    def __init__(self, arrays: dict[str, np.ndarray], source: str, limit: int = MAX_BYTES):
        self.arrays, self.source, self.count = arrays, source, 0
        self.limit, self.cells = limit, 0

    def columns(self, cells: int, where: str, count: bool = True) -> int:
        """Count ``cells`` columns against the memory budget of the checks (``CHECK_BYTES_PER_CELL`` each).

        With ``count=False`` only check that they would fit: for a node whose own construction
        takes memory in proportion to its declared columns (``Prefix``), before it is built.
        """
        need = (self.cells + cells) * CHECK_BYTES_PER_CELL
        if count:
            self.cells += cells
        if need > self.limit:
            raise self.budget(where, f"{cells:,} columns: checking the matrix (its column norms, for the "
                                     f"sensitivity) would take {need:,} bytes of memory, more than the limit of "
                                     f"{self.limit:,}")
        return cells

    def budget(self, where: str, problem: str) -> ValueError:
        return _FileError(f"{self.source}: {where}: {problem}: refused before any of it is made; if you trust the "
                          "file, raise the limit (max_bytes=...)")

    def fail(self, where: str, problem: str) -> ValueError:
        return _FileError(
            f"{self.source} is not a valid hdmm strategy file: {where}: {problem}; the file is damaged or was not "
            "written by hdmm: save it again with hdmm"
        )

    # ------------------------------------------------------------------ values
    def integer(self, node: dict, key: str, where: str, minimum: int = 1) -> int:
        value = self.field(node, key, where)
        if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= MAX_DIMENSION:
            raise self.fail(where, f"{key} must be a whole number from {minimum} to {MAX_DIMENSION:,}, got {value!r}")
        return value

    def number(self, node: dict, key: str, where: str) -> float:
        value = self.field(node, key, where)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise self.fail(where, f"{key} must be a finite number, got {value!r}")
        return float(value)

    def field(self, node: dict, key: str, where: str):
        if key not in node:
            raise self.fail(where, f"a {node['type']} node needs {key!r}")
        return node[key]

    def texts(self, value, where: str, key: str, size: int | None, optional_items: bool = False) -> list | None:
        """``value`` if it is None or a list of texts (of ``size`` entries, unless ``size`` is None)."""
        if value is None:
            return None
        if not isinstance(value, list) or (size is not None and len(value) != size) or not all(
                isinstance(v, str) or (optional_items and v is None) for v in value):
            count = "" if size is None else f"{size} "
            raise self.fail(where, f"{key} must be a list of {count}texts, got {_brief(value)}")
        return value

    def array(self, node: dict, key: str, where: str, kind: str, ndim: int) -> np.ndarray:
        """The array named by ``node[key]``: ``kind`` ``"float"`` (finite numbers) or ``"int"`` (integers)."""
        name = self.field(node, key, where)
        if not isinstance(name, str) or name not in self.arrays:
            raise self.fail(where, f"{key} names array {_brief(name)}, which the file does not hold")
        a = self.arrays[name]
        kinds = "iu" if kind == "int" else "biuf"
        if a.dtype.kind not in kinds:
            raise self.fail(where, f"{key} has dtype {a.dtype}, expected {'integers' if kind == 'int' else 'numbers'}")
        if a.ndim != ndim:
            raise self.fail(where, f"{key} has shape {a.shape}, expected a {ndim}-D array")
        if kind == "int":
            return a.astype(np.int64, copy=False)
        a = a.astype(np.float64, copy=False)
        # min and max see a NaN or an infinity without a temporary array of the array's size
        if a.size and not (math.isfinite(a.min()) and math.isfinite(a.max())):
            raise self.fail(where, f"{key} holds NaN or infinite entries")
        return a

    # ------------------------------------------------------------------ nodes
    def node(self, node, where: str, depth: int) -> Matrix:
        if depth > MAX_DEPTH:
            raise self.fail(where, f"the matrix tree is nested more than {MAX_DEPTH} levels deep")
        self.count += 1
        if self.count > MAX_NODES:
            raise self.fail(where, f"the matrix tree has more than {MAX_NODES:,} nodes")
        if not isinstance(node, dict):
            raise self.fail(where, f"a matrix node must be a JSON object, got {_brief(node)}")
        kind = node.get("type")
        if not isinstance(kind, str) or kind not in _NODE_TYPES:
            raise self.fail(where, f"unknown matrix type {_brief(kind)}")
        where = f"{where} ({kind})"
        try:
            M = getattr(self, f"read_{kind}")(node, where, depth)
            self.columns(_own_columns(M), where)
            return M
        except _FileError:
            raise
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError,
                np.linalg.LinAlgError) as exc:
            raise self.fail(where, _message(exc)) from None

    def children(self, node: dict, key: str, where: str, depth: int) -> list[Matrix]:
        items = self.field(node, key, where)
        if not isinstance(items, list) or not items:
            raise self.fail(where, f"{key} must be a non-empty list of matrix nodes, got {_brief(items)}")
        return [self.node(item, f"{where}.{key}[{i}]", depth + 1) for i, item in enumerate(items)]

    def declared(self, node: dict, key: str, where: str) -> int:
        """``integer(node, key)``, a number of columns checked against the budget before the node is built."""
        return self.columns(self.integer(node, key, where), where, count=False)

    def read_Identity(self, node, where, depth):
        return Identity(self.declared(node, "n", where))

    def read_Ones(self, node, where, depth):
        shape = self.field(node, "shape", where)
        if not isinstance(shape, list) or len(shape) != 2:
            raise self.fail(where, f"shape must be [rows, columns], got {_brief(shape)}")
        sizes = {"shape": None, "m": shape[0], "n": shape[1]}
        return Ones(self.integer(sizes, "m", where), self.declared(sizes, "n", where))

    def read_Diagonal(self, node, where, depth):
        return Diagonal(self.array(node, "d", where, "float", 1))

    def read_Prefix(self, node, where, depth):
        return Prefix(self.declared(node, "n", where))

    def read_AllRange(self, node, where, depth):
        return AllRange(self.declared(node, "n", where))

    def read_Ranges(self, node, where, depth):
        n = self.declared(node, "n", where)
        lo, hi = self.array(node, "lo", where, "int", 1), self.array(node, "hi", where, "int", 1)
        if lo.shape != hi.shape:
            raise self.fail(where, f"lo and hi have {lo.size:,} and {hi.size:,} entries")
        return Ranges(n, np.column_stack([lo, hi]))

    def read_PIdentity(self, node, where, depth):
        norm = self.field(node, "norm", where)
        if norm not in (1, 2) or isinstance(norm, bool):
            raise self.fail(where, f"norm must be 1 or 2, got {_brief(norm)}")
        return PIdentity(self.array(node, "T", where, "float", 2), norm)

    def read_SquareRoot(self, node, where, depth):
        values = self.array(node, "values", where, "float", 1)
        theta = self.number(node, "theta", where)
        if "sine" in node:
            n = self.integer(node, "n", where)
            if n != values.size:
                raise self.fail(where, f"{values.size:,} eigenvalues for a sine basis of size {n:,}")
            basis = SineBasis(n, node["sine"])
        else:
            Q = self.array(node, "Q", where, "float", 2)
            if Q.shape != (values.size, values.size):
                raise self.fail(where, f"Q has shape {Q.shape}, expected ({values.size}, {values.size})")
            for axis, name in ((1, "row"), (0, "column")):
                norms = np.linalg.norm(Q, axis=axis)
                if np.any(np.abs(norms - 1.0) > UNIT_TOL):
                    j = int(np.argmax(np.abs(norms - 1.0)))
                    raise self.fail(where, f"Q is not orthogonal: {name} {j} has norm {norms[j]:.6g}, not 1")
            basis = DenseBasis(Q)
        strategy = SquareRootStrategy(Spectrum(basis, values), theta)
        norms = strategy.column_norm_powers(2).to_array()
        if not np.all(np.abs(norms - 1.0) <= UNIT_TOL):
            raise self.fail(where, "its columns do not have unit L2 norm (zero or degenerate rows in its basis)")
        return strategy

    def read_Marginals(self, node, where, depth):
        from .domain import Domain

        cls = Marginals if node["type"] == "Marginals" else Residuals
        name = self.field(node, "members", where)
        members = self.arrays.get(name) if isinstance(name, str) else None
        if members is None or members.dtype.kind not in "biu" or members.ndim != 2 or not np.all(
                (members == 0) | (members == 1)):
            raise self.fail(where, "members must be a 2-D array of 0/1 (or boolean) attribute memberships")
        domain = self.field(node, "domain", where)
        if not isinstance(domain, dict):
            raise self.fail(where, f"domain must be a JSON object, got {_brief(domain)}")
        weights = self.array(node, "weights", where, "float", 1)
        domain = Domain.from_dict(domain)
        self.columns(sum(domain.shape), where, count=False)  # one vector per attribute, made when it is built
        return cls.from_members(domain, members, weights)

    read_Residuals = read_Marginals

    def read_ResidualBases(self, node, where, depth):
        marginals = self.read_Marginals({**node, "type": "Residuals"}, where, depth)
        bases = self.field(node, "bases", where)
        if not isinstance(bases, list) or len(bases) != len(marginals.domain):
            raise self.fail(where, f"bases must be a list of {len(marginals.domain)} matrix nodes or nulls, "
                                   f"got {_brief(bases)}")
        bases = [None if b is None else self.node(b, f"{where}.bases[{i}]", depth + 1) for i, b in enumerate(bases)]
        return ResidualBases.from_members(marginals.domain, marginals.members, marginals.weights, bases)

    def read_SparseExplicit(self, node, where, depth):
        shape = self.field(node, "shape", where)
        if not isinstance(shape, list) or len(shape) != 2:
            raise self.fail(where, f"shape must be [rows, columns], got {_brief(shape)}")
        sizes = {"m": shape[0], "n": shape[1]}
        m, n = self.integer(sizes, "m", where), self.declared(sizes, "n", where)
        data = self.array(node, "data", where, "float", 1)
        indices = self.array(node, "indices", where, "int", 1)
        indptr = self.array(node, "indptr", where, "int", 1)
        if indices.size != data.size:
            raise self.fail(where, f"{indices.size:,} column indices for {data.size:,} entries")
        if indptr.size != m + 1:
            raise self.fail(where, f"indptr has {indptr.size:,} entries, expected rows + 1 = {m + 1:,}")
        if indptr[0] != 0 or indptr[-1] != data.size or np.any(np.diff(indptr) < 0):
            raise self.fail(where, f"indptr must rise from 0 to the number of entries ({data.size:,}) without "
                                   "decreasing")
        if indices.size and (indices.min() < 0 or indices.max() >= n):
            bad = int(indices[(indices < 0) | (indices >= n)][0])
            raise self.fail(where, f"column index {bad:,} is outside the matrix's {n:,} columns")
        matrix = sp.csr_array((data, indices, indptr), shape=(m, n))
        if not matrix.has_canonical_format:  # sorted in place: on copies, not on the file's arrays (its checksum)
            matrix = sp.csr_array((data.copy(), indices.copy(), indptr.copy()), shape=(m, n))
            matrix.sum_duplicates()  # repeated (row, column) entries add up: column norms must see their sum
        return Explicit(matrix)

    def read_Explicit(self, node, where, depth):
        matrix = self.array(node, "matrix", where, "float", 2)
        return Explicit(matrix, self.texts(node.get("labels"), where, "labels", matrix.shape[0]))

    def read_BlockDiagonal(self, node, where, depth):
        block = self.node(self.field(node, "block", where), f"{where}.block", depth + 1)
        sizes = {"copies": node.get("copies"), "tail": node.get("tail", 0)}
        return BlockDiagonal(block, self.integer(sizes, "copies", where), self.integer(sizes, "tail", where, 0))

    def read_Kronecker(self, node, where, depth):
        factors = self.children(node, "factors", where, depth)
        names = self.texts(node.get("names"), where, "names", len(factors), optional_items=True)
        values = node.get("values")
        if values is not None:
            if not isinstance(values, list) or len(values) != len(factors):
                raise self.fail(where, f"values must be a list of {len(factors)} label lists, got {_brief(values)}")
            values = [self.texts(v, where, f"values[{i}]", None) for i, v in enumerate(values)]
        sep = node.get("sep", " & ")
        if not isinstance(sep, str):
            raise self.fail(where, f"sep must be a text, got {_brief(sep)}")
        return Kronecker(factors, names, values, sep)

    def read_VStack(self, node, where, depth):
        blocks = self.children(node, "blocks", where, depth)
        names = self.texts(node.get("names"), where, "names", len(blocks))
        weights = node.get("weights")
        if weights is not None:
            if not isinstance(weights, list) or len(weights) != len(blocks):
                raise self.fail(where, f"weights must be a list of {len(blocks)} numbers, got {_brief(weights)}")
            weights = [self.number({"weight": w}, "weight", where) for w in weights]
        return VStack(blocks, names=names, weights=weights)

    def read_Sum(self, node, where, depth):
        return Sum(self.children(node, "terms", where, depth))

    def read_Weighted(self, node, where, depth):
        weight = self.number(node, "weight", where)
        return Weighted(self.node(self.field(node, "base", where), f"{where}.base", depth + 1), weight)


_NODE_TYPES = frozenset(name[len("read_"):] for name in vars(_Reader) if name.startswith("read_"))


def _own_columns(M: Matrix) -> int:
    """The length of the vectors a node's own column norms take (its children's are counted with them).

    Composite nodes combine their children's vectors (a Kronecker product keeps them factored);
    a block diagonal with a tail writes out its full columns; marginals hold one vector per
    attribute; every other node one entry per column.
    """
    if isinstance(M, (Kronecker, VStack, Sum, Weighted)):
        return 0
    if isinstance(M, BlockDiagonal):
        return M.shape[1] if M.tail else 0
    if isinstance(M, (Marginals, Residuals, ResidualBases)):
        return sum(M.domain.shape)
    return M.shape[1]


def _brief(value) -> str:
    """A short repr of a JSON value for an error message."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def load_strategy(path: str | os.PathLike, *, max_bytes: int = MAX_BYTES) -> tuple[Matrix, dict]:
    """Read a strategy written by :func:`save_strategy`; returns ``(strategy, metadata)``.

    A plan file (:meth:`hdmm.planning.Plan.save`) holds a strategy too, and is read the same way.
    Nothing is unpickled; the file is read only if it fits in ``max_bytes`` (default
    ``MAX_BYTES``, a memory budget: its arrays as loaded, and the vectors that checking its
    matrix needs), and every node and array is checked (:func:`decode_matrix`).

    Raises
    ------
    ValueError
        If the file is not a valid hdmm strategy file, or is larger than ``max_bytes``.
    """
    header, arrays = read_archive(path, max_bytes=max_bytes)
    if "tree" not in header:
        raise ValueError(f"{path} is not a valid hdmm strategy file (no strategy tree)")
    metadata = header.get("metadata", {})
    if not isinstance(metadata, dict):
        raise ValueError(f"{path} is not a valid hdmm strategy file (its metadata is not a JSON object)")
    return decode_matrix(header["tree"], arrays, source=str(path), max_bytes=max_bytes), metadata
