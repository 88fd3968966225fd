"""How many BLAS threads hdmm's own computations use.

hdmm's optimizers, bounds and error formulas work attribute by attribute: dense matrices of a few
to a few thousand rows, factorised and multiplied thousands of times. On such sizes a
multi-threaded BLAS spends more time waking and synchronising its threads than computing, and on a
loaded machine (more runnable threads than cores) every call waits until all its threads have been
scheduled, so a second thread can make a call many times slower instead of twice as fast. The
geography engines' per-unit work is made of the same small products.

So :func:`one_blas_thread` runs a computation with one BLAS thread (through ``threadpoolctl``,
restored afterwards), whatever the process's default; where parallelism pays it is coarse-grained
(the local geography engine's processes over partitions, Spark's executors). The entry points that
do this are ``optimize``, ``plan``, ``Plan.load``, ``measure``, ``svd_bound`` and the geography
release; ``benchmarks/threads.py`` times them at the machine's default threads and at one thread.

>>> import numpy as np
>>> from hdmm.threads import one_blas_thread
>>> @one_blas_thread
... def gram(a):
...     return a.T @ a
>>> float(gram(np.eye(3)).trace())
3.0
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from typing import TypeVar

from threadpoolctl import threadpool_limits

__all__ = ["one_blas_thread", "blas_one_thread"]

F = TypeVar("F", bound=Callable)

#: Whether the running code is inside :func:`blas_one_thread` already (the limit is process-wide).
_LIMITED: contextvars.ContextVar[bool] = contextvars.ContextVar("hdmm_one_blas_thread", default=False)


@contextlib.contextmanager
def blas_one_thread() -> Iterator[None]:
    """Run the block with one BLAS thread (the previous limits are restored when it ends).

    Inside another such block it does nothing: setting the limit asks ``threadpoolctl`` to find the
    loaded BLAS libraries again, about 2 ms a time, which inner loops (a p-Identity search per
    attribute inside ``optimize``) would pay again and again.
    """
    if _LIMITED.get():
        yield
        return
    token = _LIMITED.set(True)
    try:
        with threadpool_limits(limits=1, user_api="blas"):
            yield
    finally:
        _LIMITED.reset(token)


def one_blas_thread(fn: F) -> F:
    """``fn`` run with one BLAS thread (the previous limits are restored when it returns or raises)."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        with blas_one_thread():
            return fn(*args, **kwargs)

    return run  # type: ignore[return-value]
