"""The ``hdmm`` command line: private releases, strategy optimization and error reports.

::

    hdmm release  --workload sf1 --epsilon 1                 # built-in synthetic SF1 data
    hdmm release  --workload spec.json --data people.csv --rho 0.5 --output release.parquet
    hdmm optimize --workload sf1 --epsilon 1 --output sf1.npz  # optimise once ...
    hdmm release  --workload sf1 --epsilon 1 --strategy sf1.npz  # ... release many times
    hdmm error    --workload sf1 --epsilon 1 --strategy sf1.npz --plot error.png
    hdmm budget create budget.json --epsilon 3                 # a privacy budget across releases ...
    hdmm release  --workload sf1 --epsilon 1 --budget budget.json --output r.csv  # ... charged before measuring
    hdmm budget show budget.json
    hdmm demo                                                  # SF1 size, Identity error, bound
    hdmm --version

``--workload`` is a name (:data:`hdmm.catalog.WORKLOADS`) or a JSON workload file
(:mod:`hdmm.catalog`). Privacy is ``--epsilon`` (pure DP), ``--epsilon`` with ``--delta``
(approximate DP, Gaussian noise) or ``--rho`` (zCDP). Bad input prints one line starting
``hdmm: error:`` and exits with status 2.

Every input and output is checked before the data is measured, so a mistake never spends
the privacy budget on a release that is then lost: the privacy parameters, the output file
(suffix, directory, writable, ``pyarrow`` for Parquet, not an existing release unless
``--overwrite``), ``matplotlib`` for ``--plot``, the strategy name or file, and the data
(non-empty, every column readable). A release file records its provenance -- the privacy
parameters, the strategy's origin, the hdmm version, the workload and the data source --
in the Parquet file's key-value metadata (key ``hdmm``) or, for CSV, in a JSON file next to
it (``<output>.json``). The workload is recorded by name and by fingerprint
(:func:`hdmm.io.workload_fingerprint`: its queries and weights, and with the domain's attributes and
labels), so a file says which queries it answers even if the workload file changes; a Gaussian
release records the zCDP rho its noise is calibrated to (``calibrated_rho``). Ratios of errors
are ratios of RMSEs (root mean squared error per query), as labelled.

``--budget FILE`` charges the release to a privacy budget file (:class:`hdmm.Budget`, made by
``hdmm budget create FILE --epsilon E`` or ``--rho R``, or ``--epsilon E --delta D`` for a zCDP
budget that implies (E, D)-DP). The file is read and the charge checked before anything else,
so an exhausted budget refuses the release before the data is read; the charge is written to
the file (appended, fsync'd) after the data is checked and before any noise is drawn, so a release
that fails after that point still counts; once the release is written the charge is marked
``released`` with the output's name. The provenance records the charge and the budget after it.
``--budget`` needs ``--output``: a preview shows 10 rows, and the budget would pay for all of them.

An output that appears while the release runs (another process writing the same name) is never
replaced: the release is written next to it, as ``<name>.<pid>-1.csv``, and the command says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import json
import math
import os
import re
import sys
import time
from fractions import Fraction
from typing import Any, Sequence

import numpy as np
import pandas as pd
from tqdm import tqdm

from .bound import svd_bound
from .budget import Budget, settle_quietly
from .validation import is_finite_real
from .error import per_query_variance
from .catalog import NamedWorkload, load_workload, named_workload
from .cli_geography import add_geography_options, check_geography_options, geography_release
from .cli_inputs import UsageError, read_records
from .cli_inputs import need_pyarrow as _need_pyarrow, probe_directory as _probe_directory
from .files import check_new_file, write_atomically
from .io import load_strategy, save_strategy, workload_fingerprint
from .matrix import Identity, Matrix
from .optimizers import optimize
from .optimizers.kron import for_release
from .planning import Plan, plan
from .privacy import ZCDP, ApproxDP, Privacy, PureDP, read_exact
from .version import HDMM_VERSION
from .release import Release, run, table_names

#: Built-in data sets by name (``--data``).
BUILT_IN_DATA = ("synthetic", "adult")

#: Strategy names ``--strategy`` accepts besides a strategy file.
STRATEGY_NAMES = ("auto", "identity")

#: Errors that come from the user's input: printed as one line, exit status 2.
USER_ERRORS = (ValueError, OSError)

#: Largest noise scale per unit of sensitivity (Laplace scale or Gaussian standard deviation)
#: the command accepts: beyond it the answers carry no information and the error arithmetic
#: (squares of the scale times error traces) leaves floating point.
MAX_NOISE_SCALE = 1e100

#: Peak memory per synthetic person while generating and counting them (bytes, measured).
BYTES_PER_PERSON = 48


def hdmm_version() -> str:
    """The version of the hdmm package this command runs from."""
    return HDMM_VERSION


# ---------------------------------------------------------------------------------- inputs
def _rho(text: str) -> float | Fraction:
    """``--rho``: ``"p/q"`` (whole numbers) is an exact Fraction (hdmm.ZCDP keeps it), anything else a float."""
    if "/" in text:
        try:
            return read_exact("rho", text, float(Fraction(text)))
        except (ValueError, ZeroDivisionError):
            raise argparse.ArgumentTypeError(f"not a fraction p/q of whole numbers: {text!r}") from None
    return float(text)


def _privacy(args: argparse.Namespace) -> Privacy:
    """``--epsilon`` -> PureDP, ``--epsilon --delta`` -> ApproxDP, ``--rho`` -> ZCDP, checked to be usable."""
    if args.rho is not None:
        if args.epsilon is not None or args.delta is not None:
            raise UsageError("give either --rho (zCDP) or --epsilon [--delta], not both")
        privacy: Privacy = ZCDP(args.rho)
        given = f"--rho {args.rho}" if isinstance(args.rho, Fraction) else f"--rho {args.rho:g}"
    elif args.epsilon is None:
        raise UsageError("give a privacy budget: --epsilon E (pure DP), --epsilon E --delta D, or --rho R (zCDP)")
    else:
        privacy = PureDP(args.epsilon) if args.delta is None else ApproxDP(args.epsilon, args.delta)
        given = f"--epsilon {args.epsilon:g}" + ("" if args.delta is None else f" --delta {args.delta:g}")
    scale = privacy.noise_scale(1.0)
    if not math.isfinite(scale) or scale > MAX_NOISE_SCALE:
        raise UsageError(f"{given} is too small a budget to compute with: the {privacy.noise.name} noise would have "
                         f"scale {scale:.3g} per unit of sensitivity (the limit is {MAX_NOISE_SCALE:.0e}), drowning "
                         "every answer; give a larger budget")
    return privacy


def _people(text: str) -> int:
    """``--people``: a whole number >= 1, written as ``1000000``, ``1_000_000``, ``1,000,000`` or ``1e6``."""
    plain = text.replace("_", "").replace(",", "").strip()
    try:
        number = float(plain)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of people, e.g. 1000000 or 1e6") from None
    if not math.isfinite(number) or number != math.floor(number) or number < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give a whole number of people >= 1 (a release of no records publishes noise only)")
    return int(plain) if re.fullmatch(r"[0-9]+", plain) else int(number)


def _available_memory() -> int | None:
    """Bytes of memory available now (physical memory where that is all the system tells), or None."""
    for pages in ("SC_AVPHYS_PAGES", "SC_PHYS_PAGES"):
        try:
            return os.sysconf(pages) * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            continue
    return None


def _check_people(people: int) -> None:
    """Refuse a synthetic data size that cannot fit in memory, before drawing it."""
    available = _available_memory()
    if available is not None and people * BYTES_PER_PERSON > available:
        raise UsageError(f"--people {people:,} needs about {people * BYTES_PER_PERSON / 1e9:,.0f} GB of memory for the "
                         f"synthetic records, but {available / 1e9:,.1f} GB are available; use at most "
                         f"{available // BYTES_PER_PERSON:,} people")


def _workload(name: str) -> NamedWorkload:
    """A named workload, or a JSON workload file (then no built-in data is attached)."""
    if name.endswith(".json") or os.path.sep in name:
        W, domain = load_workload(name)
        return NamedWorkload(W, domain, None, f"workload file {name}")
    return named_workload(name)


def _data_source(args: argparse.Namespace, named: NamedWorkload) -> str:
    """The data to release: a file name or a built-in data set, checked to fit the workload."""
    source = args.data or ("synthetic" if named.data and named.data.startswith("synthetic") else named.data)
    if source is None:
        raise UsageError("this workload has no built-in data: give --data FILE.csv or FILE.parquet")
    if source == "synthetic":
        if not (named.data or "").startswith("synthetic"):
            raise UsageError("--data synthetic is synthetic Census persons; it fits the census workloads only")
        _check_people(args.people)
    elif source == "adult":
        if named.data != "adult":
            raise UsageError("--data adult fits the adult workload (or a workload file over Adult attributes)")
    elif not source.endswith((".csv", ".parquet")):
        raise UsageError(f"--data {source}: expected a .csv or .parquet file of records, or one of "
                         f"{', '.join(BUILT_IN_DATA)}")
    elif source.endswith(".parquet"):
        _need_pyarrow("reading", "--data")
    return source


def _read_records(path: str, named: NamedWorkload, labels: bool) -> pd.DataFrame:
    """The records of a CSV or Parquet file; with ``labels``, labelled attributes' columns as text."""
    return read_records(path, [name for name in named.domain.names if named.domain.has_labels(name)] if labels else [])


def _records(args: argparse.Namespace, named: NamedWorkload, source: str) -> tuple[pd.DataFrame, bool]:
    """The records to release and whether they are built-in (so their true answers may be shown)."""
    if source == "synthetic":
        from census_workloads import synthetic_persons

        people = synthetic_persons(args.people, seed=args.data_seed, states=named.data.endswith("states"))
        return named.built_in_records(people), True
    if source == "adult":
        from .datasets import load_adult

        return load_adult()[0], True
    return _read_records(source, named, args.labels), False


def _strategy_file(spec: str) -> None:
    """Check that ``--strategy`` is a known name or an existing file."""
    if spec in STRATEGY_NAMES or os.path.isfile(spec):
        return
    if spec == "production":
        raise UsageError("--strategy production is the 2020 Census's mechanism for a geography release: add "
                         "--geography (e.g. state,county) with --workload pl94-2020")
    what = "is a directory" if os.path.isdir(spec) else "is neither a strategy name nor an existing file"
    raise UsageError(f"--strategy {spec}: {what}; use auto (optimise now), identity (measure every cell) or a "
                     "strategy file written by 'hdmm optimize' (.npz)")


def _loaded_strategy(spec: str, named: NamedWorkload, privacy: Privacy) -> tuple[Matrix, str, dict[str, Any]]:
    """A strategy file's matrix, its origin for people, and its provenance for release files."""
    A, metadata = load_strategy(spec)
    N = named.domain.size
    if A.shape[1] != N:
        raise UsageError(f"the strategy in {spec} has {A.shape[1]:,} columns but the workload's domain has {N:,} cells; "
                         "optimise one for this workload with 'hdmm optimize'")
    saved = metadata.get("privacy", {}).get("type")
    if saved and Privacy.from_dict(metadata["privacy"]).noise != privacy.noise:
        print(f"hdmm: note: {spec} was optimised for {metadata['privacy']['type']} ({Privacy.from_dict(metadata['privacy']).noise.name} "
              f"noise); it is still private under {privacy.description}, but not tuned for it", file=sys.stderr)
    recorded = metadata.get("workload_fingerprint_with_domain")
    if recorded and recorded != workload_fingerprint(named.workload, named.domain):
        print(f"hdmm: note: {spec} was optimised for another workload or domain ({metadata.get('workload')!r}); it is "
              "used only if it supports this workload, and is private, but not tuned for it", file=sys.stderr)
    optimizer = metadata.get("optimizer")
    origin = f"{optimizer} from strategy file {spec}" if optimizer else f"strategy file {spec}"
    with open(spec, "rb") as file:
        digest = hashlib.sha256(file.read()).hexdigest()
    provenance = {"origin": origin, "optimizer": optimizer, "file": os.path.abspath(spec), "sha256": digest,
                  "optimized_for": metadata.get("privacy"), "workload": metadata.get("workload"),
                  "workload_fingerprint": metadata.get("workload_fingerprint")}
    return A, origin, provenance


def _plan(spec: str, named: NamedWorkload, privacy: Privacy, args: argparse.Namespace,
          loaded: tuple[Matrix, str, dict[str, Any]] | None = None) -> tuple[Plan, dict[str, Any]]:
    """The release plan for ``--strategy`` and its provenance for release files.

    ``identity``; ``auto`` (optimise now, with a progress bar); or a strategy file (already
    ``loaded`` by :func:`_loaded_strategy`). The plan's origin names who chose the strategy.
    """
    W = named.workload
    if spec == "identity":
        return plan(W, Identity(named.domain.size), privacy, origin="identity"), {"origin": "identity"}
    if spec == "auto":
        with for_release():  # only strategies a release can measure exactly (hdmm.exact)
            result = optimize(W, privacy, seed=args.seed, restarts=args.restarts, progress=True,
                              time_limit=args.time_limit)
        origin = f"{result.optimizer} (hdmm.optimize, this run)"
        return plan(W, result, privacy, origin=origin), {"origin": origin, "optimizer": result.optimizer,
                                                          "optimizer_seed": args.seed}
    A, origin, provenance = loaded if loaded is not None else _loaded_strategy(spec, named, privacy)
    return plan(W, A, privacy, origin=origin), provenance


def _per_table_rmse(W: Matrix, variance: np.ndarray) -> pd.DataFrame:
    """RMSE per table of the workload (its named parts; the whole workload as one table otherwise)."""
    tables = table_names(W)
    frame = pd.DataFrame({"table": "workload" if tables is None else tables, "variance": variance})
    grouped = frame.groupby("table", sort=False)["variance"]
    return pd.DataFrame({"queries": grouped.size(), "rmse": np.sqrt(grouped.mean())}).reset_index()


def _check_output(path: str, option: str, suffixes: Sequence[str], overwrite: bool | None = None) -> None:
    """Check an output file before any work: its suffix, its directory, that it can be written.

    ``overwrite`` None: an existing file is replaced; False: an existing file is refused (a release
    in it would be lost, and its budget with it).
    """
    if not path.lower().endswith(tuple(suffixes)):
        raise UsageError(f"{option} {path}: use a {' or '.join(suffixes)} file name")
    if overwrite is False and os.path.isfile(path):
        raise UsageError(f"{option} {path} exists; a release in it would be lost, so pass --overwrite to "
                         "replace it or choose another name")
    problem = check_new_file(path)
    if problem is not None:
        raise UsageError(f"{option} {problem}")


def _check_release_output(path: str, overwrite: bool) -> None:
    """``release --output``: .csv (with a ``.json`` provenance file) or .parquet (needs pyarrow)."""
    _check_output(path, "--output", (".csv", ".parquet"), overwrite)
    if path.lower().endswith(".parquet"):
        _need_pyarrow("writing", "--output")
    else:
        _check_output(path + ".json", "--output (its provenance file)", (".json",), overwrite)


def _check_plot(path: str) -> None:
    """``error --plot``: matplotlib importable, a file type it writes, a writable place."""
    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'hdmm[plot]' (or leave out --plot)") from None
    del matplotlib
    kinds = sorted(FigureCanvasAgg.get_supported_filetypes())
    _check_output(path, "--plot", tuple(f".{kind}" for kind in kinds))


def _alternative(path: str, i: int) -> str:
    """``release.csv`` -> ``release.<pid>-<i>.csv``: where a release goes if its name was taken meanwhile."""
    root, ext = os.path.splitext(path)
    return f"{root}.{os.getpid()}-{i}{ext}"


def _write(table: pd.DataFrame, path: str, provenance: dict[str, Any], overwrite: bool = True) -> list[str]:
    """Write the release table with its provenance; returns the files written.

    Without ``overwrite`` an existing file is never replaced: if ``path`` (or its provenance file)
    appeared while the release ran, the release is written under another name
    (:func:`_alternative`) rather than lost, since its privacy is already spent.
    """
    targets = [path] if overwrite else [path] + [_alternative(path, i) for i in range(1, 100)]

    def text(target: str) -> str:  # the charge records where the release was written
        charge = provenance.get("charge")
        recorded = provenance if not charge or "output" not in charge else {
            **provenance, "charge": {**charge, "output": os.path.abspath(target)}}
        return json.dumps(recorded, indent=2, default=_json_default)

    if path.lower().endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        arrow = pa.Table.from_pandas(table, preserve_index=False)
        for target in targets:
            tagged = arrow.replace_schema_metadata({**(arrow.schema.metadata or {}), b"hdmm": text(target).encode()})
            if write_atomically(target, lambda temporary: pq.write_table(tagged, temporary), replace=overwrite):
                return [target]
        raise OSError(f"could not find a free name next to {path} for the release")

    for target in targets:
        def write_json(temporary: str, recorded: str = text(target)) -> None:
            with open(temporary, "w", encoding="utf-8") as file:
                file.write(recorded + "\n")

        if not write_atomically(target + ".json", write_json, replace=overwrite):  # first: never a table without it
            continue
        if write_atomically(target, lambda temporary: table.to_csv(temporary, index=False), replace=overwrite):
            return [target, target + ".json"]
        os.remove(target + ".json")
    raise OSError(f"could not find a free name next to {path} for the release")


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot record {type(value).__name__} in provenance")


def _provenance(args: argparse.Namespace, named: NamedWorkload, source: str, records: int | None, result: Release,
                strategy: dict[str, Any], level: float, budget: Budget | None = None) -> dict[str, Any]:
    """What a release file records: the release's own provenance, and how the command made it."""
    base = result.provenance()
    if budget is not None and base["charge"] is not None:
        base["charge"] = {**base["charge"], "output": os.path.abspath(args.output)}
        base["budget"] = {"file": budget.path, "total": budget.total.to_dict(), "spent": budget.spent,
                          "remaining": budget.remaining, "unit": budget.unit}
    return {
        "format": "hdmm-release-provenance",
        "version": 1,
        **base,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "noise": result.privacy.noise.name,
        "noise_seed": args.noise_seed,
        "strategy": {**strategy, "matrix": base["strategy"]},
        "workload": {"name": args.workload, "description": named.description,
                     "queries": int(named.workload.shape[0]), "cells": int(named.domain.size),
                     "fingerprint": base["workload_fingerprint"],
                     "fingerprint_with_domain": workload_fingerprint(named.workload, named.domain)},
        "data": {"source": source if source in BUILT_IN_DATA else os.path.abspath(source), "records": records},
        "std_errors": base["standard_errors"],
        "interval_level": level,
        "interval_method": result.interval_method,
    }


def _format(x: float) -> str:
    return f"{x:.3f}"


# ---------------------------------------------------------------------------------- commands
def release(args: argparse.Namespace) -> None:
    """Measure, reconstruct and answer the workload on the data; write or preview the table.

    Everything that can fail on the user's input is checked before the data is measured.
    """
    privacy = _privacy(args)
    check_geography_options(args)
    if args.budget is not None and args.output is None:
        raise UsageError("--budget charges the whole release: give --output FILE to keep it (without --output only "
                         "10 rows are shown and the rest would be lost, its budget with it)")
    if args.budget_key is not None and args.budget is None:
        raise UsageError("--budget-key is the key of a --budget file: give --budget FILE too")
    budget = None if args.budget is None else _budget(args.budget, privacy, args.budget_key)
    if args.geography is not None:
        return geography_release(args, privacy, _workload(args.workload), budget)
    if args.output is not None:
        _check_release_output(args.output, args.overwrite)
    named = _workload(args.workload)
    _strategy_file(args.strategy)
    loaded = None if args.strategy in STRATEGY_NAMES else _loaded_strategy(args.strategy, named, privacy)
    source = _data_source(args, named)
    start = time.perf_counter()
    records, built_in = _records(args, named, source)
    x = named.domain.vectorize(records, codes=args.codes)
    read_seconds = time.perf_counter() - start
    with tqdm(total=2, desc="release: plan", unit="step", leave=False, file=sys.stderr) as steps:
        start = time.perf_counter()
        chosen, provenance = _plan(args.strategy, named, privacy, args, loaded)
        plan_seconds = time.perf_counter() - start
        steps.update()
        steps.set_description("release: measure, reconstruct, answer")
        result = run(named.workload, x, privacy, strategy=chosen, rng=args.noise_seed, postprocess=args.postprocess,
                     budget=budget, label=args.workload)
        steps.update()
    # run was handed a finished plan: the time that plan took (optimization included) is the CLI's to report
    step = "optimize and plan" if args.strategy == "auto" else "plan"
    timings = {"read data": read_seconds, step: plan_seconds,
               **{k: v for k, v in result.timings.items() if k not in ("plan", "optimize")}}
    result = dataclasses.replace(result, timings=timings)

    # only differentially private or public numbers are printed: the record count, the time spent
    # reading the records and the true answers are shown for synthetic data or with --evaluate
    public = source == "synthetic" or args.evaluate
    if not public:
        result = dataclasses.replace(result, timings={k: v for k, v in result.timings.items() if k != "read data"})
    table = result.table()
    print(f"{named.description}: {named.workload.shape[0]:,} queries over {named.domain.size:,} cells")
    if public:
        kind = "built-in SYNTHETIC " + source if source == "synthetic" else source + ", shown by --evaluate: NOT private"
        print(f"  data: {len(records):,} records ({kind})")
    else:
        print(f"  data: {'built-in ' + source if built_in else source} (the number of records is private and not shown; "
              "--evaluate shows it and the true error, for evaluation only)")
    print(result.summary())
    if public:
        truth = result.workload @ x  # the queries released (a weighted workload's queries, unweighted)
        print(f"  RMSE against the true answers ({'synthetic data' if source == 'synthetic' else 'NOT private'}): "
              f"{_format(np.sqrt(np.mean((result.answers - truth) ** 2)))}")
    print()
    print(_per_table_rmse(result.workload, result.std_errors**2).to_string(index=False, float_format=_format))
    print()
    if args.output is None:
        print(table.head(10).to_string(index=False, float_format=_format))
        print(f"... {len(table):,} rows; write them all with --output FILE.csv or FILE.parquet")
    else:
        level = float(table.attrs.get("level", 0.95))
        written = _write(table, args.output, _provenance(args, named, source, len(records) if public else None, result,
                                                         provenance, level, budget), overwrite=args.overwrite)
        if written[0] != args.output:
            print(f"note: {args.output} appeared while the release ran (another process?) and was not replaced")
        print(f"wrote {len(table):,} rows to {written[0]}"
              + ("" if len(written) == 1 else f"; privacy, strategy and hdmm version to {written[1]}"))
        if budget is not None:
            settle_quietly(budget, result.charge, output=os.path.abspath(written[0]))
    if budget is not None:
        print(budget.charged(result.charge))


BUDGET_KEY_HELP = ("a file holding a secret key (16 or more bytes, e.g. head -c 32 /dev/urandom) that signs the "
                   "budget file's records (HMAC-SHA256), so that nobody without it can edit them and recompute their "
                   "chain; keep it outside the budget's directory. Give it to create, show and every release")


def _budget_key(path: str | None) -> bytes | None:
    """The secret key in the file ``--budget-key FILE`` names (its bytes as they are), or None."""
    if path is None:
        return None
    try:
        with open(path, "rb") as file:
            key = file.read(4097)
    except OSError as exc:
        raise UsageError(f"--budget-key {path} cannot be read ({exc.strerror or exc})") from None
    if not 16 <= len(key) <= 4096:
        raise UsageError(f"--budget-key {path} must hold 16 to 4096 bytes of secret key (e.g. head -c 32 "
                         f"/dev/urandom > {path}; chmod 600 {path}), got {len(key)}")
    return key


def _budget(path: str, privacy: Privacy, key_file: str | None = None) -> Budget:
    """``release --budget``: the budget file, read and checked to pay for ``privacy`` before any work."""
    if not os.path.exists(path):
        raise UsageError(f"--budget {path} does not exist; create it first: hdmm budget create {path} --epsilon E "
                         "(pure DP) or --rho R (zCDP), or --epsilon E --delta D")
    budget = _load_budget(path, key_file)
    budget.check(privacy)
    _probe_directory(path, "--budget")
    return budget


def _load_budget(path: str, key_file: str | None) -> Budget:
    try:
        return Budget.load(path, key=_budget_key(key_file))
    except ValueError as exc:  # the library's words for a key are key=...: the CLI's are --budget-key
        raise UsageError(str(exc).replace("(key=..., or --budget-key FILE)", "(--budget-key FILE)")) from None


def budget_create(args: argparse.Namespace) -> None:
    """``hdmm budget create FILE``: a new budget file with a total (never replacing one)."""
    privacy = _privacy(args)
    key = _budget_key(args.budget_key)
    if os.path.lexists(args.file):
        raise UsageError(f"{args.file} exists: a budget file is never replaced (its charges would be forgotten); "
                         f"see it with: hdmm budget show {args.file}")
    _probe_directory(args.file, "budget create")
    if privacy.budget_unit is None:  # (epsilon, delta) does not add up: the zCDP budget that implies it
        budget = Budget.from_approx_dp(privacy.epsilon, privacy.delta)
    else:
        budget = Budget(privacy)
    budget.save(args.file, key=key)
    print(f"created {args.file}: {budget.total.description}"
          + ("" if budget.delta is None else f", which implies (epsilon={privacy.epsilon:g}, "
             f"delta={budget.delta:g})-DP for all releases charged to it together")
          + ("" if key is None else "; its records are signed with the key in " + args.budget_key))


def budget_show(args: argparse.Namespace) -> None:
    """``hdmm budget show FILE``: the total, what is spent and left, and every charge."""
    if args.delta is not None and not (is_finite_real(args.delta) and 0 < args.delta < 1):
        raise UsageError(f"--delta must be a number in (0, 1), got {args.delta:g}")
    budget = _load_budget(args.file, args.budget_key)
    print(budget.summary())
    if args.delta is not None:
        print(f"  as (epsilon, delta)-DP at delta = {args.delta:g}: spent epsilon = "
              f"{budget.epsilon_at(args.delta):.6g} of {budget.epsilon_at(args.delta, total=True):.6g}")


def optimize_command(args: argparse.Namespace) -> None:
    """Optimise a strategy for the workload and save it for later releases."""
    privacy = _privacy(args)
    _check_output(args.output, "--output", (".npz",))
    named = _workload(args.workload)
    start = time.perf_counter()
    with for_release():  # a strategy file is for releases: only strategies measured exactly (hdmm.exact)
        result = optimize(named.workload, privacy, seed=args.seed, restarts=args.restarts, progress=True,
                          time_limit=args.time_limit)
    seconds = time.perf_counter() - start
    save_strategy(result, args.output, {"workload": args.workload, "hdmm_version": hdmm_version(),
                                        "workload_fingerprint": workload_fingerprint(named.workload),
                                        "workload_fingerprint_with_domain": workload_fingerprint(named.workload,
                                                                                                 named.domain)})
    bound = result.bound.rmse
    report = result.report[["optimizer", "rmse", "exact", "seconds"]].copy()
    report.insert(2, "RMSE / SVD bound RMSE", report["rmse"] / bound if bound > 0 else np.inf)
    print(f"{named.description}, {privacy.description}")
    print(report.to_string(index=False, float_format=_format, na_rep="-"))
    for name, note in zip(result.report["optimizer"], result.report["note"]):
        if note:
            print(f"  {name}: {note}")
    print(f"best: {result.optimizer} (RMSE per query {_format(result.rmse)}; SVD lower bound RMSE {_format(bound)}; "
          f"RMSE ratio to the bound {_format(result.rmse / bound) if bound > 0 else 'inf'}x); optimized in "
          f"{seconds:.3g} s")
    print(f"saved to {args.output}; release with: hdmm release --workload {args.workload} --strategy {args.output} ...")


def error_command(args: argparse.Namespace) -> None:
    """Expected per-table RMSE of a strategy next to Identity's; with ``--plot``, a bar chart."""
    privacy = _privacy(args)
    if args.plot is not None:
        _check_plot(args.plot)
    named = _workload(args.workload)
    _strategy_file(args.strategy)
    W = named.workload
    chosen, provenance = _plan(args.strategy, named, privacy, args)
    label = args.strategy if args.strategy in STRATEGY_NAMES else chosen.origin
    if args.strategy == "auto":
        label = f"auto ({provenance['optimizer']})"
    variance = chosen.variances
    column = f"rmse ({label})" + ("" if chosen.variance_exact else " upper bound")
    table = _per_table_rmse(W, variance).rename(columns={"rmse": column})
    if args.strategy != "identity":
        table["rmse (identity)"] = _per_table_rmse(W, plan(W, Identity(W.shape[1]), privacy).variances)["rmse"]
    bound = svd_bound(chosen.workload, privacy, seed=0)  # the released queries, without union weights
    rmse = float(np.sqrt(variance.mean()))
    print(f"{named.description}, {privacy.description}")
    print(table.to_string(index=False, float_format=_format))
    print(f"overall RMSE per query: {_format(rmse)} ({label}); SVD lower bound RMSE {_format(bound.rmse)}; "
          f"RMSE ratio to the bound {_format(rmse / bound.rmse) if bound.rmse > 0 else 'inf'}x")
    if args.plot is not None:
        _plot(table, bound.rmse, f"{args.workload}: {privacy.description}", args.plot)
        print(f"plot saved to {args.plot}")


def _plot(table: pd.DataFrame, bound: float, title: str, path: str) -> None:
    """Bar chart of the ``rmse (...)`` columns per table, with the SVD bound as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = [c for c in table.columns if c.startswith("rmse")]
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.5 * len(table) + 2), 4))
    x = np.arange(len(table))
    for k, c in enumerate(series):
        ax.bar(x + (k - (len(series) - 1) / 2) * width, table[c], width, label=c[len("rmse ("):-1])
    ax.axhline(bound, color="black", linestyle="--", linewidth=1, label="SVD bound (whole workload)")
    ax.set_xticks(x, table["table"], rotation=45, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("expected RMSE per query (log scale)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def demo(args: argparse.Namespace) -> None:
    """Print the SF1 Persons workload's size, its Identity-strategy error and the SVD bound."""
    privacy = _privacy(args)
    start = time.perf_counter()
    named = named_workload("sf1")
    W, domain = named.workload, named.domain
    built = time.perf_counter()
    variance = per_query_variance(W, Identity(domain.size), privacy)
    bound = svd_bound(W, privacy)
    done = time.perf_counter()

    rmse = float(np.sqrt(variance.mean()))
    print(f"SF1 Persons workload: {W.shape[0]:,} queries over {domain.size:,} cells")
    print("  domain: " + " x ".join(f"{n} ({s})" for n, s in zip(domain.names, domain.shape)))
    print(f"  privacy: {privacy.description}")
    print(f"Identity strategy: RMSE per query {rmse:.3f}")
    print(f"SVD lower bound (any strategy): RMSE {bound.rmse:.3f} ({'exact' if bound.exact else 'estimate'})")
    print(f"  Identity's RMSE is {rmse / bound.rmse:.2f}x the bound's (a ratio of RMSEs per query)")
    print()
    print(_per_table_rmse(W, variance).to_string(index=False, float_format=_format))
    print()
    sample = np.linspace(0, W.shape[0] - 1, 6).astype(int)
    print("Sample queries (standard error under Identity):")
    for i in sample:
        print(f"  {W.labels[i]:<60s} {np.sqrt(variance[i]):8.3f}")
    print(f"\nbuilt in {built - start:.3f} s; error and bound in {done - built:.3f} s")


# ---------------------------------------------------------------------------------- parser
def _add_privacy(p: argparse.ArgumentParser, default_epsilon: float | None = None) -> None:
    p.add_argument("--epsilon", type=float, default=default_epsilon, help="privacy budget epsilon (pure DP, or with --delta)")
    p.add_argument("--delta", type=float, help="delta for (epsilon, delta)-DP with Gaussian noise")
    p.add_argument("--rho", type=_rho, help="rho for rho-zCDP with Gaussian noise (a number, or an exact "
                   "fraction p/q such as 293764/114921, kept exact in budgets and provenance)")


def _add_workload(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", required=True,
                   help="a named workload (sf1, sf1-states, pl94, pl94-states, pl94-2020, adult) or a JSON workload file")


def _add_search(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, help="seed of the optimizer's random starts (reproducible research)")
    p.add_argument("--restarts", type=int, help="random starts per optimizer (default: as hdmm.optimize, 3 to 8 "
                   "depending on the optimizer and attribute size)")
    p.add_argument("--time-limit", type=float, metavar="SECONDS", help="return the best strategy found after this "
                   "many seconds (no optimizer starts later; default: no limit)")


STRATEGY_HELP = ("auto (optimise now, the default), identity (measure every cell), or a strategy file (.npz) "
                 "written by 'hdmm optimize'; for a --geography release of pl94-2020 also production (the 2020 "
                 "Census's per-level strategies and budget shares, estimated top down)")


def parser() -> argparse.ArgumentParser:
    """The argument parser of the ``hdmm`` command."""
    top = argparse.ArgumentParser(prog="hdmm", description="The High-Dimensional Matrix Mechanism: private answers to "
                                  "large sets of counting queries.")
    top.add_argument("--version", action="version", version=f"hdmm {hdmm_version()}")
    sub = top.add_subparsers(dest="command", required=True)

    p = sub.add_parser("release", help="release a workload's answers on data, with standard errors",
                       description="Release a workload's answers on data, with standard errors. The inputs and the "
                       "output are checked before the data is measured. A release file records the privacy "
                       "parameters, the strategy's origin and the hdmm version: a .parquet file in its key-value "
                       "metadata (key 'hdmm'), a .csv file in a JSON file next to it, <output>.json.")
    _add_workload(p)
    _add_privacy(p)
    p.add_argument("--data", help="records as .csv or .parquet (one column per attribute), or built-in: synthetic "
                   "(census workloads; the default for them) or adult")
    reading = p.add_mutually_exclusive_group()
    reading.add_argument("--labels", action="store_true", help="read the data's columns of labelled attributes as "
                         "text matched to the labels exactly (for labels that look like numbers, e.g. '1'..'9')")
    reading.add_argument("--codes", action="store_true", help="read every data column as codes 0..n-1, whatever "
                         "the labels")
    p.add_argument("--people", type=_people, default=1_000_000, help="size of built-in synthetic data, >= 1 (e.g. "
                   "20000 or 1e6; default 1,000,000)")
    p.add_argument("--data-seed", type=int, default=0, help="seed of the built-in synthetic data (default 0)")
    p.add_argument("--strategy", default="auto", help=STRATEGY_HELP)
    p.add_argument("--postprocess", choices=["nonnegative", "integer"], help="make the estimate non-negative "
                   "(or non-negative integers); the change it makes is reported")
    p.add_argument("--noise-seed", type=int, help="seed the noise: for tests and reproducible research only, never "
                   "for a real release (default: operating-system entropy; recorded in the provenance)")
    p.add_argument("--output", help="write the table to a .csv file (provenance in <output>.json next to it) or a "
                   ".parquet file (provenance in its metadata; needs pyarrow)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output file (the release in it "
                   "is lost)")
    p.add_argument("--evaluate", action="store_true", help="also show the number of records, the time spent reading "
                   "them and the RMSE against the true answers: NOT differentially private, for evaluation on "
                   "synthetic or public data only (always shown for the built-in synthetic data)")
    p.add_argument("--budget", metavar="FILE", help="charge the release to this privacy budget file (made by 'hdmm "
                   "budget create'): refused before the data is read if it cannot pay; the charge is written before "
                   "any noise is drawn")
    p.add_argument("--budget-key", metavar="FILE", help=BUDGET_KEY_HELP)
    _add_search(p)
    add_geography_options(p)
    p.set_defaults(run=release)

    p = sub.add_parser("optimize", help="optimise a strategy for a workload and save it to a file")
    _add_workload(p)
    _add_privacy(p)
    p.add_argument("--output", required=True, help="strategy file to write (.npz); it records the optimizer, the "
                   "privacy it was optimised for and the hdmm version")
    _add_search(p)
    p.set_defaults(run=optimize_command)

    p = sub.add_parser("error", help="expected error per table of a strategy (RMSE), optionally plotted")
    _add_workload(p)
    _add_privacy(p)
    p.add_argument("--strategy", default="auto", help=STRATEGY_HELP)
    p.add_argument("--plot", help="also save a bar chart to this file (.png, .pdf, .svg, ...); needs matplotlib: "
                   "pip install 'hdmm[plot]'")
    _add_search(p)
    p.set_defaults(run=error_command)

    p = sub.add_parser("budget", help="a privacy budget across releases: create a budget file, or show one",
                       description="A privacy budget file holds a total (pure DP epsilon, or zCDP rho) and every "
                       "release charged to it (hdmm release --budget FILE). Pure DP adds epsilons; zCDP adds rho, a "
                       "pure-DP release costing epsilon^2/2 and an (epsilon, delta) release the rho its noise is "
                       "calibrated to.")
    actions = p.add_subparsers(dest="action", required=True)
    q = actions.add_parser("create", help="create a budget file with a total (an existing file is never replaced)")
    q.add_argument("file", help="the budget file to create (.json)")
    _add_privacy(q)
    q.add_argument("--budget-key", metavar="FILE", help=BUDGET_KEY_HELP)
    q.set_defaults(run=budget_create)
    q = actions.add_parser("show", help="the total, what is spent and left, and every charge")
    q.add_argument("file", help="a budget file")
    q.add_argument("--delta", type=float, help="also state a zCDP budget as (epsilon, delta)-DP at this delta")
    q.add_argument("--budget-key", metavar="FILE", help=BUDGET_KEY_HELP)
    q.set_defaults(run=budget_show)

    p = sub.add_parser("demo", help="SF1 Persons: workload size, Identity error and the SVD bound")
    _add_privacy(p, default_epsilon=1.0)
    p.set_defaults(run=demo)
    return top


#: The Python API's words in error messages (hdmm.Domain.vectorize's) and the command line's flags for them.
_CLI_WORDS = [
    (re.compile(r"cast the column to text to match each value to the label of the same text \(pandas: .*? to keep "
                r"leading zeros\)"), "pass --labels to match each value to the label of the same text"),
    (re.compile(r"call vectorize without codes=True"), "leave out --codes"),
    (re.compile(r"codes=True"), "--codes"),
    (re.compile(r"use less extreme parameters, or ZCDP$"), "use less extreme parameters, or --rho (zCDP)"),
]


def in_cli_words(message: str) -> str:
    """An error message of the Python API in the command line's words: ``--codes``, not ``codes=True``.

    >>> in_cli_words("with codes=True values must be codes 0..1; to pass value labels call vectorize without codes=True")
    'with --codes values must be codes 0..1; to pass value labels leave out --codes'
    """
    for pattern, words in _CLI_WORDS:
        message = pattern.sub(words, message)
    return message


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (2 for bad input, with one line on stderr)."""
    args = parser().parse_args(argv)
    try:
        args.run(args)
    except BrokenPipeError:  # output piped into a command that stopped reading, e.g. head
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except USER_ERRORS as exc:
        print(f"hdmm: error: {in_cli_words(str(exc))}", file=sys.stderr)
        return 2
    except MemoryError:
        print("hdmm: error: out of memory; use less data (--people), a smaller workload or a machine with more "
              "memory", file=sys.stderr)
        return 2
    return 0
