"""Helpers shared by the cases. Every rank builds every rank's input from (rank, seed), so
each can compute the expected result with numpy and check its own output."""

import numpy as np

SIZES = [0, 1, 7, 1000]


def _inputs(dtype, n, world, salt=0):
    """Rank r's input: small values so PRODUCT and sums stay exact."""
    out = []
    for r in range(world):
        if dtype == np.bool_:
            a = (np.arange(n) + r + salt) % 3 == 0
        elif np.issubdtype(dtype, np.complexfloating):
            a = (np.arange(n) % 5 + r + 1) + 1j * (np.arange(n) % 3 - r)
        else:
            a = (np.arange(n) * (r + 1) + salt) % 4 + 1
        out.append(np.ascontiguousarray(a.astype(dtype)))
    return out


def _expected(op, dist, xs, dtype):
    stack = np.stack(xs) if xs[0].size else np.zeros((len(xs), 0), dtype=dtype)
    O = dist.ReduceOp
    if op == O.SUM:
        return np.any(stack, 0) if dtype == np.bool_ else stack.sum(0).astype(dtype)
    if op == O.AVG:
        wide = np.complex128 if np.issubdtype(dtype, np.complexfloating) else np.float64
        return (stack.astype(wide).mean(0)).astype(dtype)
    if op == O.PRODUCT:
        return np.all(stack, 0) if dtype == np.bool_ else stack.prod(0).astype(dtype)
    if op == O.MIN:
        return stack.min(0)
    if op == O.MAX:
        return stack.max(0)
    if op == O.BAND:
        return np.bitwise_and.reduce(stack, 0)
    if op == O.BOR:
        return np.bitwise_or.reduce(stack, 0)
    if op == O.BXOR:
        return np.bitwise_xor.reduce(stack, 0)
    raise AssertionError(op)


def _valid_ops(dist, dtype):
    O = dist.ReduceOp
    if dtype == np.bool_:
        return [O.SUM, O.PRODUCT, O.MIN, O.MAX, O.BAND, O.BOR, O.BXOR]
    if np.issubdtype(dtype, np.complexfloating):
        return [O.SUM, O.AVG]
    ops = [O.SUM, O.PRODUCT, O.MIN, O.MAX]
    if np.issubdtype(dtype, np.integer):
        ops += [O.BAND, O.BOR, O.BXOR]
    else:
        ops += [O.AVG]
    return ops


def _close(actual, expected, dtype, what):
    if np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.complexfloating):
        tol = 1e-2 if dtype == np.float16 else 1e-5
        np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol, err_msg=what)
    else:
        np.testing.assert_array_equal(actual, expected, err_msg=what)


DTYPES = [
    np.float32,
    np.float64,
    np.float16,
    np.int32,
    np.int64,
    np.uint8,
    np.int8,
    np.bool_,
    np.complex64,
]


def _raises(exc, fn, what, words=None):
    """fn() raises exc (with `words` in its message, when given)."""
    try:
        fn()
    except exc as e:
        assert words is None or words in str(e), f"{what}: {words!r} not in {e}"
        return
    except Exception as e:
        raise AssertionError(f"{what}: expected {exc.__name__}, got {type(e).__name__}: {e}") from e
    raise AssertionError(f"{what}: expected {exc.__name__}, nothing raised")
