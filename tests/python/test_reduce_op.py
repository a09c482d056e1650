"""ReduceOp's Python face (it should behave like torch.distributed.ReduceOp) and the reduction
kernels checked against numpy through the buffer-level helpers of c10d._C."""

import copy
import pickle
import zlib

import numpy as np
import pytest

import c10d
from c10d import ReduceOp
from c10d import _C

ALL_OPS = ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM", "UNUSED"]
INTS = ["int8", "int16", "int32", "int64", "uint8"]
FLOATS = ["float32", "float64", "float16", "bfloat16"]
COMPLEX = ["complex64", "complex128"]
ALL_DTYPES = FLOATS + INTS + ["bool"] + COMPLEX


def is_valid(dtype, op):
    if op == "SUM":
        return True
    if op == "AVG":
        return dtype != "bool"
    if op == "PREMUL_SUM":  # floating types only, as torch's NCCL
        return dtype in FLOATS or dtype in COMPLEX
    if op in ("PRODUCT", "MIN", "MAX"):
        return dtype not in COMPLEX
    if op in ("BAND", "BOR", "BXOR"):
        return dtype in INTS or dtype == "bool"
    return False


VALID = [(d, o) for d in ALL_DTYPES for o in ALL_OPS if is_valid(d, o)]
INVALID = [(d, o) for d in ALL_DTYPES for o in ALL_OPS if not is_valid(d, o)]


# --- ReduceOp ------------------------------------------------------------------------------


def test_numbering_matches_torch():
    for value, name in enumerate(ALL_OPS):
        kind = getattr(ReduceOp, name)
        assert isinstance(kind, ReduceOp.RedOpType)
        assert isinstance(kind, ReduceOp)  # as with torch's ReduceOp
        assert kind.value == value
        assert int(kind) == value
        assert getattr(ReduceOp.RedOpType, name) is kind
    assert list(ReduceOp.__members__) == ALL_OPS
    assert not isinstance(0, ReduceOp) and not isinstance("SUM", ReduceOp)


def test_construction_and_attributes():
    assert ReduceOp().op == ReduceOp.SUM
    assert ReduceOp(ReduceOp.MAX).op == ReduceOp.MAX
    assert ReduceOp(ReduceOp.MAX).name == "MAX"
    assert ReduceOp().premul_factor == 1.0
    premul = _C._make_premul_sum(0.5)
    assert premul.op == ReduceOp.PREMUL_SUM and premul.premul_factor == 0.5
    assert _C._make_nccl_premul_sum(2.0).premul_factor == 2.0
    assert c10d.ReduceOp is ReduceOp


def test_equality_both_directions():
    assert ReduceOp.SUM == ReduceOp(ReduceOp.SUM)
    assert ReduceOp(ReduceOp.SUM) == ReduceOp.SUM
    assert ReduceOp(ReduceOp.SUM) == ReduceOp()
    assert ReduceOp.SUM == ReduceOp.SUM
    assert ReduceOp.SUM != ReduceOp.MAX
    assert ReduceOp.MIN != ReduceOp(ReduceOp.MAX)
    assert ReduceOp(ReduceOp.MIN) != ReduceOp.MAX
    assert not (ReduceOp(ReduceOp.MIN) != ReduceOp.MIN)
    # Like torch: the premul factor is not part of equality.
    assert _C._make_premul_sum(1.0) == _C._make_premul_sum(3.0) == ReduceOp.PREMUL_SUM
    # Unrelated objects are simply unequal.
    assert ReduceOp() != "SUM"
    assert ReduceOp.SUM != "SUM"
    assert ReduceOp() != None  # noqa: E711


def test_hash_usable_as_dict_key():
    table = {ReduceOp(ReduceOp.MIN): "min", ReduceOp.MAX: "max"}
    assert table[ReduceOp.MIN] == "min"
    assert table[ReduceOp(ReduceOp.MAX)] == "max"
    assert hash(ReduceOp()) == hash(ReduceOp.SUM)
    assert len({ReduceOp(), ReduceOp(ReduceOp.SUM), ReduceOp.SUM}) == 1


def test_copy_deepcopy_pickle_keep_factor():
    premul = _C._make_premul_sum(0.125)
    for clone in (
        copy.copy(premul),
        copy.deepcopy(premul),
        pickle.loads(pickle.dumps(premul)),
        pickle.loads(pickle.dumps(premul, protocol=pickle.HIGHEST_PROTOCOL)),
    ):
        assert clone is not premul
        assert clone == ReduceOp.PREMUL_SUM
        assert clone.premul_factor == 0.125
    # A bare PREMUL_SUM stays without a factor through pickling (collectives refuse it).
    import c10d as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        bare = pickle.loads(pickle.dumps(ReduceOp(ReduceOp.PREMUL_SUM)))
        with pytest.raises(ValueError, match="needs its factor"):
            dist.all_reduce(np.ones(2), op=bare)
        x = np.ones(2)
        dist.all_reduce(x, op=pickle.loads(pickle.dumps(_C._make_premul_sum(3.0))))
        assert (x == 3).all(), x
    finally:
        dist.destroy_process_group()
    for name in ALL_OPS:
        op = ReduceOp(getattr(ReduceOp, name))
        assert pickle.loads(pickle.dumps(op)) == op
        kind = getattr(ReduceOp, name)
        assert pickle.loads(pickle.dumps(kind)) == kind
    nested = copy.deepcopy({"ops": [ReduceOp(ReduceOp.BXOR), premul]})
    assert nested["ops"][0] == ReduceOp.BXOR and nested["ops"][1].premul_factor == 0.125


def test_repr():
    assert repr(ReduceOp()) == "ReduceOp(SUM)"
    assert repr(ReduceOp(ReduceOp.BAND)) == "ReduceOp(BAND)"
    assert repr(_C._make_premul_sum(0.5)) == "ReduceOp(PREMUL_SUM, factor=0.5)"
    assert "SUM" in repr(ReduceOp.SUM)


@pytest.mark.parametrize("dtype,op", INVALID)
def test_invalid_pairs_raise_value_error(dtype, op):
    message = f"ReduceOp {op} is not supported for {dtype}"
    with pytest.raises(ValueError, match=message):
        _C._check_reduce_op(getattr(ReduceOp, op), dtype)
    dst, src = make_pair(dtype, 3, np.random.default_rng(0))
    with pytest.raises(ValueError, match=message):
        _C._reduce_buffers(dst, src, getattr(ReduceOp, op), dtype)


# --- kernels against numpy -----------------------------------------------------------------


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(values):
    """Round float32 to bfloat16 (nearest, ties to even) in integer arithmetic."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    rounded = rounded.astype(np.uint16)
    nan = np.isnan(values)
    rounded[nan] = 0x7FC0
    return rounded


def make_pair(dtype, n, rng):
    """Two arrays of `dtype` (bfloat16 as uint16 bit patterns) with values that exercise the
    ops: full-range integers (wrapping), mixed-sign floats, random finite halves."""

    def one():
        if dtype in INTS:
            info = np.iinfo(dtype)
            return rng.integers(info.min, info.max, size=n, dtype=dtype, endpoint=True)
        if dtype == "bool":
            return rng.integers(0, 2, size=n).astype(np.bool_)
        if dtype in ("float32", "float64"):
            return rng.uniform(-100, 100, size=n).astype(dtype)
        if dtype == "float16":
            bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
            bits[(bits & 0x7C00) == 0x7C00] &= 0xBFFF  # finite only
            return bits.view(np.float16)
        if dtype == "bfloat16":
            signs_mantissas = rng.integers(0, 1 << 16, size=n, dtype=np.uint16) & 0x807F
            exponents = (0x78 + rng.integers(0, 16, size=n, dtype=np.uint16)) << 7
            return (signs_mantissas | exponents).astype(np.uint16)
        if dtype in COMPLEX:
            real = rng.uniform(-100, 100, size=(n, 2))
            return (real[:, 0] + 1j * real[:, 1]).astype(dtype)
        raise AssertionError(dtype)

    return one(), one()


NUMPY_OPS = {
    "SUM": np.add,
    "AVG": np.add,
    "PREMUL_SUM": np.add,
    "PRODUCT": np.multiply,
    "MIN": np.minimum,
    "MAX": np.maximum,
    "BAND": np.bitwise_and,
    "BOR": np.bitwise_or,
    "BXOR": np.bitwise_xor,
}
BOOL_OPS = {
    "SUM": np.logical_or,
    "MAX": np.logical_or,
    "BOR": np.logical_or,
    "PRODUCT": np.logical_and,
    "MIN": np.logical_and,
    "BAND": np.logical_and,
    "BXOR": np.logical_xor,
}


def reference(dtype, op, a, b):
    with np.errstate(over="ignore", invalid="ignore"):
        return _reference(dtype, op, a, b)


def _reference(dtype, op, a, b):
    if dtype == "bool":
        return BOOL_OPS[op](a, b)
    if dtype == "bfloat16":
        return f32_to_bf16(NUMPY_OPS[op](bf16_to_f32(a), bf16_to_f32(b)))
    if dtype == "float16":
        # numpy's float16 arithmetic: float32 compute, one rounding to nearest-even.
        return NUMPY_OPS[op](a.astype(np.float32), b.astype(np.float32)).astype(np.float16)
    return NUMPY_OPS[op](a, b)


def assert_same(dtype, got, want):
    if dtype == "bfloat16":
        got, want = bf16_to_f32(got), bf16_to_f32(want)
    if dtype in FLOATS:
        np.testing.assert_array_equal(got, want)  # NaNs in the same places count as equal
    else:
        assert np.array_equal(got, want), (got, want)


@pytest.mark.parametrize("n", [0, 1, 7, 33, 1031])
@pytest.mark.parametrize("dtype,op", VALID)
def test_every_valid_pair_matches_numpy(dtype, op, n):
    rng = np.random.default_rng(zlib.crc32(f"{dtype}/{op}/{n}".encode()))
    a, b = make_pair(dtype, n, rng)
    want = reference(dtype, op, a, b)
    dst = a.copy()
    _C._reduce_buffers(dst, b, getattr(ReduceOp, op), dtype)
    assert_same(dtype, dst, want)
    # The ReduceOp object and a premul factor are accepted too (PREMUL_SUM combines like SUM).
    dst = a.copy()
    as_object = _C._make_premul_sum(7.0) if op == "PREMUL_SUM" else ReduceOp(getattr(ReduceOp, op))
    _C._reduce_buffers(dst, b, as_object, dtype)
    assert_same(dtype, dst, want)


def test_unaligned_views():
    rng = np.random.default_rng(3)
    raw_a = np.zeros(4 * 1000 + 1, dtype=np.uint8)
    raw_b = np.zeros(4 * 1000 + 3, dtype=np.uint8)
    a = raw_a[1:].view(np.float32)
    b = raw_b[3:].view(np.float32)
    a[:] = rng.uniform(-1, 1, 1000)
    b[:] = rng.uniform(-1, 1, 1000)
    want = a + b
    _C._reduce_buffers(a, b, ReduceOp.SUM, "float32")
    np.testing.assert_array_equal(a, want)


def test_half_precision_rounding():
    a = np.array([1.0, 1.0 + 2**-10, 65504.0, 2048.0], dtype=np.float16)
    b = np.array([2**-11, 2**-11, 65504.0, 1.0], dtype=np.float16)
    with np.errstate(over="ignore"):
        want = (a.astype(np.float32) + b.astype(np.float32)).astype(np.float16)
    _C._reduce_buffers(a, b, ReduceOp.SUM, "float16")
    np.testing.assert_array_equal(a, want)
    assert a[0] == 1.0 and a[1] == 1.0 + 2**-9 and np.isinf(a[2]) and a[3] == 2048.0

    bf = f32_to_bf16(np.array([1.0, 1.0 + 2**-7], dtype=np.float32))
    inc = f32_to_bf16(np.array([2**-8, 2**-8], dtype=np.float32))
    _C._reduce_buffers(bf, inc, ReduceOp.SUM, "bfloat16")
    np.testing.assert_array_equal(bf16_to_f32(bf), np.array([1.0, 1.0 + 2**-6], dtype=np.float32))


def test_nan_propagates_through_min_max():
    a = np.array([np.nan, 1.0, 2.0], dtype=np.float32)
    b = np.array([1.0, np.nan, 1.0], dtype=np.float32)
    for op, ref in (("MIN", np.minimum), ("MAX", np.maximum)):
        dst = a.copy()
        _C._reduce_buffers(dst, b, getattr(ReduceOp, op), "float32")
        np.testing.assert_array_equal(dst, ref(a, b))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("n", [3, 64, 1001])  # scalar tails and vector bodies
def test_min_max_order_signed_zeros_whatever_the_operand_order(dtype, n):
    """-0 < +0 for MIN and MAX, so every rank order (and backend) gives the same bits."""
    zeros = np.resize(np.array([-0.0, 0.0, -0.0], dtype=dtype), n)
    other = np.resize(np.array([0.0, -0.0, -0.0], dtype=dtype), n)
    for op, want_negative in (
        ("MIN", np.signbit(zeros) | np.signbit(other)),
        ("MAX", np.signbit(zeros) & np.signbit(other)),
    ):
        for a, b in ((zeros, other), (other, zeros)):
            dst = a.copy()
            _C._reduce_buffers(dst, b, getattr(ReduceOp, op), dtype)
            assert (dst == 0).all()
            np.testing.assert_array_equal(np.signbit(dst), want_negative, err_msg=f"{op} {n}")


# --- pre- and post-steps -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "complex64", "complex128"])
def test_scale_floating(dtype):
    rng = np.random.default_rng(5)
    a, _ = make_pair(dtype, 101, rng)
    if dtype in ("float64", "complex128"):
        want = a * 0.3
    else:
        compute = np.complex64 if dtype == "complex64" else np.float32
        want = (a.astype(compute) * np.float32(0.3)).astype(dtype)
    _C._scale_buffer(a, 0.3, dtype)
    np.testing.assert_array_equal(a, want)


def test_scale_bfloat16():
    a, _ = make_pair("bfloat16", 101, np.random.default_rng(6))
    want = f32_to_bf16(bf16_to_f32(a) * np.float32(0.3))
    _C._scale_buffer(a, 0.3, "bfloat16")
    np.testing.assert_array_equal(a, want)


def test_scale_integers():
    a = np.array([1, -7, 100, -100], dtype=np.int8)
    _C._scale_buffer(a, 3, "int8")  # integral factor: exact and wrapping
    np.testing.assert_array_equal(a, np.array([3, -21, 44, -44], dtype=np.int8))
    b = np.array([5, -5, 100, -100], dtype=np.int8)
    _C._scale_buffer(b, 2.5, "int8")  # truncates toward zero, saturates
    np.testing.assert_array_equal(b, np.array([12, -12, 127, -128], dtype=np.int8))
    with pytest.raises(ValueError, match="bool"):
        _C._scale_buffer(np.ones(3, dtype=np.bool_), 2.0, "bool")


@pytest.mark.parametrize("world_size", [1, 2, 3, 8, 12])
@pytest.mark.parametrize("dtype", FLOATS + INTS + COMPLEX)
def test_finalize_avg(dtype, world_size):
    a, _ = make_pair(dtype, 257, np.random.default_rng(world_size))
    if dtype in INTS:
        want = np.array(
            [(abs(int(x)) // world_size) * (1 if x >= 0 else -1) for x in a], dtype=dtype
        )
    elif dtype == "bfloat16":
        want = f32_to_bf16(bf16_to_f32(a) / np.float32(world_size))
    elif dtype in ("float16", "float32"):
        want = (a.astype(np.float32) / np.float32(world_size)).astype(dtype)
    elif dtype == "complex64":
        want = (a.view(np.float32) / np.float32(world_size)).view(np.complex64)
    else:
        want = (a.view(np.float64) / world_size).view(a.dtype)
    _C._finalize_avg_buffer(a, world_size, dtype)
    if dtype == "bfloat16":
        np.testing.assert_array_equal(bf16_to_f32(a), bf16_to_f32(want))
    else:
        np.testing.assert_array_equal(a, want)


def test_finalize_avg_rejects_bool_and_bad_world_size():
    with pytest.raises(ValueError, match="AVG is not supported for bool"):
        _C._finalize_avg_buffer(np.ones(3, dtype=np.bool_), 2, "bool")
    with pytest.raises(ValueError, match="world_size"):
        _C._finalize_avg_buffer(np.ones(3, dtype=np.float32), 0, "float32")


# --- argument checking of the helpers ------------------------------------------------------


def test_helper_argument_errors():
    a = np.zeros(8, dtype=np.float32)
    with pytest.raises(ValueError, match="unknown dtype"):
        _C._reduce_buffers(a, a.copy(), ReduceOp.SUM, "float7")
    with pytest.raises(ValueError, match="item size"):
        _C._reduce_buffers(a, a.copy(), ReduceOp.SUM, "float64")
    with pytest.raises(ValueError, match="elements"):
        _C._reduce_buffers(a, np.zeros(4, dtype=np.float32), ReduceOp.SUM, "float32")
    with pytest.raises(ValueError, match="not contiguous"):
        _C._reduce_buffers(np.zeros(16, dtype=np.float32)[::2], a, ReduceOp.SUM, "float32")
    readonly = np.zeros(8, dtype=np.float32)
    readonly.setflags(write=False)
    with pytest.raises((BufferError, ValueError, TypeError)):
        _C._reduce_buffers(readonly, a, ReduceOp.SUM, "float32")
    # A read-only source is fine.
    dst = np.ones(8, dtype=np.float32)
    _C._reduce_buffers(dst, readonly, ReduceOp.SUM, "float32")
    np.testing.assert_array_equal(dst, np.ones(8, dtype=np.float32))
    # Multi-dimensional contiguous arrays are flat buffers.
    m = np.ones((3, 4), dtype=np.int32)
    _C._reduce_buffers(m, np.full((3, 4), 2, dtype=np.int32), ReduceOp.PRODUCT, "int32")
    np.testing.assert_array_equal(m, np.full((3, 4), 2, dtype=np.int32))
