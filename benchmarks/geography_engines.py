"""The same geography release on the three engines: local (two worker processes), Spark ``local[2]``, and a
standalone Spark cluster on this machine (a master and two one-core workers, started here from the pyspark
package).

Run ``python benchmarks/geography_engines.py [--states all] [--levels state,county,tract] [--engines
local,spark,cluster] [--scale 1] [--name geography_engines]``; it writes ``benchmarks/results/<name>.md`` (and ``.json``).
Each engine runs in its own process (a child of this script, which starts the cluster's JVMs itself, so the
peak memory sums every process of the run: the driver, local workers, Spark's JVMs and Python workers, the
cluster's master, workers and executors). The release: PL94-171 (2020 tables, 2,016 cells) on SYNTHETIC
data at production's budget with the state totals held (the setting of ``census_production.py``), least
squares unless ``--postprocess`` says otherwise, on the release's default partitions (``--partition LEVEL``:
one partition per unit of that level), written to a new directory as it goes, one BLAS thread.
Reported: the release's wall time, each step's seconds and units per second (the tree's units over the
step's seconds: every step handles every unit once), peak memory over all processes, and whether the
answers equal the local engine's (the same seed gives the same release on every engine).

With ``--child ENGINE``, one release in this process, printing one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

RESULTS = Path(__file__).parent / "results"
sys.path.insert(0, str(Path(__file__).parent))


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """A standalone master and two one-core workers (``memory`` each) on localhost, stopped on exit."""

    def __init__(self, root: Path, memory: str = "9g") -> None:
        import pyspark

        self.home = os.path.dirname(pyspark.__file__)
        self.root, self.memory, self.processes = root, memory, []

    def _start(self, *args: str, log: str) -> None:
        env = {**os.environ, "SPARK_HOME": self.home, "SPARK_LOCAL_IP": "127.0.0.1"}
        with open(self.root / log, "w") as out:
            self.processes.append(subprocess.Popen([os.path.join(self.home, "bin", "spark-class"), *args],
                                                   stdout=out, stderr=subprocess.STDOUT, env=env,
                                                   start_new_session=True))

    def __enter__(self) -> str:
        port, ui = _port(), _port()
        self._start("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                    "--webui-port", str(ui), log="master.log")
        master = f"spark://127.0.0.1:{port}"
        for k in (1, 2):
            (self.root / f"worker{k}").mkdir()
            self._start("org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1", "--memory",
                        self.memory, "--work-dir", str(self.root / f"worker{k}"), "--webui-port", "0", master,
                        log=f"worker{k}.log")
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as response:
                    if sum(w["state"] == "ALIVE" for w in json.load(response)["workers"]) == 2:
                        return master
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError("the standalone cluster did not start")

    def __exit__(self, *exc) -> None:
        for p in self.processes:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in self.processes:
            p.wait(timeout=60)


def child(engine: str, states, levels: tuple[str, ...], output: str, scale: float = 1.0,
          postprocess: str | None = None, heap: str = "4g", partition: str | None = None) -> dict:
    import hashlib

    import numpy as np

    from census_production import setting
    from geography import PeakMemory
    from hdmm.georelease import geo_plan, release_geography

    out: dict = {"engine": engine if engine == "local" else f"{engine} ({heap} JVM heap)",
                 "postprocess": postprocess or "least squares"}
    with PeakMemory() as memory:
        tree, source, W, strategy, privacy, _ = setting(states, levels)
        if scale != 1.0:  # the same tree and shares, with a fraction of the people
            from census_workloads.geography import SyntheticHistograms
            from census_workloads.pl94_2020 import PL94Histograms

            people = int(round(scale * source.leaf_totals().sum()))
            source = PL94Histograms(SyntheticHistograms(people, levels=levels, states=states, seed=1))
        totals = source.leaf_totals()
        b = tree.leaf_bounds("state")
        held = {"state": {code: float(totals[b[s]:b[s + 1]].sum()) for s, code in enumerate(tree.codes("state"))}}
        plan = geo_plan(tree, W, privacy, strategy=strategy, invariants=held, partition=partition, seed=0)
        out.update(units=int(sum(tree.sizes)), privacy=plan.privacy.description, people=int(totals.sum()))
        root = Path(tempfile.mkdtemp(prefix="hdmm-engines-"))
        options: dict = {}
        start = time.perf_counter()
        try:
            if engine == "local":
                options["workers"] = 2
            else:
                from hdmm.georelease.session import spark_session

                cluster = Cluster(root) if engine == "cluster" else None
                master = cluster.__enter__() if cluster is not None else "local[2]"
                if cluster is not None:  # each executor (one per worker) gets the heap the driver gets
                    os.environ["PYSPARK_SUBMIT_ARGS"] = f"--conf spark.executor.memory={heap} pyspark-shell"
                options["spark"] = spark_session(master, memory=heap)
            out["start seconds"] = time.perf_counter() - start
            start = time.perf_counter()
            release = release_geography(plan, source, engine="local" if engine == "local" else "spark", seed=1,
                                        postprocess=postprocess, output=output,
                                        progress=lambda line: print(line, file=sys.stderr, flush=True), **options)
            out["release seconds"] = time.perf_counter() - start
            out["steps"] = dict(release.timings)
            parts = release.provenance()["partitions"]
            out["partitions"] = parts["count"]
            out["partition level"] = parts["level"] + (" (ranges of siblings)" if parts["ranges_of_siblings"] else "")
            digest = hashlib.sha256()
            for d in plan.levels:
                digest.update(np.ascontiguousarray(release.answers(d)).tobytes())
            out["answers sha256"] = digest.hexdigest()
            if engine != "local":
                options["spark"].stop()
        finally:
            if engine == "cluster":
                cluster.__exit__(None, None, None)
            shutil.rmtree(root, ignore_errors=True)
    out["peak memory GB"] = memory.peak / 1e9
    out["peak memory by process GB"] = {k: v / 1e9 for k, v in memory.parts.items()}
    return out


def _report(results: list[dict], command: str) -> str:
    first = results[0]
    lines = ["# One geography release on three engines: local, Spark local[2], a standalone cluster", "",
             f"`{command}` (one BLAS thread; each engine in its own process, peak memory summed over every "
             "process of the run, sampled every 0.5 s). PL94-171 on SYNTHETIC data, "
             f"{first['units']:,} units ({first['partitions']:,} partitions: "
             f"{first.get('partition level', 'county')}), {first['people']:,} people, "
             f"{first['privacy']}, state totals held, {first['postprocess']}, written as it goes.", "",
             "| engine | release | peak memory | steps: seconds (units/s) | same answers as local |",
             "|---|---|---|---|---|"]
    for r in results:
        steps = ", ".join(f"{k} {v:.0f} s ({r['units'] / v:,.0f}/s)" for k, v in r["steps"].items()
                          if k != "checks" and v > 0)
        same = "yes" if r["answers sha256"] == first["answers sha256"] else "NO"
        lines.append(f"| {r['engine']} | {r['release seconds']:.0f} s | {r['peak memory GB']:.2f} GB | {steps} | "
                     f"{same} |")
    lines += ["", "Peak memory by kind of process (GB): " + "; ".join(
        f"{r['engine']} " + ", ".join(f"{k} {v:.2f}" for k, v in r["peak memory by process GB"].items())
        for r in results), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", default="all", help="FIPS codes separated by ',' or 'all'")
    parser.add_argument("--levels", default="state,county,tract")
    parser.add_argument("--engines", default="local,spark,cluster")
    parser.add_argument("--name", default="geography_engines")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="the share of the 2010 population drawn (default 1: every person)")
    parser.add_argument("--postprocess", default="none", choices=["none", "nonnegative", "integer"])
    parser.add_argument("--spark-memory", default="4g",
                        help="the JVM heap of Spark's driver (local mode: also the executors) and of each executor")
    parser.add_argument("--partition", help="one partition per unit of this level (default: the release's choice)")
    parser.add_argument("--previous", help="a JSON file of earlier runs' results (this script's) to report first")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    args = parser.parse_args()
    states = None if args.states == "all" else tuple(args.states.split(","))
    levels = tuple(args.levels.split(","))
    if args.child:
        postprocess = None if args.postprocess == "none" else args.postprocess
        print(json.dumps(child(args.child, states, levels, args.output, args.scale, postprocess, args.spark_memory,
                               args.partition)))
        return
    results = [] if args.previous is None else json.loads(Path(args.previous).read_text())
    for engine in args.engines.split(","):
        output = tempfile.mkdtemp(prefix="hdmm-engines-out-") + "/release"
        cmd = [sys.executable, __file__, "--child", engine, "--states", args.states, "--levels", args.levels,
               "--output", output, "--scale", str(args.scale), "--postprocess", args.postprocess,
               "--spark-memory", args.spark_memory] + ([] if args.partition is None else ["--partition", args.partition])
        done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        shutil.rmtree(os.path.dirname(output), ignore_errors=True)
        if done.returncode != 0:
            raise SystemExit(f"{engine} failed")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), file=sys.stderr)
    command = "python benchmarks/geography_engines.py " + " ".join(sys.argv[1:])
    (RESULTS / f"{args.name}.json").write_text(json.dumps(results, indent=1))
    (RESULTS / f"{args.name}.md").write_text(_report(results, command.strip()))


if __name__ == "__main__":
    main()
