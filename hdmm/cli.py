"""The ``hdmm`` command line: private releases, strategy optimization and error reports.

::

    hdmm release  --workload sf1 --epsilon 1                 # built-in synthetic SF1 data
    hdmm release  --workload spec.json --data people.csv --rho 0.5 --output release.parquet
    hdmm optimize --workload sf1 --epsilon 1 --output sf1.npz  # optimise once ...
    hdmm release  --workload sf1 --epsilon 1 --strategy sf1.npz  # ... release many times
    hdmm error    --workload sf1 --epsilon 1 --strategy sf1.npz --plot error.png
    hdmm demo                                                  # SF1 size, Identity error, bound

``--workload`` is a name (:data:`hdmm.catalog.WORKLOADS`) or a JSON workload file
(:mod:`hdmm.catalog`). Privacy is ``--epsilon`` (pure DP), ``--epsilon`` with ``--delta``
(approximate DP, Gaussian noise) or ``--rho`` (zCDP). Bad input prints one line starting
``hdmm: error:`` and exits with status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Sequence

import numpy as np
import pandas as pd
from tqdm import tqdm

from .bound import svd_bound
from .catalog import NamedWorkload, load_workload, named_workload
from .error import expected_error, per_query_variance
from .io import load_strategy, save_strategy
from .matrix import Identity, Matrix
from .optimizers import optimize
from .privacy import ZCDP, ApproxDP, Privacy, PureDP
from .release import run, table_names

#: Built-in data sets by name (``--data``).
BUILT_IN_DATA = ("synthetic", "adult")

#: Errors that come from the user's input: printed as one line, exit status 2.
USER_ERRORS = (ValueError, OSError)


class UsageError(ValueError):
    """A problem with the command line's arguments."""


# ---------------------------------------------------------------------------------- inputs
def _privacy(args: argparse.Namespace) -> Privacy:
    """``--epsilon`` -> PureDP, ``--epsilon --delta`` -> ApproxDP, ``--rho`` -> ZCDP."""
    if args.rho is not None:
        if args.epsilon is not None or args.delta is not None:
            raise UsageError("give either --rho (zCDP) or --epsilon [--delta], not both")
        return ZCDP(args.rho)
    if args.epsilon is None:
        raise UsageError("give a privacy budget: --epsilon E (pure DP), --epsilon E --delta D, or --rho R (zCDP)")
    return PureDP(args.epsilon) if args.delta is None else ApproxDP(args.epsilon, args.delta)


def _workload(name: str) -> NamedWorkload:
    """A named workload, or a JSON workload file (then no built-in data is attached)."""
    if name.endswith(".json") or os.path.sep in name:
        W, domain = load_workload(name)
        return NamedWorkload(W, domain, None, f"workload file {name}")
    return named_workload(name)


def _read_records(path: str) -> pd.DataFrame:
    if path.endswith(".parquet"):
        try:
            return pd.read_parquet(path)
        except ImportError:
            raise UsageError("reading Parquet needs pyarrow: pip install 'hdmm[parquet]'") from None
    if path.endswith(".csv"):
        return pd.read_csv(path)
    raise UsageError(f"--data {path}: expected a .csv or .parquet file of records, or one of {', '.join(BUILT_IN_DATA)}")


def _records(args: argparse.Namespace, named: NamedWorkload) -> tuple[pd.DataFrame, bool]:
    """The records to release and whether they are built-in (so their true answers may be shown)."""
    source = args.data or ("synthetic" if named.data and named.data.startswith("synthetic") else named.data)
    if source is None:
        raise UsageError("this workload has no built-in data: give --data FILE.csv or FILE.parquet")
    if source == "synthetic":
        if not (named.data or "").startswith("synthetic"):
            raise UsageError("--data synthetic is synthetic Census persons; it fits the census workloads only")
        from census_workloads import synthetic_persons

        return synthetic_persons(args.people, seed=args.data_seed, states=named.data.endswith("states")), True
    if source == "adult":
        from .datasets import load_adult

        if named.data != "adult":
            raise UsageError("--data adult fits the adult workload (or a workload file over Adult attributes)")
        return load_adult()[0], True
    return _read_records(source), False


def _strategy(spec: str, named: NamedWorkload, privacy: Privacy, args: argparse.Namespace):
    """``identity``, ``auto`` (optimise now, with a progress bar) or a strategy file."""
    N = named.domain.size
    if spec == "identity":
        return Identity(N)
    if spec == "auto":
        return optimize(named.workload, privacy, seed=args.seed, restarts=args.restarts, progress=True)
    A, metadata = load_strategy(spec)
    if A.shape[1] != N:
        raise UsageError(f"the strategy in {spec} has {A.shape[1]:,} columns but the workload's domain has {N:,} cells; "
                         "optimise one for this workload with 'hdmm optimize'")
    saved = metadata.get("privacy", {}).get("type")
    if saved and Privacy.from_dict(metadata["privacy"]).noise != privacy.noise:
        print(f"hdmm: note: {spec} was optimised for {metadata['privacy']['type']} ({Privacy.from_dict(metadata['privacy']).noise} "
              f"noise); it is still private under {privacy.description}, but not tuned for it", file=sys.stderr)
    return A


def _per_table_rmse(W: Matrix, variance: np.ndarray) -> pd.DataFrame:
    """RMSE per table of the workload (its named parts; the whole workload as one table otherwise)."""
    tables = table_names(W)
    frame = pd.DataFrame({"table": "workload" if tables is None else tables, "variance": variance})
    grouped = frame.groupby("table", sort=False)["variance"]
    return pd.DataFrame({"queries": grouped.size(), "rmse": np.sqrt(grouped.mean())}).reset_index()


def _write(table: pd.DataFrame, path: str) -> None:
    if path.endswith(".parquet"):
        try:
            table.to_parquet(path, index=False)
        except ImportError:
            raise UsageError("writing Parquet needs pyarrow: pip install 'hdmm[parquet]'") from None
    elif path.endswith(".csv"):
        table.to_csv(path, index=False)
    else:
        raise UsageError(f"--output {path}: use a .csv or .parquet file name")


def _format(x: float) -> str:
    return f"{x:.3f}"


# ---------------------------------------------------------------------------------- commands
def release(args: argparse.Namespace) -> None:
    """Measure, reconstruct and answer the workload on the data; write or preview the table."""
    privacy = _privacy(args)
    if args.output is not None and not args.output.endswith((".csv", ".parquet")):
        raise UsageError(f"--output {args.output}: use a .csv or .parquet file name")
    named = _workload(args.workload)
    records, built_in = _records(args, named)
    x = named.domain.vectorize(records)
    with tqdm(total=2, desc="release: strategy", unit="step", leave=False, file=sys.stderr) as steps:
        strategy = _strategy(args.strategy, named, privacy, args)
        steps.update()
        steps.set_description("release: measure, reconstruct, answer")
        result = run(named.workload, x, privacy, strategy=strategy, rng=args.noise_seed, postprocess=args.postprocess)
        steps.update()

    table = result.table()
    print(f"{named.description}: {named.workload.shape[0]:,} queries over {named.domain.size:,} cells")
    print(f"  data: {len(records):,} records ({'built-in' if built_in else args.data})")
    print(result.summary())
    if built_in:
        truth = named.workload @ x
        print(f"  RMSE against the true answers of this built-in data: {_format(np.sqrt(np.mean((result.answers - truth) ** 2)))}")
    print()
    print(_per_table_rmse(named.workload, result.std_errors**2).to_string(index=False, float_format=_format))
    print()
    if args.output is None:
        print(table.head(10).to_string(index=False, float_format=_format))
        print(f"... {len(table):,} rows; write them all with --output FILE.csv or FILE.parquet")
    else:
        _write(table, args.output)
        print(f"wrote {len(table):,} rows to {args.output}")


def optimize_command(args: argparse.Namespace) -> None:
    """Optimise a strategy for the workload and save it for later releases."""
    privacy = _privacy(args)
    named = _workload(args.workload)
    result = optimize(named.workload, privacy, seed=args.seed, restarts=args.restarts, progress=True)
    save_strategy(result, args.output, {"workload": args.workload})
    report = result.report[["optimizer", "rmse", "ratio to SVD bound", "exact", "seconds"]]
    print(f"{named.description}, {privacy.description}")
    print(report.to_string(index=False, float_format=_format))
    print(f"best: {result.optimizer} (RMSE {_format(result.rmse)}; SVD bound RMSE {_format(result.bound.rmse)})")
    print(f"saved to {args.output}; release with: hdmm release --workload {args.workload} --strategy {args.output} ...")


def error_command(args: argparse.Namespace) -> None:
    """Expected per-table RMSE of a strategy next to Identity's, with a bar chart saved as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    privacy = _privacy(args)
    named = _workload(args.workload)
    W = named.workload
    A = _strategy(args.strategy, named, privacy, args)
    label = args.strategy
    if not isinstance(A, Matrix):
        label = f"auto ({A.optimizer})"
        A = A.strategy
    variance = per_query_variance(W, A, privacy)
    if not np.all(np.isfinite(variance)):
        raise UsageError(f"the strategy does not support this workload: {expected_error(W, A, privacy).reason}")
    column = f"rmse ({label})"
    table = _per_table_rmse(W, variance).rename(columns={"rmse": column})
    if label != "identity":
        table["rmse (identity)"] = _per_table_rmse(W, per_query_variance(W, Identity(W.shape[1]), privacy))["rmse"]
    bound = svd_bound(W, privacy, seed=0)
    print(f"{named.description}, {privacy.description}")
    print(table.to_string(index=False, float_format=_format))
    print(f"overall RMSE: {_format(np.sqrt(variance.mean()))} ({label}); SVD lower bound {_format(bound.rmse)}")

    series = [c for c in table.columns if c.startswith("rmse")]
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.5 * len(table) + 2), 4))
    x = np.arange(len(table))
    for k, c in enumerate(series):
        ax.bar(x + (k - (len(series) - 1) / 2) * width, table[c], width, label=c[len("rmse ("):-1])
    ax.axhline(bound.rmse, color="black", linestyle="--", linewidth=1, label="SVD bound (whole workload)")
    ax.set_xticks(x, table["table"], rotation=45, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("expected RMSE per query (log scale)")
    ax.set_title(f"{args.workload}: {privacy.description}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.plot, dpi=120)
    plt.close(fig)
    print(f"plot saved to {args.plot}")


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
    print(f"  Identity is {rmse / bound.rmse:.2f}x the bound")
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
    p.add_argument("--rho", type=float, help="rho for rho-zCDP with Gaussian noise")


def _add_workload(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", required=True,
                   help="a named workload (sf1, sf1-states, pl94, pl94-states, adult) or a JSON workload file")


def _add_search(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, help="seed of the optimizer's random starts (reproducible research)")
    p.add_argument("--restarts", type=int, help="random starts per optimizer (default: as hdmm.optimize, 3 to 8 "
                   "depending on the optimizer and attribute size)")


def parser() -> argparse.ArgumentParser:
    """The argument parser of the ``hdmm`` command."""
    top = argparse.ArgumentParser(prog="hdmm", description="The High-Dimensional Matrix Mechanism: private answers to "
                                  "large sets of counting queries.")
    sub = top.add_subparsers(dest="command", required=True)

    p = sub.add_parser("release", help="release a workload's answers on data, with standard errors")
    _add_workload(p)
    _add_privacy(p)
    p.add_argument("--data", help="records as .csv or .parquet (one column per attribute), or built-in: synthetic "
                   "(census workloads; the default for them) or adult")
    p.add_argument("--people", type=int, default=1_000_000, help="size of built-in synthetic data (default 1,000,000)")
    p.add_argument("--data-seed", type=int, default=0, help="seed of the built-in synthetic data (default 0)")
    p.add_argument("--strategy", default="auto", help="auto (optimise now, default), identity, or a file from 'hdmm optimize'")
    p.add_argument("--postprocess", choices=["nonnegative", "integer"], help="make the estimate non-negative "
                   "(or non-negative integers); the change it makes is reported")
    p.add_argument("--noise-seed", type=int, help="seed the noise: for tests and reproducible research only, never "
                   "for a real release (default: operating-system entropy)")
    p.add_argument("--output", help="write the table to a .csv or .parquet file")
    _add_search(p)
    p.set_defaults(run=release)

    p = sub.add_parser("optimize", help="optimise a strategy for a workload and save it to a file")
    _add_workload(p)
    _add_privacy(p)
    p.add_argument("--output", required=True, help="strategy file to write (.npz)")
    _add_search(p)
    p.set_defaults(run=optimize_command)

    p = sub.add_parser("error", help="expected error per table of a strategy, with a PNG plot")
    _add_workload(p)
    _add_privacy(p)
    p.add_argument("--strategy", default="auto", help="auto (optimise now, default), identity, or a file from 'hdmm optimize'")
    p.add_argument("--plot", default="hdmm-error.png", help="where to save the plot (default hdmm-error.png)")
    _add_search(p)
    p.set_defaults(run=error_command)

    p = sub.add_parser("demo", help="SF1 Persons: workload size, Identity error and the SVD bound")
    _add_privacy(p, default_epsilon=1.0)
    p.set_defaults(run=demo)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (2 for bad input, with one line on stderr)."""
    args = parser().parse_args(argv)
    try:
        args.run(args)
    except BrokenPipeError:  # output piped into a command that stopped reading, e.g. head
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except USER_ERRORS as exc:
        print(f"hdmm: error: {exc}", file=sys.stderr)
        return 2
    return 0
