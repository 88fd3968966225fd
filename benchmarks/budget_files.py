"""Time per charge and per mark ("released") on a budget file of 1,000 to 100,000 charges.

Run: ``python benchmarks/budget_files.py`` (one BLAS thread does not matter here: no linear
algebra). The budget is built in memory and saved once; then a loaded budget charges and marks
``REPEAT`` times and the minimum and median per operation are printed, with the time to load.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

from hdmm.budget import Budget
from hdmm.privacy import PureDP

SIZES = (1_000, 10_000, 100_000)
REPEAT = 20


def main() -> None:
    print("| charges | file MB | load s | charge ms (min / median) | mark released ms (min / median) |")
    print("|---:|---:|---:|---:|---:|")
    for n in SIZES:
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "budget.json")
            b = Budget(PureDP(10.0 * n))
            for _ in range(n):
                b.charge(PureDP(1.0), workload="sf1")
            b.save(path)
            start = time.perf_counter()
            b = Budget.load(path, max_bytes=2**31)
            load = time.perf_counter() - start
            charge, mark = [], []
            for i in range(REPEAT):
                start = time.perf_counter()
                c = b.charge(PureDP(1.0), workload="sf1")
                charge.append(time.perf_counter() - start)
                start = time.perf_counter()
                b.settle(b.charges[i * (n // REPEAT)], output="out.csv")
                mark.append(time.perf_counter() - start)
            del c
            size = os.path.getsize(path) / 1e6
        print(f"| {n:,} | {size:.1f} | {load:.2f} | {1e3 * min(charge):.2f} / {1e3 * statistics.median(charge):.2f} | "
              f"{1e3 * min(mark):.2f} / {1e3 * statistics.median(mark):.2f} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
