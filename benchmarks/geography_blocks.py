"""The United States down to the block: building the GeographyTree and placing records in it.

Run ``python benchmarks/geography_blocks.py [--records 10000000]``; it writes
``benchmarks/results/geography_blocks.json`` and prints the section of
``benchmarks/results/geography.md`` that ``benchmarks/geography.py`` reproduces from it. Each step
runs in its own process under ``/usr/bin/time -v`` (peak resident memory of that process, which
includes the Python interpreter, numpy and pandas); inside, the step's own allocations are traced
with ``tracemalloc`` (numpy and pandas report theirs to it) and its wall time taken.

Steps (the geography and the records are SYNTHETIC, :mod:`census_workloads.geography`):

* ``table``: ``us_geography(LEVELS)``, the table of 8,132,968 blocks (one row per block);
* ``tree``: the table, then ``GeographyTree.from_table`` with six levels (nation, state, county,
  tract, block group, block; ``us_tree``), timed once, then once more under tracemalloc;
* ``codes``: the tree, then ``leaf_codes`` (the 8.1 million GEOIDs as text, made on demand) and
  ``leaf_index`` of all of them;
* ``locate``: the tree, then ``records`` rows with the five level columns (each record's block
  drawn in proportion to the blocks' populations, the codes as text) and ``tree.locate``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def _traced(fn):
    """``(result, seconds, peak GB)`` of ``fn()`` under tracemalloc."""
    tracemalloc.start()
    start = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1] / 1e9
    tracemalloc.stop()
    return out, seconds, peak


def _step(name: str, records: int) -> dict:
    import numpy as np
    import pandas as pd

    from census_workloads.geography import LEVELS, us_geography, us_tree

    out: dict = {"step": name}
    table, out["table seconds"], out["table traced GB"] = _traced(lambda: us_geography(LEVELS))
    if name == "table":
        return out
    start = time.perf_counter()
    tree = us_tree(LEVELS)  # from the cached table
    out["tree seconds"] = time.perf_counter() - start
    out["tree"] = repr(tree)
    out["tree arrays GB"] = sum(a.nbytes for group in (tree._parents, tree._ranks, tree._leaf_bounds,
                                                        tree._child_bounds) for a in group) / 1e9
    _, out["tree traced seconds"], out["tree traced GB"] = _traced(lambda: us_tree(LEVELS))
    if name == "tree":
        return out
    if name == "codes":
        codes, out["leaf_codes seconds"], out["leaf_codes traced GB"] = _traced(lambda: tree.leaf_codes)
        found, out["leaf_index seconds"], _ = _traced(lambda: tree.leaf_index(codes))
        assert np.array_equal(found, np.arange(tree.leaves))
        return out
    rng = np.random.default_rng(0)
    people = table["population"].to_numpy()
    leaf = np.repeat(np.arange(len(table)), rng.multinomial(records, people / people.sum()))
    data = pd.DataFrame({level: table[level].to_numpy()[leaf] for level in LEVELS})
    del table
    located, out["locate seconds"], out["locate traced GB"] = _traced(lambda: tree.locate(data))
    assert np.array_equal(located, leaf)
    out["records"] = records
    return out


def _run(name: str, records: int) -> dict:
    command = ["/usr/bin/time", "-v", sys.executable, __file__, "--step", name, "--records", str(records)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", done.stderr)
    result["peak RSS GB"] = int(rss.group(1)) / 1e6
    result["process wall"] = wall.group(1)
    return result


def report(results: list[dict]) -> list[str]:
    """The markdown section of benchmarks/results/geography.md."""
    by = {r["step"]: r for r in results}
    lines = ["## The United States to the block: building the tree and locating records", "",
             "`python benchmarks/geography_blocks.py` (each step in its own process; peak resident memory from "
             "`/usr/bin/time -v`, the step's own allocations from tracemalloc). The geography is SYNTHETIC below "
             "the counties (census_workloads.geography: the 2020 tallies of 84,414 tracts, 239,780 block groups "
             "and 8,132,968 blocks, synthetic populations); the records are synthetic too.", "",
             "| step | seconds | traced peak GB | process peak RSS GB |", "|---|---|---|---|"]
    if "table" in by:
        r = by["table"]
        lines.append(f"| synthetic table of 8,132,968 blocks (`us_geography`) | {r['table seconds']:.1f} | "
                     f"{r['table traced GB']:.2f} | {r['peak RSS GB']:.2f} |")
    if "tree" in by:
        r = by["tree"]
        lines.append(f"| `GeographyTree.from_table`, 6 levels (`us_tree`, table built) | {r['tree seconds']:.1f} | "
                     f"{r['tree traced GB']:.2f} | {r['peak RSS GB']:.2f} (table and tree) |")
    if "codes" in by:
        r = by["codes"]
        lines.append(f"| `leaf_codes` (8.1M GEOIDs as text, on demand) | {r['leaf_codes seconds']:.1f} | "
                     f"{r['leaf_codes traced GB']:.2f} | {r['peak RSS GB']:.2f} (table, tree, codes) |")
        lines.append(f"| `leaf_index` of the 8.1M GEOIDs | {r['leaf_index seconds']:.1f} | | |")
    if "locate" in by:
        r = by["locate"]
        lines.append(f"| `tree.locate`, {r['records']:,} records, 5 level columns | {r['locate seconds']:.1f} | "
                     f"{r['locate traced GB']:.2f} | {r['peak RSS GB']:.2f} (table, tree, records) |")
    if "tree" in by:
        lines += ["", f"- {by['tree']['tree']}: the tree's arrays hold {by['tree']['tree arrays GB']:.2f} GB "
                  "(parents, code ranks, leaf and child bounds); full codes are made only when asked for."]
    lines += ["", "The tree step's process holds the 8.1M-row table (pandas text columns) besides the tree; times are "
              "from a 2-core machine shared with other jobs (upper bounds). Before issue 23 the tree was a dict of "
              "Python tuples per unit, built by a loop over the rows (not measured at this size)."]
    return lines + [""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--step", choices=["table", "tree", "codes", "locate"])
    args = parser.parse_args()
    if args.step:
        print(json.dumps(_step(args.step, args.records)))
        return
    results = [_run(step, args.records) for step in ("table", "tree", "codes", "locate")]
    (RESULTS / "geography_blocks.json").write_text(json.dumps(results, indent=2))
    print("\n".join(report(results)))


if __name__ == "__main__":
    main()
