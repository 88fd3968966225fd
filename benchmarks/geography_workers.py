"""The local engine on one process and on every core: the same release, timed.

Run ``python benchmarks/geography_workers.py [--states 44,50] [--postprocess integer] [--repeat 3]
[--partition county]``; it writes ``benchmarks/results/geography_workers.md`` (and ``.json``). Each run is
its own process (a child of this script) releasing PL94-171 (2020 tables, 2,016 cells) for the given
states from the nation to the block, on SYNTHETIC data, at production's budget with the state totals held
(the setting of ``census_production.py``), partitioned by ``--partition``; it reports the release's wall
time and steps. The runs cover ``workers`` 1 and 2 (``release_geography(..., workers=)``), each at one BLAS thread and at
the machine's default threads (the child sets ``OPENBLAS_NUM_THREADS``/``OMP_NUM_THREADS`` only for
the one-thread runs), ``--repeat`` times each, interleaved; the table gives each setting's minimum and
the speed-up of two workers over one at the same threading. The answers of every run are compared
with the first one's (the same seed gives the same release whatever the number of workers).

With ``--child WORKERS``, one release in this process, printing one JSON line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
LEVELS = ("state", "county", "tract", "block_group", "block")


def child(states: tuple[str, ...], workers: int, postprocess: str | None, partition: str = "county") -> dict:
    import numpy as np

    sys.path.insert(0, str(Path(__file__).parent))
    from census_production import setting
    from hdmm.georelease import geo_plan, release_geography

    tree, source, W, strategy, privacy, _ = setting(states, LEVELS, 60.0)
    totals = source.leaf_totals()
    b = tree.leaf_bounds("state")
    invariants = {"state": {code: float(totals[b[s]:b[s + 1]].sum()) for s, code in enumerate(tree.codes("state"))}}
    plan = geo_plan(tree, W, privacy, strategy=strategy, invariants=invariants, partition=partition, seed=0)
    start = time.perf_counter()
    release = release_geography(plan, source, seed=1, postprocess=postprocess, workers=workers)
    seconds = time.perf_counter() - start
    digest = hashlib.sha256()
    for d in plan.levels:
        digest.update(np.ascontiguousarray(release.estimates[d]).tobytes())
    return {"workers": workers, "seconds": seconds, "steps": dict(release.timings), "units": int(sum(tree.sizes)),
            "partitions": int(tree.sizes[plan.partition_level]), "answers sha256": digest.hexdigest()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", default="44,50", help="FIPS codes separated by ',' (default RI, VT)")
    parser.add_argument("--postprocess", default="integer", choices=["none", "nonnegative", "integer"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--partition", default="county", help="the partition level (default county)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    states = tuple(args.states.split(","))
    postprocess = None if args.postprocess == "none" else args.postprocess
    if args.child:
        print(json.dumps(child(states, args.child, postprocess, args.partition)))
        return
    runs = []
    for _ in range(args.repeat):
        for threads in ("1", "default"):
            for workers in (1, 2):
                env = dict(os.environ)
                for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
                    env.pop(name, None)
                    if threads == "1":
                        env[name] = "1"
                cmd = [sys.executable, __file__, "--child", str(workers), "--states", args.states,
                       "--postprocess", args.postprocess, "--partition", args.partition]
                done = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if done.returncode != 0:
                    sys.stderr.write(done.stderr)
                    raise SystemExit(f"workers={workers}, BLAS threads {threads} failed")
                run = json.loads(done.stdout.strip().splitlines()[-1]) | {"BLAS threads": threads}
                runs.append(run)
                print(f"workers {workers}, BLAS threads {threads}: {run['seconds']:.1f} s", flush=True)
    same = len({r["answers sha256"] for r in runs}) == 1
    best = {}
    for r in runs:
        key = (r["BLAS threads"], r["workers"])
        if key not in best or r["seconds"] < best[key]["seconds"]:
            best[key] = r
    first = runs[0]
    lines = ["# The local engine on one process and on every core", "",
             f"`python benchmarks/geography_workers.py --states {args.states} --postprocess {args.postprocess} "
             f"--repeat {args.repeat} --partition {args.partition}` (module docstring): PL94-171 from the nation "
             f"to the block, SYNTHETIC data, {first['units']:,} units in {first['partitions']} {args.partition} "
             f"partitions; {os.cpu_count()} cores; minimum of "
             f"{args.repeat} runs per setting, interleaved.", "",
             f"Every run gave the same answers (SHA-256 of all estimates): {'yes' if same else 'NO'}.", "",
             "| BLAS threads | workers | release s | steps (s) | speed-up over one worker |", "|---|---|---|---|---|"]
    for threads in ("1", "default"):
        for workers in (1, 2):
            r = best[(threads, workers)]
            steps = ", ".join(f"{k} {v:.1f}" for k, v in r["steps"].items())
            speed = best[(threads, 1)]["seconds"] / r["seconds"]
            lines.append(f"| {threads} | {workers} | {r['seconds']:.1f} | {steps} | {speed:.2f} |")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "geography_workers.json").write_text(json.dumps(runs, indent=1))
    (RESULTS / "geography_workers.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
