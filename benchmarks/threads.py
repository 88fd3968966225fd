"""BLAS threads: hdmm's entry points at the machine's default threading against one thread, idle and loaded.

Run ``python benchmarks/threads.py [--repeats 3] [--only NAME,...] [--load 0,2]``; it writes
``benchmarks/results/threads.md`` (and ``threads.json``). Each case runs in fresh processes, with
``OPENBLAS_NUM_THREADS`` / ``OMP_NUM_THREADS`` unset (the default: one thread per core) and set to 1,
alternately, ``--repeats`` times each; the figure is the minimum over the repeats of the timed
call's wall and CPU seconds (imports and data set-up are not timed). ``--load K`` runs the cases
again beside ``K`` busy processes (each multiplying 400 x 400 matrices at one BLAS thread), the
"loaded machine" of a shared server or a notebook beside other work.

Cases:

* ``optimize SF1``: ``hdmm.optimize`` on SF1 Persons (``census_workloads.sf1_persons``) under zCDP,
  rho = 0.5;
* ``optimize 91 products``: the 91 two-way Prefix/Identity products on 14 attributes
  (``benchmarks/optimizers.py``) under pure DP, epsilon = 1;
* ``plan README``: ``hdmm.plan`` of the README's workload (ranges by sex, all 2-way marginals;
  4,600 cells) with the strategy ``hdmm.optimize`` found, pure DP, epsilon = 1;
* ``measure README``: ``hdmm.measure`` and ``hdmm.reconstruct`` of that plan on 5,000 synthetic records;
* ``geography DC``: a PL94-171 (2020 tables) release of the District of Columbia to the block
  group with the local engine on SYNTHETIC data (``benchmarks/census_production.py``'s setting):
  ``geo_plan`` and ``release_geography``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
HERE = Path(__file__).parent
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _readme_workload():
    import hdmm

    dom = hdmm.Domain.from_dict({"sex": ["male", "female"], "age": 115, "income": 20})
    return hdmm.union([hdmm.product(dom, {"sex": hdmm.Identity(2), "age": hdmm.AllRange(115)}),
                       hdmm.DimKMarginals(dom, 2)], weights=[1.0, 0.5]), dom


def _case(name: str):
    """``(set_up, timed)``: ``timed(set_up())`` is the call that is timed."""
    import hdmm

    if name == "optimize SF1":
        from census_workloads import sf1_persons

        return sf1_persons, lambda W: hdmm.optimize(W, hdmm.ZCDP(0.5), seed=0)
    if name == "optimize 91 products":
        sys.path.insert(0, str(HERE))
        from optimizers import _prefix_identity_pairs

        return _prefix_identity_pairs, lambda W: hdmm.optimize(W, hdmm.PureDP(1.0), seed=0)
    if name in ("plan README", "measure README"):
        def set_up():
            W, dom = _readme_workload()
            result = hdmm.optimize(W, hdmm.PureDP(1.0), seed=0)
            if name == "plan README":
                return W, result
            import numpy as np
            import pandas as pd

            rng = np.random.default_rng(7)
            records = pd.DataFrame({"sex": rng.choice(["male", "female"], 5000),
                                    "age": rng.integers(0, 115, 5000), "income": rng.integers(0, 20, 5000)})
            return hdmm.plan(W, result, hdmm.PureDP(1.0)), dom.vectorize(records)

        if name == "plan README":
            return set_up, lambda args: hdmm.plan(args[0], args[1], hdmm.PureDP(1.0))
        return set_up, lambda args: hdmm.reconstruct(args[0], hdmm.measure(args[0], args[1], rng=1))
    if name == "geography DC":
        sys.path.insert(0, str(HERE))

        def set_up():
            from census_production import setting

            return setting(("11",), ("state", "county", "tract", "block_group"))

        def timed(args):
            from hdmm.georelease import geo_plan, release_geography

            tree, source, W, strategy, privacy, _ = args
            plan = geo_plan(tree, W, privacy, strategy=strategy, partition="county", seed=0)
            return release_geography(plan, source, seed=1, workers=1)

        return set_up, timed
    raise SystemExit(f"unknown case {name!r}; choose from {CASES}")


CASES = ("optimize SF1", "optimize 91 products", "plan README", "measure README", "geography DC")


def child(name: str) -> dict:
    set_up, timed = _case(name)
    args = set_up()
    wall, cpu = time.perf_counter(), time.process_time()
    timed(args)
    return {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}


def _run(name: str, one_thread: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    if one_thread:
        env.update({k: "1" for k in THREAD_VARIABLES})
    done = subprocess.run([sys.executable, __file__, "--child", name], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-3000:])
        raise SystemExit(f"{name} failed")
    return json.loads(done.stdout.strip().splitlines()[-1])


_BUSY = ("import numpy as np\nfrom threadpoolctl import threadpool_limits\nthreadpool_limits(1)\n"
         "a = np.random.default_rng(0).random((400, 400))\nwhile True:\n    a = a @ a; a /= np.abs(a).max()\n")


def measure(names, repeats: int, load: int) -> list[dict]:
    busy = [subprocess.Popen([sys.executable, "-c", _BUSY]) for _ in range(load)]
    try:
        time.sleep(1.0 if load else 0.0)
        rows = []
        for name in names:
            runs = {True: [], False: []}
            for _ in range(repeats):
                for one in (False, True):
                    runs[one].append(_run(name, one))
            row = {"case": name, "load": load}
            for one, label in ((False, "default"), (True, "one thread")):
                row[f"{label} wall"] = min(r["wall"] for r in runs[one])
                row[f"{label} cpu"] = min(r["cpu"] for r in runs[one])
            row["ratio"] = row["default wall"] / row["one thread wall"]
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
        return rows
    finally:
        for p in busy:
            p.kill()


def report(rows: list[dict], cores: int) -> str:
    lines = ["# BLAS threads: default threading against one thread", "",
             f"`python benchmarks/threads.py` ({cores} cores). Minimum over the repeats of the timed call's wall and CPU "
             "seconds, each run a fresh process; *default* leaves the BLAS thread variables unset, *one thread* sets "
             "them to 1; *load* is the number of busy processes beside the run. A ratio at or below 1 means the "
             "default is at least as fast as one thread.", "",
             "| case | load | repeats | default wall s | default CPU s | one thread wall s | one thread CPU s | default / one |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['load']} | {r.get('repeats', '-')} | {r['default wall']:.3f} | "
                     f"{r['default cpu']:.3f} | {r['one thread wall']:.3f} | {r['one thread cpu']:.3f} | {r['ratio']:.2f} |")
    return "\n".join(lines + [""] + NOTES) + "\n"


#: What the table cannot say: the figures before the entry points limited their BLAS threads.
NOTES = [
    "Before `hdmm.threads.one_blas_thread` (2026-11-27, the machine loaded by other sessions' work, load",
    "average about 10 on 2 cores): `optimize` on SF1 Persons under zCDP took 105.7 s wall (45.4 CPU s) at the",
    "default two OpenBLAS threads against 4.4 s (0.88 CPU s) at one; after, 3.8 s (0.79 CPU s) at the default.",
    "The time went into the convex program's small eigendecompositions and triangular solves, each waiting for",
    "both BLAS threads to be scheduled. The rows above were taken on an otherwise idle machine (2026-11-28);",
    "ratios within a few percent of 1 are the machine's noise (the CPU seconds agree).",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", help="cases, separated by ','")
    parser.add_argument("--load", default="0,2", help="busy processes beside the runs, e.g. 0,2")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    names = args.only.split(",") if args.only else list(CASES)
    path = RESULTS / "threads.json"
    rows = json.loads(path.read_text()) if path.exists() else []  # a rerun replaces its cases' rows
    for load in (int(k) for k in args.load.split(",")):
        for row in measure(names, args.repeats, load):
            rows = [r for r in rows if (r["case"], r["load"]) != (row["case"], row["load"])] + [row]
            row["repeats"] = args.repeats
    rows.sort(key=lambda r: (r["load"], CASES.index(r["case"])))
    path.write_text(json.dumps(rows, indent=2))
    (RESULTS / "threads.md").write_text(report(rows, os.cpu_count() or 1))
    print((RESULTS / "threads.md").read_text())


if __name__ == "__main__":
    main()
