"""Partitions as ranges of siblings (``GeoPlan.with_partitions``) against one partition per unit: peak memory.

Run ``python benchmarks/geography_ranges.py [--states 06] [--values 2097152] [--postprocess none]``; it writes
``benchmarks/results/geography_ranges.md`` (and ``.json``). Each run is its own process (a child of this script)
releasing PL94-171 (2020 tables) for the given states at (nation, state, county, tract), on SYNTHETIC data
(``census_production.setting``), on the local engine with one worker and one BLAS thread, written to a
directory (so that the answers are not held in memory): once with one partition per county (the partition
level of the plan before ranges, whose largest partition is the largest county's subtree) and once with
ranges of tracts of at most ``--values`` numbers. It reports the peak memory of the process (sampled PSS,
``geography.PeakMemory``), the time per step and the largest difference of the released answers.

With ``--child MODE``, one release in this process, printing one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
LEVELS = ("state", "county", "tract")


def child(states: tuple[str, ...], mode: str, values: int, postprocess: str | None, out: str) -> dict:
    import numpy as np

    sys.path.insert(0, str(Path(__file__).parent))
    from census_production import setting
    from geography import PeakMemory
    from hdmm.georelease import geo_plan, release_geography

    tree, source, W, strategy, privacy, _ = setting(states, LEVELS, 60.0)
    plan = geo_plan(tree, W, privacy, strategy=strategy, partition="county", seed=0)
    if mode == "ranges":
        plan = plan.with_partitions(values=values, level="tract")
    width = max(plan.queries + 1, plan.person.strategy.shape[0])
    sizes = [plan.partition(i).ranges for i in range(plan.partitions)]
    largest = max(sum(hi - lo for lo, hi in r) for r in sizes)
    with PeakMemory(0.2) as memory:
        start = time.perf_counter()
        release = release_geography(plan, source, seed=1, postprocess=postprocess, workers=1, output=out)
        seconds = time.perf_counter() - start
    answers = {tree.levels[d]: np.asarray(release.answers(d)).tolist() for d in plan.levels}
    Path(out + ".answers.json").write_text(json.dumps(answers))
    return {"mode": mode, "partition level": tree.levels[plan.partition_level], "partitions": plan.partitions,
            "width": width, "largest partition units": largest,
            "largest partition MB": largest * width * 8 / 1e6, "seconds": seconds, "steps": dict(release.timings),
            "peak memory GB": memory.peak / 1e9, "units": int(sum(tree.sizes))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", default="06", help="FIPS codes separated by ',' (default CA)")
    parser.add_argument("--values", type=int, default=2**21)
    parser.add_argument("--postprocess", default="none", choices=["none", "nonnegative"])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    states = tuple(args.states.split(","))
    postprocess = None if args.postprocess == "none" else args.postprocess
    if args.child:
        print(json.dumps(child(states, args.child, args.values, postprocess, args.out)))
        return
    import numpy as np

    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    runs = []
    with tempfile.TemporaryDirectory() as work:
        for mode in ("units", "ranges"):
            out = os.path.join(work, mode)
            line = subprocess.run([sys.executable, __file__, "--child", mode, "--states", args.states, "--values",
                                   str(args.values), "--postprocess", args.postprocess, "--out", out],
                                  env=env, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
            runs.append(json.loads(line))
            print(runs[-1], flush=True)
        a, b = (json.loads(Path(os.path.join(work, m) + ".answers.json").read_text()) for m in ("units", "ranges"))
        diff = max(float(np.max(np.abs(np.asarray(a[k]) - np.asarray(b[k])))) for k in a)
    RESULTS.mkdir(exist_ok=True)
    name = f"geography_ranges_{args.postprocess}"
    (RESULTS / f"{name}.json").write_text(json.dumps({"runs": runs, "largest answer difference": diff}, indent=1))
    lines = [f"# Partitions as ranges of siblings: PL94 (SYNTHETIC data), states {args.states}, "
             f"(nation, state, county, tract), postprocess {args.postprocess}", "",
             "Local engine, one worker, one BLAS thread, written to a directory; peak memory of the process "
             "(sampled PSS). `python benchmarks/geography_ranges.py` (machine shared with other jobs: times are "
             "indicative).", "",
             "| partitions | level | count | largest (units) | largest (MB of doubles) | peak GB | seconds |",
             "|---|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r['mode']} | {r['partition level']} | {r['partitions']:,} | {r['largest partition units']:,}"
                     f" | {r['largest partition MB']:.0f} | {r['peak memory GB']:.2f} | {r['seconds']:.0f} |")
    lines += ["", f"Largest difference of any released answer between the two: {diff:.3g}.", ""]
    (RESULTS / f"{name}.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
