"""Plan speed and per-query variances at any size (issue 25, items 6 and 7).

Cases, each in a fresh process (so peak memory is its own), at one BLAS thread unless
``--threads`` says otherwise:

* ``readme``: the README's Python example (sex x age x income, 4,600 cells, 15,910 queries, pure DP
  epsilon = 1): ``hdmm.plan(W, result, privacy)`` from the optimized result, ``hdmm.plan(W, "auto",
  privacy)`` (optimization included), ``Plan.save`` and ``Plan.load``; the minimum of ``--repeats``.
* ``billion``: ``Prefix(1024)^3`` (1,073,741,824 queries) under OPT_(x)'s Kronecker strategy, zCDP
  rho = 0.5: ``variance_summary`` (largest variance and which query, from the factors) and one
  pass over every variance with ``query_variance_blocks`` (blocks of 2^20), with the peak memory.
* ``adult``: the Adult prefix-marginals workload (14 attributes, the first five Prefix, every
  0-3-way marginal: 21,043,262 queries) under OPT_+'s strategy, zCDP rho = 0.5:
  ``per_query_variance``, ``variance_summary`` and ``rmse``. OPT_+ runs once (minutes) and its
  strategy is kept in ``--adult-strategy``.

Run: ``python benchmarks/plan_speed.py [readme billion adult]``; with ``PYTHONPATH`` pointing at
another checkout it times that one (the cases a checkout cannot run say why).
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp
import os
import resource
import tempfile
import time
import tracemalloc


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _traced(fn) -> float:
    """Peak memory (MiB) traced while ``fn`` runs, numpy's arrays included (untimed: tracing slows Python)."""
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return peak


def _readme(repeats: int, out: dict) -> None:
    import hdmm

    dom = hdmm.Domain.from_dict({"sex": ["male", "female"], "age": 115, "income": 20})
    W = hdmm.union([hdmm.product(dom, {"sex": hdmm.Identity(2), "age": hdmm.AllRange(115)}),
                    hdmm.DimKMarginals(dom, 2)], weights=[1.0, 0.5])
    privacy = hdmm.PureDP(epsilon=1.0)
    result = hdmm.optimize(W, privacy, seed=0)
    out["optimizer"] = result.optimizer
    out["plan(W, result) s"] = _best(lambda: hdmm.plan(W, result, privacy), repeats)
    out["plan(W, 'auto') s"] = _best(lambda: hdmm.plan(W, "auto", privacy, seed=0), repeats)
    plan = hdmm.plan(W, result, privacy)
    out["RMSE"] = plan.rmse
    out["exact"] = plan.variance_exact
    path = os.path.join(tempfile.mkdtemp(), "plan.npz")
    out["save s"] = _best(lambda: plan.save(path), repeats)
    out["load s"] = _best(lambda: hdmm.planning.Plan.load(path), repeats)


def _billion(repeats: int, out: dict) -> None:
    import numpy as np

    import hdmm
    from hdmm.matrix import Kronecker
    from hdmm.optimizers import opt_kron

    W = Kronecker([hdmm.Prefix(1024)] * 3)
    privacy = hdmm.ZCDP(0.5)
    A = opt_kron(W, privacy, seed=0)
    out["queries"] = W.shape[0]
    out["RMSE"] = float(hdmm.rmse(W, A, privacy))
    try:
        from hdmm.query_variances import query_variance_blocks, variance_summary
    except ImportError:
        out["note"] = "no hdmm.query_variances; per_query_variance would hold 1.07e9 floats (8.6 GB)"
        return
    summary = None

    def summarize():
        nonlocal summary
        summary = variance_summary(W, A, privacy)

    out["summary s"] = _best(summarize, repeats)
    out["max variance"] = summary.max
    out["argmax"] = summary.label

    def stream():
        top, total = 0.0, 0.0
        for _, values in query_variance_blocks(W, A, privacy):
            top, total = max(top, float(values.max())), total + float(np.sum(values))
        out["streamed max"], out["streamed RMSE"] = top, (total / W.shape[0]) ** 0.5

    out["stream s"] = _best(stream, 1)
    out["traced peak MB, summary + stream"] = _traced(lambda: (summarize(), stream()))


def adult_workload():
    import hdmm

    sizes = [100, 100, 100, 99, 85, 42, 16, 15, 9, 7, 6, 5, 2, 2]
    names = [f"a{i}" for i in range(14)]
    dom = hdmm.Domain(names, sizes)
    parts = [hdmm.product(dom, {names[i]: (hdmm.Prefix(sizes[i]) if i < 5 else hdmm.Identity(sizes[i])) for i in S})
             for k in range(4) for S in itertools.combinations(range(14), k)]
    return hdmm.union(parts)


def _adult(repeats: int, out: dict, path: str) -> None:
    import numpy as np

    import hdmm

    W = adult_workload()
    privacy = hdmm.ZCDP(0.5)
    if not os.path.exists(path):
        result = hdmm.optimize(W, privacy, optimizers=["opt_union"], seed=0)
        hdmm.io.save_strategy(result, path)
    A, _ = hdmm.io.load_strategy(path)
    out["queries"] = W.shape[0]
    try:
        out["rmse s"] = _best(lambda: hdmm.rmse(W, A, privacy), repeats)
        out["RMSE"] = float(hdmm.rmse(W, A, privacy))
        variances = None

        def every():
            nonlocal variances
            variances = hdmm.error.per_query_variance(W, A, privacy)

        out["per_query_variance s"] = _best(every, repeats)
        out["max variance"] = float(np.max(variances))
        del variances
        out["traced peak MB, per_query_variance"] = _traced(every)
        variances = None
    except Exception as exc:  # the checkout before this work refuses: say how
        out["note"] = f"{type(exc).__name__}: {str(exc)[:120]}"
    plan = None

    def make():
        nonlocal plan
        plan = hdmm.plan(W, A, privacy)

    out["plan s"] = _best(make, 1)
    out["plan RMSE"], out["plan exact"] = plan.rmse, plan.variance_exact
    path = os.path.join(tempfile.mkdtemp(), "adult_plan.npz")
    plan.save(path)
    del plan
    out["load s"] = _best(lambda: hdmm.planning.Plan.load(path), 1)
    os.remove(path)
    try:
        from hdmm.query_variances import variance_summary
    except ImportError:
        return
    out["summary s"] = _best(lambda: variance_summary(W, A, privacy), repeats)
    out["traced peak MB, summary"] = _traced(lambda: variance_summary(W, A, privacy))


def _run(case: str, repeats: int, queue: mp.Queue, adult_path: str) -> None:
    out: dict = {"case": case}
    {"readme": lambda: _readme(repeats, out), "billion": lambda: _billion(repeats, out),
     "adult": lambda: _adult(repeats, out, adult_path)}[case]()
    out["peak MB"] = _peak_mb()
    queue.put(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", default=["readme", "billion", "adult"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads (0: the default)")
    parser.add_argument("--adult-strategy", default=os.path.join(tempfile.gettempdir(),
                                                                 "hdmm_adult_prefix_marginals_opt_union.npz"))
    args = parser.parse_args()
    if args.threads:
        for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[name] = str(args.threads)
    ctx = mp.get_context("spawn")
    for case in args.cases:
        queue = ctx.Queue()
        proc = ctx.Process(target=_run, args=(case, args.repeats, queue, args.adult_strategy))
        proc.start()
        out = queue.get()
        proc.join()
        print(" | ".join(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}" for k, v in out.items()), flush=True)


if __name__ == "__main__":
    main()
