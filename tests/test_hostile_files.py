"""Crafted strategy, plan and release files: each is refused with one clear ValueError, before any noise."""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from strategies import matrices

import hdmm
from hdmm.io import MAX_BYTES, MAX_DEPTH, encode_matrix, load_strategy, save_strategy, write_archive
from hdmm.matrix import Explicit, Identity, Kronecker
from hdmm.optimizers.root import SquareRootStrategy
from hdmm.planning import Plan
from hdmm.spectral import Spectrum
from hdmm.workload import Prefix
from hdmm.release import Release


def _header_and_arrays(M):
    arrays: dict[str, np.ndarray] = {}
    return {"format": "hdmm-strategy", "version": 2, "tree": encode_matrix(M, arrays), "metadata": {}}, arrays


def _write(path, header, arrays):
    write_archive(path, header, arrays)
    return path


def _refused(path, match):
    with pytest.raises(ValueError, match=match) as info:
        load_strategy(path)
    return str(info.value)


def _sparse():
    return Explicit(sp.csr_array(np.array([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]])))


@pytest.mark.parametrize("field, value, match", [
    ("indices", np.array([0, 1, 7]), "column index 7 is outside"),
    ("indices", np.array([0, -1, 2]), "column index -1 is outside"),
    ("indptr", np.array([0, 3, 2]), "without decreasing"),
    ("indptr", np.array([0, 2]), "indptr has 2 entries"),
    ("indptr", np.array([0, 2, 9]), "without decreasing"),
    ("indices", np.array([0.0, 2.0, 1.0]), "expected integers"),
    ("data", np.array([1.0, np.nan, 3.0]), "NaN or infinite"),
    ("data", np.array([1.0, np.inf, 3.0]), "NaN or infinite"),
    ("data", np.array([[1.0, 2.0, 3.0]]), "expected a 1-D array"),
    ("indices", np.array([0, 2]), "2 column indices for 3 entries"),
])
def test_a_sparse_strategy_with_bad_structure_is_refused_at_load(tmp_path, field, value, match):
    header, arrays = _header_and_arrays(_sparse())
    arrays[header["tree"][field]] = value
    message = _refused(_write(tmp_path / "s.npz", header, arrays), match)
    assert "SparseExplicit" in message and "save it again with hdmm" in message


def test_a_sparse_strategy_with_indices_beyond_its_shape_is_refused_by_the_cli(tmp_path, capsys):
    from cli_files import write_workload_and_records

    from hdmm.cli import main

    _, workload, data = write_workload_and_records(
        tmp_path, {"domain": {"age": 8, "sex": ["female", "male"]}, "queries": [{"age": "prefix"}]}, 50)
    header, arrays = _header_and_arrays(Explicit(sp.csr_array(np.eye(16))))
    arrays[header["tree"]["indices"]][-1] = 10**6
    path = _write(tmp_path / "s.npz", header, arrays)
    assert main(["release", "--workload", workload, "--data", data, "--epsilon", "1", "--strategy", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("hdmm: error: ") and "column index 1,000,000 is outside the matrix's 16 columns" in err[-1]


def test_repeated_sparse_entries_are_summed_so_the_sensitivity_sees_them(tmp_path):
    # two entries of 1 at (0, 0) are one entry of 2: L2 column norm 2, not sqrt(2)
    A = Explicit(sp.csr_array(np.eye(2)))
    header, arrays = _header_and_arrays(A)
    tree = header["tree"]
    arrays[tree["data"]] = np.array([1.0, 1.0, 1.0])
    arrays[tree["indices"]] = np.array([0, 0, 1])
    arrays[tree["indptr"]] = np.array([0, 2, 3])
    loaded, _ = load_strategy(_write(tmp_path / "s.npz", header, arrays))
    assert loaded.sensitivity(2) == pytest.approx(2.0)


@pytest.mark.parametrize("node, match", [
    ({"type": "Identity", "n": -3}, "n must be a whole number"),
    ({"type": "Identity", "n": "4"}, "n must be a whole number"),
    ({"type": "Identity", "n": 2.5}, "n must be a whole number"),
    ({"type": "Identity"}, "needs 'n'"),
    ({"type": "Ones", "shape": [2]}, "shape must be"),
    ({"type": "Ones", "shape": [2, -1]}, "n must be a whole number"),
    ({"type": "Prefix", "n": 0}, "n must be a whole number"),
    ({"type": "AllRange", "n": 2**60}, "n must be a whole number"),
    ({"type": "Diagonal", "d": "missing"}, "does not hold"),
    ({"type": "Diagonal", "d": 3}, "does not hold"),
    ({"type": "Ranges", "n": 4, "lo": "lo", "hi": "hi9"}, "does not hold"),
    ({"type": "PIdentity", "T": "T", "norm": 3}, "norm must be 1 or 2"),
    ({"type": "SquareRoot", "values": "v", "theta": 0.0, "sine": "prefix", "n": 5}, "eigenvalues for a sine"),
    ({"type": "Explicit", "matrix": "m", "labels": [1, 2]}, "labels must be a list"),
    ({"type": "BlockDiagonal", "copies": 0, "tail": 0, "block": {"type": "Identity", "n": 2}}, "copies"),
    ({"type": "BlockDiagonal", "copies": 2, "tail": -1, "block": {"type": "Identity", "n": 2}}, "tail"),
    ({"type": "Kronecker", "factors": []}, "non-empty list"),
    ({"type": "Kronecker", "factors": [{"type": "Identity", "n": 2}], "values": [[1, 2]]}, "values"),
    ({"type": "Kronecker", "factors": [{"type": "Identity", "n": 2}], "values": [["a"], ["b"]]}, "values"),
    ({"type": "VStack", "blocks": [{"type": "Identity", "n": 2}], "weights": [float("nan")]}, "finite"),
    ({"type": "VStack", "blocks": [{"type": "Identity", "n": 2}, {"type": "Identity", "n": 3}]}, "columns"),
    ({"type": "Sum", "terms": "Identity"}, "non-empty list"),
    ({"type": "Weighted", "weight": float("inf"), "base": {"type": "Identity", "n": 2}}, "finite number"),
    ({"type": "Weighted", "weight": 2.0, "base": [1]}, "must be a JSON object"),
    ({"type": "Marginals", "domain": {"a": 2}, "members": "mm", "weights": "w"}, "0/1"),
    ({"n": 3}, "unknown matrix type None"),
    ({"type": "__class__"}, "unknown matrix type"),
    ("Identity", "must be a JSON object"),
    (7, "must be a JSON object"),
])
def test_a_malformed_node_is_one_clear_value_error(tmp_path, node, match):
    arrays = {"v": np.ones(4), "T": np.ones((1, 3)), "m": np.eye(3), "lo": np.array([0]),
              "mm": np.array([[2]]), "w": np.ones(1)}
    header = {"format": "hdmm-strategy", "version": 2, "tree": node, "metadata": {}}
    message = _refused(_write(tmp_path / "s.npz", header, arrays), match)
    assert message.count("\n") == 0 and "is not a valid hdmm strategy file" in message


def test_nesting_deeper_than_the_cap_is_refused_without_recursion_error(tmp_path):
    tree = '{"type": "Weighted", "weight": 1.0, "base": ' * 3000 + '{"type": "Identity", "n": 2}' + "}" * 3000
    text = '{"format": "hdmm-strategy", "version": 2, "tree": ' + tree + "}"
    _refused(_raw_archive(tmp_path / "s.npz", {"header.npy": _npy(np.array(text))}), "nested too deeply")
    tree = '{"type": "Weighted", "weight": 1.0, "base": ' * 100 + '{"type": "Identity", "n": 2}' + "}" * 100
    text = '{"format": "hdmm-strategy", "version": 2, "tree": ' + tree + "}"
    _refused(_raw_archive(tmp_path / "h.npz", {"header.npy": _npy(np.array(text))}), f"more than {MAX_DEPTH} levels")
    shallow: dict = {"type": "Identity", "n": 2}
    for _ in range(MAX_DEPTH):
        shallow = {"type": "Weighted", "weight": 1.0, "base": shallow}
    loaded, _ = load_strategy(_write(tmp_path / "ok.npz", {"format": "hdmm-strategy", "version": 2,
                                                            "tree": shallow}, {}))
    assert loaded.shape == (2, 2)


@pytest.mark.parametrize("header, match", [
    ({"format": "hdmm-strategy", "version": "2", "tree": {"type": "Identity", "n": 2}}, "not a whole number"),
    (5, "format None"),
    ([1, 2], "format None"),
    ({"format": "hdmm-strategy", "version": 2}, "no strategy tree"),
    ({"format": "hdmm-strategy", "version": 2, "tree": {"type": "Identity", "n": 2}, "metadata": 3}, "metadata"),
])
def test_malformed_headers_are_one_clear_value_error(tmp_path, header, match):
    _refused(_write(tmp_path / "s.npz", header, {}), match)


def _raw_archive(path, members: dict[str, bytes], compression=zipfile.ZIP_DEFLATED):
    with zipfile.ZipFile(path, "w", compression=compression) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def _npy(array) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _header_npy(header) -> bytes:
    return _npy(np.array(json.dumps(header)))


def test_a_header_that_is_not_json_or_not_text_is_refused(tmp_path):
    _refused(_raw_archive(tmp_path / "a.npz", {"header.npy": _npy(np.array("{not json"))}), "not valid JSON")
    _refused(_raw_archive(tmp_path / "b.npz", {"header.npy": _npy(np.arange(3))}), "not a JSON text")
    deep = "[" * 100_000 + "]" * 100_000
    _refused(_raw_archive(tmp_path / "c.npz", {"header.npy": _npy(np.array(deep))}), "nested too deeply")
    _refused(_raw_archive(tmp_path / "d.npz", {"other.npy": _npy(np.arange(3))}), "no header")
    _refused(_raw_archive(tmp_path / "e.npz", {"header.txt": b"x"}), "unexpected member")


def _declared(shape, dtype="<f8") -> bytes:
    """A ``.npy`` header declaring ``shape`` (no data after it)."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def test_an_array_header_declaring_terabytes_is_refused_unread(tmp_path):
    tree = {"type": "Diagonal", "d": "a0"}
    path = _raw_archive(tmp_path / "tb.npz", {"header.npy": _header_npy(
        {"format": "hdmm-strategy", "version": 2, "tree": tree}), "a0.npy": _declared((10**12,)) + bytes(64)})
    message = _refused(path, "declares 8,000,000,000,000 bytes")
    assert "max_bytes" in message


def test_a_zip_bomb_is_refused_from_the_zip_directory(tmp_path):
    # 128 MiB of zeros, about 128 KB on disk: refused from the zip directory, before any of it is inflated
    tree = {"type": "Diagonal", "d": "a0"}
    path = tmp_path / "bomb.npz"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        z.writestr("header.npy", _header_npy({"format": "hdmm-strategy", "version": 2, "tree": tree}))
        with z.open("a0.npy", "w", force_zip64=True) as member:
            member.write(_declared((2**24,)))
            chunk = bytes(2**24)
            for _ in range(8):
                member.write(chunk)
    assert path.stat().st_size < 4 * 2**20
    message = _refused_with(path, 2**26, "holds 134,21")
    assert "refused unread" in message and "max_bytes" in message
    with pytest.raises(ValueError, match="max_bytes must be a positive integer"):
        load_strategy(path, max_bytes=-1)


def test_an_archive_directory_declaring_more_than_the_default_cap_is_refused(tmp_path):
    # the zip directory claims 3 GiB for a small member: refused by the default cap, nothing inflated
    tree = {"type": "Diagonal", "d": "a0"}
    path = _raw_archive(tmp_path / "claim.npz", {"header.npy": _header_npy(
        {"format": "hdmm-strategy", "version": 2, "tree": tree}), "a0.npy": _npy(np.ones(3))})
    raw = bytearray(path.read_bytes())
    central = raw.rfind(b"PK\x01\x02")  # the last member's central directory entry
    raw[central + 24:central + 28] = (3 * 2**30).to_bytes(4, "little")  # its uncompressed size
    path.write_bytes(bytes(raw))
    _refused(path, f"more than the limit of {MAX_BYTES:,}")


def _refused_with(path, max_bytes, match):
    with pytest.raises(ValueError, match=match) as info:
        load_strategy(path, max_bytes=max_bytes)
    return str(info.value)


def test_an_object_array_is_refused(tmp_path):
    buffer = io.BytesIO()
    np.save(buffer, np.array([None, 1], dtype=object), allow_pickle=True)
    path = _raw_archive(tmp_path / "o.npz", {"header.npy": _header_npy(
        {"format": "hdmm-strategy", "version": 2, "tree": {"type": "Diagonal", "d": "a0"}}),
        "a0.npy": buffer.getvalue()})
    _refused(path, "no objects")


def test_a_truncated_array_is_refused(tmp_path):
    npy = _npy(np.ones(16))[:-40]
    path = _raw_archive(tmp_path / "t.npz", {"header.npy": _header_npy(
        {"format": "hdmm-strategy", "version": 2, "tree": {"type": "Diagonal", "d": "a0"}}), "a0.npy": npy})
    _refused(path, r"is truncated \(88 of 128 bytes\)")


def _square_root(tmp_path, edit):
    rng = np.random.default_rng(0)
    Q, _ = np.linalg.qr(rng.normal(size=(5, 5)))
    A = SquareRootStrategy(Spectrum(hdmm.spectral.DenseBasis(Q), np.arange(1.0, 6.0)))
    header, arrays = _header_and_arrays(A)
    edit(header["tree"], arrays)
    return _write(tmp_path / "root.npz", header, arrays)


def test_a_square_root_strategy_with_nan_or_zero_rows_is_refused(tmp_path):
    def nan_row(tree, arrays):
        arrays[tree["Q"]][2] = np.nan

    def zero_row(tree, arrays):
        arrays[tree["Q"]][2] = 0.0

    def nan_value(tree, arrays):
        arrays[tree["values"]][1] = np.nan

    def zero_values(tree, arrays):
        arrays[tree["values"]][:] = 0.0

    _refused(_square_root(tmp_path, nan_row), "NaN or infinite")
    _refused(_square_root(tmp_path, zero_row), "row 2 has norm 0")
    _refused(_square_root(tmp_path, nan_value), "NaN or infinite")
    _refused(_square_root(tmp_path, zero_values), "non-zero")
    loaded, _ = load_strategy(_square_root(tmp_path, lambda tree, arrays: None))
    assert loaded.sensitivity(2) == pytest.approx(1.0)


def _plan_file(tmp_path, edit):
    W = Kronecker([Prefix(4), Identity(3)])
    p = hdmm.plan(W, Identity(12), hdmm.PureDP(1.0))
    path = tmp_path / "plan.npz"
    p.save(path)
    with np.load(path, allow_pickle=False) as archive:
        arrays = {k: archive[k] for k in archive.files if k != "header"}
        header = json.loads(str(archive["header"]))
    edit(header)
    return _write(path, header, arrays)


@pytest.mark.parametrize("privacy", [
    "pure", {"type": "PureDP", "epsilon": "one"}, {"type": "PureDP", "epsilon": -1.0}, {"type": "Unknown"},
    {"type": "ApproxDP", "epsilon": 1.0}, None, [1],
])
def test_bad_privacy_metadata_in_a_plan_file_is_one_clear_value_error(tmp_path, privacy):
    def edit(header):
        header["plan"]["privacy"] = privacy

    with pytest.raises(ValueError, match="is not a valid hdmm plan file"):
        Plan.load(_plan_file(tmp_path, edit))


@pytest.mark.parametrize("edit", [
    lambda h: h.pop("plan"), lambda h: h.__setitem__("plan", 3), lambda h: h["plan"].__setitem__("sensitivity", "x"),
    lambda h: h.__setitem__("tree", {"type": "Identity", "n": "12"}),
])
def test_malformed_plan_headers_are_one_clear_value_error(tmp_path, edit):
    with pytest.raises(ValueError, match="is not a valid hdmm (plan|strategy) file"):
        Plan.load(_plan_file(tmp_path, edit))


def test_a_saved_strategy_with_a_different_type_hidden_in_its_arrays_is_refused(tmp_path):
    path = tmp_path / "ok.npz"
    save_strategy(Identity(3), path)
    assert load_strategy(path)[0].shape == (3, 3)
    header, arrays = _header_and_arrays(Explicit(np.eye(3)))
    arrays[header["tree"]["matrix"]] = np.array(["a", "b", "c"])
    _refused(_write(tmp_path / "s.npz", header, arrays), "expected numbers")


def test_a_plan_file_with_a_crafted_strategy_names_the_file_and_the_node_once(tmp_path):
    def edit(header):
        header["tree"] = {"type": "Kronecker", "factors": [{"type": "Prefix", "n": 4}, {"type": "Identity"}]}

    path = _plan_file(tmp_path, edit)
    with pytest.raises(ValueError) as info:
        Plan.load(path)
    message = str(info.value)
    assert message.count("is not a valid") == 1 and message.startswith(str(path))
    assert "tree (Kronecker).factors[1] (Identity): a Identity node needs 'n'" in message


def test_plan_and_release_files_take_the_size_limit(tmp_path):
    W = Kronecker([Prefix(4), Identity(3)])
    release = hdmm.run(W, np.arange(12.0), hdmm.PureDP(1.0), strategy=Identity(12), rng=0)
    release.save(tmp_path / "r.npz")
    release.plan.save(tmp_path / "p.npz")
    assert Release.load(tmp_path / "r.npz").answers == pytest.approx(release.answers)
    for load, name in ((Release.load, "r.npz"), (Plan.load, "p.npz")):
        with pytest.raises(ValueError, match="raise the limit"):
            load(tmp_path / name, max_bytes=100)


def test_a_release_file_with_nan_answers_is_refused(tmp_path):
    release = hdmm.run(Prefix(6), np.arange(6.0), hdmm.PureDP(1.0), strategy=Identity(6), rng=0)
    path = tmp_path / "r.npz"
    release.save(path)
    with np.load(path, allow_pickle=False) as archive:
        arrays = {k: archive[k] for k in archive.files if k != "header"}
        header = json.loads(str(archive["header"]))
    arrays["answers"][2] = np.nan
    _write(path, header, arrays)
    with pytest.raises(ValueError, match="answers holds NaN or infinite values"):
        Release.load(path)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pair=matrices())
def test_every_saveable_matrix_passes_the_checks_and_round_trips(tmp_path, pair):
    buffer = io.BytesIO()
    try:
        save_strategy(pair.mat, buffer)
    except TypeError:  # not one of the classes a file can hold
        return
    buffer.seek(0)
    loaded, _ = load_strategy(buffer)
    assert loaded.shape == pair.ref.shape
    assert np.allclose(loaded.dense(), pair.ref, atol=1e-9)


# ---------------------------------------------------------------- memory budget (issue 22 item 6)
def _diagonal_archive(path, npy: bytes, compression=zipfile.ZIP_STORED):
    header = _header_npy({"format": "hdmm-strategy", "version": 2, "tree": {"type": "Diagonal", "d": "a0"}})
    return _raw_archive(path, {"header.npy": header, "a0.npy": npy}, compression)


def test_a_member_declaring_more_than_the_memory_budget_is_refused_before_anything_is_allocated(tmp_path):
    # the audit's (28,000,000, 8) float64 member: 1.8 GB declared by a header of 128 bytes
    import tracemalloc

    path = _diagonal_archive(tmp_path / "big.npz", _declared((28_000_000, 8)) + bytes(64))
    tracemalloc.start()
    try:
        message = _refused(path, "more than the limit of")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20
    assert str(path) in message and "array 'a0'" in message and "declares 1,792,000,000 bytes" in message
    assert f"limit of {MAX_BYTES:,}" in message and "max_bytes" in message


def test_the_budget_counts_the_float64_copy_of_a_narrower_array(tmp_path):
    # 1,000 float32 are 4,000 bytes in the file and 12,000 in memory once converted for the checks
    path = _diagonal_archive(tmp_path / "f32.npz", _npy(np.ones(1000, dtype=np.float32)))
    message = _refused_with(path, 10_000, r"would take 12,\d{3} bytes of memory")
    assert "array 'a0'" in message and "max_bytes" in message
    assert load_strategy(path, max_bytes=64_000)[0].shape == (1000, 1000)


def test_loading_an_array_peaks_at_its_own_size(tmp_path):
    # 8 MB of zeros, a few KB compressed: reading it in one call held it twice, and the checks copied it again
    import tracemalloc

    path = _diagonal_archive(tmp_path / "zeros.npz", _npy(np.zeros(10**6)), zipfile.ZIP_DEFLATED)
    assert path.stat().st_size < 64 * 1024
    tracemalloc.start()
    try:
        loaded, _ = load_strategy(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert loaded.shape == (10**6, 10**6)
    assert peak < 1.3 * 8 * 10**6


@pytest.mark.parametrize("shape", [(-2, -3), (-1,), (3, -1)])
def test_a_negative_shape_in_an_array_header_names_the_file_and_the_member(tmp_path, shape):
    path = _diagonal_archive(tmp_path / "neg.npz", _declared(shape) + bytes(64))
    message = _refused(path, "invalid .npy header")
    assert str(path) in message and "array 'a0'" in message and str(shape) in message


_HUGE = 2**40


@pytest.mark.parametrize("node", [
    {"type": "Identity", "n": _HUGE},
    {"type": "Weighted", "weight": 0.0, "base": {"type": "Identity", "n": _HUGE}},
    {"type": "Ones", "shape": [1, _HUGE]},
    {"type": "Prefix", "n": 2**28},
    {"type": "SparseExplicit", "shape": [1, _HUGE], "data": "d", "indices": "i", "indptr": "p"},
    {"type": "BlockDiagonal", "copies": _HUGE, "tail": 1, "block": {"type": "Identity", "n": 1}},
    {"type": "VStack", "blocks": [{"type": "Identity", "n": 2**24}] * 40},
    {"type": "Marginals", "domain": {"a": _HUGE, "b": 2}, "members": "m", "weights": "w"},
    {"type": "Residuals", "domain": {"a": _HUGE, "b": 2}, "members": "m", "weights": "w"},
])
def test_an_implicit_node_over_a_huge_domain_is_refused_by_the_memory_budget(tmp_path, node):
    arrays = {"d": np.ones(1), "i": np.zeros(1, dtype=np.int64), "p": np.array([0, 1]), "m": np.array([[1, 0], [1, 1]]),
              "w": np.ones(2)}
    path = _write(tmp_path / "s.npz", {"format": "hdmm-strategy", "version": 2, "tree": node}, arrays)
    message = _refused(path, "more than the limit of")
    assert str(path) in message and "columns" in message and "max_bytes" in message


def test_a_kronecker_product_over_a_huge_domain_counts_its_factors_only(tmp_path):
    path = tmp_path / "k.npz"
    save_strategy(Kronecker([Identity(2**10), Prefix(2**10), Identity(2**10), Identity(2**10)]), path)
    assert load_strategy(path)[0].shape == (_HUGE, _HUGE)
    save_strategy(Identity(2**26), path)
    _refused(path, "2,147,483,648 bytes of memory")
    assert load_strategy(path, max_bytes=2**32)[0].shape == (2**26, 2**26)


def _patched_plan(tmp_path, p, n0, n, name="plan.npz"):
    """``p`` saved, then its domain of ``n0`` cells declared as ``n`` (fingerprint and checksum dropped)."""
    def patch(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "n" and value == n0:
                    node[key] = n
                elif key == "shape":
                    node[key] = [n if size == n0 else size for size in value]
                else:
                    patch(value)
        elif isinstance(node, list):
            for value in node:
                patch(value)

    path = tmp_path / name
    p.save(path)
    with np.load(path, allow_pickle=False) as archive:
        arrays = {k: archive[k] for k in archive.files if k != "header"}
        header = json.loads(str(archive["header"]))
    patch(header["tree"])
    patch(header["workload"])
    header["plan"].pop("fingerprint")
    header.pop("checksum")
    return _write(path, header, arrays)


@pytest.mark.parametrize("n", [2**28, _HUGE])
@pytest.mark.parametrize("kind", ["sparse", "weighted", "zero"])
def test_a_plan_over_a_huge_declared_domain_is_one_clear_value_error(tmp_path, n, kind):
    # the audit's plan headers: a MemoryError at 2**40, 4.5 GB and minutes at 2**28; now refused before any is made
    from hdmm.matrix import Weighted
    from hdmm.planning import strategy_plan

    n0 = 16
    if kind == "sparse":
        S = Explicit(sp.csr_array(([1.0], ([0], [0])), shape=(1, n0)))
        p = hdmm.plan(S, S, hdmm.PureDP(1.0))
    else:
        p = strategy_plan(Weighted(Identity(n0), 0.5 if kind == "weighted" else 0.0), hdmm.PureDP(1.0))
    path = _patched_plan(tmp_path, p, n0, n)
    with pytest.raises(ValueError, match="more than the limit of") as info:
        Plan.load(path)
    assert str(path) in str(info.value) and "max_bytes" in str(info.value)


def test_a_release_over_a_huge_declared_domain_is_one_clear_value_error(tmp_path):
    release = hdmm.run(Prefix(16), np.arange(16.0), hdmm.PureDP(1.0), strategy=Identity(16), rng=0)
    path = tmp_path / "r.npz"
    release.save(path)
    with np.load(path, allow_pickle=False) as archive:
        arrays = {k: archive[k] for k in archive.files if k != "header"}
        header = json.loads(str(archive["header"]))
    header["tree"] = {"type": "Weighted", "weight": 1.0, "base": {"type": "Identity", "n": _HUGE}}
    _write(path, header, arrays)
    with pytest.raises(ValueError, match="more than the limit of") as info:
        Release.load(path)
    assert str(path) in str(info.value)
