"""One BLAS thread inside hdmm's entry points, set once however deeply the blocks nest."""

from __future__ import annotations

from threadpoolctl import threadpool_info, threadpool_limits

import hdmm.threads as threads


def blas_threads() -> list[int]:
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


def test_one_thread_inside_and_the_limits_restored_after(monkeypatch):
    calls = []
    real = threads.threadpool_limits

    def counted(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(threads, "threadpool_limits", counted)
    with threadpool_limits(limits=2, user_api="blas"):
        before = blas_threads()

        @threads.one_blas_thread
        def outer():
            inside = blas_threads()
            with threads.blas_one_thread():  # nested: no second call to threadpoolctl
                nested = blas_threads()
            return inside, nested, blas_threads()

        inside, nested, after_nested = outer()
        assert blas_threads() == before
    assert all(n == 1 for n in inside + nested + after_nested)
    assert len(calls) == 1
    with threads.blas_one_thread():  # the flag is reset once the outer block ends
        pass
    assert len(calls) == 2
