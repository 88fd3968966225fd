"""Controlled rounding benchmark: throughput on block-group families and the L1 gap to the optimum.

Two parts, written to ``benchmarks/results/rounding.md``:

1. Throughput of :func:`hdmm.georelease.rounding.round_families` (one graph per batch of families)
   on synthetic block-group families: 34 blocks x 200 non-zero parent cells, the parent's cells
   Poisson(7.5) + 1 (about 1,700 persons), each cell's count spread over a random third of the
   blocks (``--density``) by Dirichlet weights, as non-negative estimates spread it; rows free
   (blocks hold no invariant in 2020) and rows held (their rounded real totals made exact). The
   time counts rounding only (families made beforehand), single thread; 240,000 families are
   extrapolated from ``--families`` (or run whole with ``--families 240000``).
2. The L1 distance ``sum |R - X|`` against the optimum: the same rounding problem as a linear
   program (its matrix is a network's, totally unimodular, so HiGHS's vertex optimum is the best
   integer rounding), on ``--gap-families`` families; and the trivial lower bound
   ``sum min(f, 1 - f)`` (each entry to its nearest integer, ignoring the totals).

Run: ``python benchmarks/rounding.py`` (``--quick``: fewer families; ``--full``: also all 240,000).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import scipy  # noqa: E402
import scipy.sparse as sp  # noqa: E402
from scipy.optimize import linprog  # noqa: E402

from hdmm.georelease.rounding import BATCH_ENTRIES, round_families  # noqa: E402

BLOCKS, CELLS, TARGET = 34, 200, 240_000


def family(rng: np.random.Generator, density: float, held: bool):
    """One block group's ``(X, columns, rows)``: parent cells, blocks' real cells adding up to them."""
    parent = rng.poisson(7.5, CELLS) + 1
    X = np.zeros((BLOCKS, CELLS))
    for j in range(CELLS):
        who = rng.random(BLOCKS) < density
        if not who.any():
            who[rng.integers(BLOCKS)] = True
        X[who, j] = rng.dirichlet(np.ones(who.sum())) * parent[j]
    if not held:
        return X, parent, None
    rows = np.rint(X.sum(axis=1))
    rows[-1] += parent.sum() - rows.sum()
    for _ in range(200):  # iterative proportional fitting to integer rows (support kept)
        X *= (rows / X.sum(axis=1))[:, None]
        X *= (parent / X.sum(axis=0))[None, :]
        if np.abs(X.sum(axis=1) - rows).max() < 1e-11:
            break
    return X, parent, rows


def throughput(n: int, density: float, held: bool, seed: int = 0, chunk: int = 5_000) -> dict:
    """Round ``n`` families, made ``chunk`` at a time (not timed); the seconds spent rounding."""
    rng = np.random.default_rng(seed)
    entries, seconds, done = 0, 0.0, 0
    while done < n:
        fams = [family(rng, density, held) for _ in range(min(chunk, n - done))]
        entries += sum(int(np.count_nonzero(X)) for X, _, _ in fams)
        start = time.perf_counter()
        out = list(round_families(fams))
        seconds += time.perf_counter() - start
        for R, (X, c, r) in zip(out, fams):
            assert np.array_equal(R.sum(axis=0), c) and (r is None or np.array_equal(R.sum(axis=1), r))
        done += len(fams)
    return {"families": n, "entries": entries, "seconds": seconds, "per_s": n / seconds,
            "extrapolated_min": TARGET / (n / seconds) / 60}


def lp_optimum(X: np.ndarray, columns: np.ndarray, rows: np.ndarray | None) -> float:
    """Least ``sum |R - X|`` over the floor/ceiling tables with the totals (an LP; integral by total unimodularity)."""
    F = np.floor(X)
    f = X - F
    i, j = np.nonzero(f > 0)
    frac = f[i, j]
    n = frac.size
    k, m = X.shape
    cols = sp.csr_matrix((np.ones(n), (j, np.arange(n))), shape=(m, n))
    rows_m = sp.csr_matrix((np.ones(n), (i, np.arange(n))), shape=(k, n))
    a = columns - F.sum(axis=0)
    s = f.sum(axis=1)
    if rows is None:
        lo, hi = np.floor(s + 1e-9), np.ceil(s - 1e-9)
    else:
        lo = hi = rows - F.sum(axis=1)
    res = linprog(1.0 - 2.0 * frac, A_eq=cols, b_eq=a, A_ub=sp.vstack([rows_m, -rows_m]),
                  b_ub=np.concatenate([hi, -lo]), bounds=(0, 1), method="highs")
    assert res.status == 0, res.message
    return float(frac.sum() + res.fun)


def gap(n: int, density: float, held: bool, seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    fams = [family(rng, density, held) for _ in range(n)]
    ours = np.array([float(np.abs(R - X).sum()) for R, (X, _, _) in zip(round_families(fams), fams)])
    best = np.array([lp_optimum(X, c, r) for X, c, r in fams])
    nearest = np.array([float(np.minimum(X - np.floor(X), np.ceil(X) - X).sum()) for X, _, _ in fams])
    return {"families": n, "ours": ours.mean(), "optimum": best.mean(), "nearest": nearest.mean(),
            "ratio_mean": float(np.mean(ours / best)), "ratio_max": float(np.max(ours / best)),
            "at_optimum": float(np.mean(ours <= best + 1e-6))}


def tree_timing(cells_per_block: int = 25, m: int = 2016, seed: int = 0) -> str:
    """:func:`hdmm.georelease.roundtree.round_tree` on a synthetic tree: nation, 2 states (held), 10 counties,
    100 tracts, 300 block groups, 10,200 blocks of ``cells_per_block`` positive cells out of ``m``."""
    from hdmm.geography import GeographyTree
    from hdmm.georelease.roundtree import round_tree

    rng = np.random.default_rng(seed)
    pairs, frontier = {}, ["US"]
    for fan in (2, 5, 10, 3, 34):
        frontier = [f"{p}.{j}" for p in frontier for j in range(fan)]
        pairs.update({c: c.rsplit(".", 1)[0] for c in frontier})
    tree = GeographyTree.from_parents(pairs, ["nation", "state", "county", "tract", "block group", "block"])
    leaves = np.zeros((tree.leaves, m))
    for b in range(tree.leaves):
        leaves[b, rng.choice(m, cells_per_block, replace=False)] = rng.random(cells_per_block) * 3
    states = tree.aggregate(1, leaves).sum(axis=1)
    leaves *= tree.spread(1, (np.rint(states) / states)[:, None])
    cells = {d: tree.aggregate(d, leaves) for d in range(tree.depth + 1)}
    lines = [f"`round_tree` on {tree!r}, {m} cells, {cells_per_block} positive cells per block, states held; "
             "family by family below the states (`joint=0`) and the whole tree at once (`joint='block'`).", "",
             "| joint | seconds | level | units | RMSE of unit totals, integer - real | largest w |",
             "|---|---:|---|---:|---:|---:|"]
    for joint in (0, tree.depth):
        start = time.perf_counter()
        out = round_tree(tree, cells, {"state": np.rint(states)}, joint=joint)
        seconds = time.perf_counter() - start
        for d in range(tree.depth + 1):
            rmse = float(np.sqrt(np.mean((out.cells[d].sum(axis=1) - cells[d].sum(axis=1)) ** 2)))
            lines.append(f"| {tree.levels[joint]} | {seconds:.1f} | {tree.levels[d]} | {tree.sizes[d]:,} | "
                         f"{rmse:.3f} | {out.widened.get(d, 0)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", type=int, default=20_000)
    parser.add_argument("--gap-families", type=int, default=40)
    parser.add_argument("--density", type=float, default=1 / 3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--full", action="store_true", help=f"also round all {TARGET:,} families (free totals)")
    parser.add_argument("--tree", action="store_true", help="only time round_tree and append it to --out")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "rounding.md"))
    args = parser.parse_args()
    if args.tree:
        text = tree_timing()
        print(text)
        with open(args.out, "a") as f:
            f.write("\n## A tree\n\n`python benchmarks/rounding.py --tree`: " + text + "\n")
        return
    n = 2_000 if args.quick else args.families
    lines = ["# Controlled rounding: throughput and distance to the optimum", "",
             f"`python benchmarks/rounding.py{' --quick' if args.quick else ''}{' --full' if args.full else ''}` on "
             f"{platform.machine()}, "
             f"{os.cpu_count()} cores (shared with other jobs), Python {platform.python_version()}, numpy "
             f"{np.__version__}, scipy {scipy.__version__}; single thread; batches of {BATCH_ENTRIES:,} "
             "positive entries.", "",
             f"Families: {BLOCKS} blocks x {CELLS} non-zero parent cells (Poisson(7.5) + 1 persons per cell), each "
             f"cell spread over a random {args.density:.2f} of the blocks by Dirichlet weights.", "",
             "## Throughput", "",
             "| blocks' totals | density | families | positive entries | seconds | families/s | "
             f"{TARGET:,} families (min) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for density in (args.density, 1.0):
        for held in (False, True):
            count = n if density == args.density else max(n // 4, 500)
            r = throughput(count, density, held)
            lines.append(f"| {'held' if held else 'free'} | {density:.2f} | {r['families']:,} | {r['entries']:,} | "
                         f"{r['seconds']:.1f} | {r['per_s']:,.0f} | {r['extrapolated_min']:.1f} |")
            print(lines[-1], flush=True)
    if args.full:
        r = throughput(TARGET, args.density, False, seed=2)
        lines.append(f"| free | {args.density:.2f} | {r['families']:,} | {r['entries']:,} | {r['seconds']:.1f} | "
                     f"{r['per_s']:,.0f} | {r['seconds'] / 60:.1f} (measured) |")
        print(lines[-1], flush=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    lines += ["", f"Peak resident memory of the process: {peak:,.0f} "
              "MiB (families held in memory included).", "",
              "## L1 distance against the optimum", "",
             "Mean over families of `sum |R - X|`: ours, the optimum (linear program, HiGHS), and the bound of "
             "rounding every entry to its nearest integer regardless of the totals.", "",
             "| blocks' totals | families | ours | optimum | nearest (bound) | ours / optimum, mean | max | "
             "at the optimum |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for held in (False, True):
        g = gap(max(10, args.gap_families // (4 if args.quick else 1)), args.density, held)
        lines.append(f"| {'held' if held else 'free'} | {g['families']} | {g['ours']:.1f} | {g['optimum']:.1f} | "
                     f"{g['nearest']:.1f} | {g['ratio_mean']:.4f} | {g['ratio_max']:.4f} | {g['at_optimum']:.0%} |")
        print(lines[-1], flush=True)
    Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
