"""Noise benchmark: exact discrete samplers (hdmm.noise) against OpenDP's, and release time with secure noise.

Three parts, written to ``benchmarks/results/noise.md``:

1. Draws per second of :func:`hdmm.noise.discrete_laplace` and :func:`hdmm.noise.discrete_gaussian`
   per scale (in grid steps), with bits from ``os.urandom`` (the default) and from a seeded
   numpy stream, 10^6 draws per call.
2. OpenDP's samplers in the same process, if ``opendp`` is installed (the ``bench`` extra):
   ``make_laplace`` / ``make_gaussian`` on an int64 vector (exact discrete samplers) and on a
   float vector (OpenDP's exact float mechanisms, the ones issue 13 timed), on fewer draws.
3. SF1 Persons (1,000,000 people) and SF1 x 51 states (10,000,000 people): the seconds of one
   release (measure + reconstruct + answer) with secure noise, against the same release with
   the noise hdmm added before issue 13 (numpy's float ``Generator.laplace`` on a PCG64 stream,
   re-created here for the comparison), the strategy optimized once by OPT_(x) under PureDP(1).

Single-threaded BLAS (``OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1``, set below before numpy is
imported); every figure is the minimum over ``--repeats`` runs.

Run: ``python benchmarks/noise.py`` (``--quick`` skips SF1 x 51 states).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

import hdmm  # noqa: E402
from hdmm import noise  # noqa: E402
from hdmm.distributions import noise_named  # noqa: E402
from hdmm.kernel import check_data_vector  # noqa: E402
from hdmm.mechanism import Measurement  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "noise.md"
LAPLACE_SCALES = [1.0, 1e3, 1e6, 2.0**30, 2.0**40, 2.0**50]
GAUSSIAN_SCALES = [1.0, 1e3, 1e6, 2.0**30, 2.0**40, 2.0**50]


def best_of(repeats: int, call) -> float:
    """Minimum wall-clock seconds of ``call()`` over ``repeats`` runs."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times)


def scale_label(scale: float) -> str:
    exponent = float(np.log2(scale))
    if exponent < 10:
        return f"{scale:g}"
    return f"2^{int(exponent)}" if exponent == int(exponent) else f"{scale:.3g} (2^{exponent:.1f})"


def hdmm_samplers(repeats: int, draws: int = 1_000_000) -> list[dict]:
    rows = []
    for kind, scales in (("laplace", LAPLACE_SCALES), ("gaussian", GAUSSIAN_SCALES)):
        for scale in scales:
            noise.draw(noise_named(kind), scale, 10, rng=0)  # set-up (exact expansions), cached per scale
            row = {"sampler": f"hdmm discrete {kind}", "scale": scale}
            for source, rng in (("os.urandom", None), ("seeded", 0)):
                seconds = best_of(repeats, lambda: noise.draw(noise_named(kind), scale, draws, rng=rng))
                row[source] = draws / seconds
            rows.append(row)
    return rows


def opendp_samplers(repeats: int) -> tuple[list[dict], str]:
    try:
        import opendp.prelude as dp
        from importlib.metadata import version
    except ImportError:
        return [], "opendp is not installed (pip install '.[bench]'): its samplers were not timed"
    dp.enable_features("contrib")
    rows = []
    cases = [("i64", 1e3, 100_000), ("i64", 2.0**40, 100_000), ("f64", 1.0, 20_000)]
    for T, scale, n in cases:
        domain = dp.vector_domain(dp.atom_domain(T=T, nan=False) if T == "f64" else dp.atom_domain(T=T))
        data = [0.0] * n if T == "f64" else [0] * n
        for kind, make, metric in (("laplace", dp.m.make_laplace, dp.l1_distance(T=T)),
                                   ("gaussian", dp.m.make_gaussian, dp.l2_distance(T=T))):
            mechanism = make(domain, metric, scale=scale)
            seconds = best_of(repeats, lambda: mechanism(data))
            what = "integer vector (discrete)" if T == "i64" else "float vector"
            rows.append({"sampler": f"OpenDP make_{kind}, {what}", "scale": scale, "draws": n, "per s": n / seconds})
    return rows, f"opendp {version('opendp')}"


def old_measure(plan, x, seed: int) -> Measurement:
    """The noise hdmm added before issue 13: numpy's float Laplace on the float answers (for comparison only)."""
    A = plan.strategy
    x = check_data_vector(x, A.shape[1])
    answers = A @ x
    scale = plan.privacy.noise_scale(plan.sensitivity)
    noisy = answers + np.random.default_rng(seed).laplace(0.0, scale, A.shape[0])
    return Measurement(A, noisy, plan.privacy, plan.sensitivity, plan.noise_scale)


def releases(repeats: int, quick: bool) -> list[dict]:
    from census_workloads import cph_domain, sf1_persons, sf1_plus, synthetic_persons

    rows = []
    cases = [("SF1 Persons", 1_000_000, False)] + ([] if quick else [("SF1 x 51 states", 10_000_000, True)])
    privacy = hdmm.PureDP(1.0)
    for name, people, states in cases:
        W = sf1_plus() if states else sf1_persons()
        x = cph_domain(state=states).vectorize(synthetic_persons(people, seed=0, states=states))
        strategy = hdmm.optimize(W, privacy, seed=0, optimizers=["opt_kron"])
        plan = hdmm.plan(W, strategy, privacy)

        def release(measure) -> None:
            estimate = hdmm.reconstruct(plan, measure())
            plan.workload @ estimate

        row = {"case": name, "cells": W.shape[1], "measurements": plan.strategy.shape[0],
               "grid steps per noise scale": plan.noise_scale / plan.spacing}
        row["before: numpy float Laplace (s)"] = best_of(repeats, lambda: release(lambda: old_measure(plan, x, 0)))
        row["secure: os.urandom (s)"] = best_of(repeats, lambda: release(lambda: hdmm.measure(plan, x)))
        row["seeded (s)"] = best_of(repeats, lambda: release(lambda: hdmm.measure(plan, x, rng=0)))
        row["measure only, before (s)"] = best_of(repeats, lambda: old_measure(plan, x, 0))
        row["measure only, secure (s)"] = best_of(repeats, lambda: hdmm.measure(plan, x))
        rows.append(row)
    return rows


def markdown(hdmm_rows, opendp_rows, opendp_note, release_rows, repeats) -> str:
    lines = ["# Noise: exact discrete samplers and secure releases", "",
             f"`python benchmarks/noise.py` on {platform.machine()}, {os.cpu_count()} cores (shared), Python "
             f"{platform.python_version()}, numpy {np.__version__}, hdmm {hdmm.__version__}; OMP_NUM_THREADS="
             f"{os.environ['OMP_NUM_THREADS']}, OPENBLAS_NUM_THREADS={os.environ['OPENBLAS_NUM_THREADS']}; "
             f"minimum of {repeats} runs.", "",
             "## hdmm's samplers (10^6 draws per call)", "",
             "Scale in grid steps: `t` of the discrete Laplace, `sigma` of the discrete Gaussian. A release's scale is "
             "about rows x 2^30 / epsilon grid steps (at most 2^50).", "",
             "| sampler | scale | draws/s, os.urandom | draws/s, seeded numpy stream |", "|---|---:|---:|---:|"]
    for r in hdmm_rows:
        lines.append(f"| {r['sampler']} | {scale_label(r['scale'])} | {r['os.urandom']:,.0f} | {r['seeded']:,.0f} |")
    lines += ["", "## OpenDP's samplers, same process", ""]
    if opendp_rows:
        lines += [f"{opendp_note}; `make_laplace` / `make_gaussian` measurements on a vector of zeros.", "",
                  "| sampler | scale | draws | draws/s |", "|---|---:|---:|---:|"]
        for r in opendp_rows:
            lines.append(f"| {r['sampler']} | {scale_label(r['scale'])} | {r['draws']:,} | {r['per s']:,.0f} |")
        fastest = {kind: max(r["per s"] for r in opendp_rows if kind in r["sampler"]) for kind in ("laplace", "gaussian")}
        ours = {kind: min(r["os.urandom"] for r in hdmm_rows if kind in r["sampler"]) for kind in ("laplace", "gaussian")}
        lines += ["", "Slowest hdmm scale (os.urandom) against OpenDP's fastest case above: "
                  + ", ".join(f"{kind} {ours[kind] / fastest[kind]:.0f}x" for kind in ours) + "."]
    else:
        lines.append(opendp_note)
    lines += ["", "## Releases (PureDP(1), OPT_(x) strategy; measure + reconstruct + answer)", "",
              "| case | cells | measurements | grid steps per scale | before: numpy float Laplace (s) | secure: os.urandom (s) "
              "| seeded (s) | measure only, before (s) | measure only, secure (s) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in release_rows:
        lines.append(f"| {r['case']} | {r['cells']:,} | {r['measurements']:,} | {scale_label(r['grid steps per noise scale'])} "
                     f"| {r['before: numpy float Laplace (s)']:.3f} | {r['secure: os.urandom (s)']:.3f} "
                     f"| {r['seeded (s)']:.3f} | {r['measure only, before (s)']:.3f} "
                     f"| {r['measure only, secure (s)']:.3f} |")
    lines += ["", "Grid steps per scale = noise scale / grid spacing: about (rows) x 2^30 / epsilon, capped at 2^50 by "
              "a coarser grid (SF1 x 51 states), whose rounding bound is then added to the sensitivity explicitly."]
    if release_rows:
        added = ", ".join(f"{r['case']} +{r['secure: os.urandom (s)'] - r['before: numpy float Laplace (s)']:.2f} s"
                          for r in release_rows)
        lines += ["", f"Secure noise adds: {added} per release."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="skip SF1 x 51 states")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    hdmm_rows = hdmm_samplers(args.repeats)
    opendp_rows, note = opendp_samplers(args.repeats)
    release_rows = releases(args.repeats, args.quick)
    text = markdown(hdmm_rows, opendp_rows, note, release_rows, args.repeats)
    args.output.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
