"""Tensor interop, Future/Work, errors and the debug level, through the Python API."""

import pickle
import threading

import numpy as np
import pytest

import c10d
from c10d import _C


def test_numpy_zero_copy_and_info():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    info = _C._tensor_info(a)
    assert info["dtype"] == "float32"
    assert info["sizes"] == [3, 4]
    assert info["contiguous"]
    assert info["nbytes"] == 48
    assert info["data_ptr"] == a.ctypes.data
    view = _C._as_numpy(a)
    view[0, 0] = 42
    assert a[0, 0] == 42


@pytest.mark.parametrize(
    "dtype",
    [
        "float32",
        "float64",
        "float16",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "bool",
        "complex64",
        "complex128",
    ],
)
def test_dtypes_from_numpy(dtype):
    a = np.zeros(5, dtype=dtype)
    assert _C._tensor_info(a)["dtype"] == dtype


@pytest.mark.parametrize("dtype", ["uint32", "uint64", ">f4", "object"])
def test_unsupported_dtypes_are_named(dtype):
    with pytest.raises(TypeError, match=f"of dtype {dtype} .*supported: float32"):
        _C._tensor_info(np.zeros(2, dtype=dtype))


def test_non_contiguous_is_reported():
    a = np.zeros((4, 4), dtype=np.float64)[:, ::2]
    assert not _C._tensor_info(a)["contiguous"]


def test_buffers_and_dlpack():
    assert _C._tensor_info(bytearray(8))["dtype"] == "uint8"
    assert _C._tensor_info(memoryview(b"abc"))["numel"] == 3
    a = np.arange(6, dtype=np.int64)
    back = np.from_dlpack(_DLPackHolder(_C._to_dlpack(a)))
    assert back.ctypes.data == a.ctypes.data
    np.testing.assert_array_equal(back, a)


class _DLPackHolder:
    """Minimal producer: numpy.from_dlpack wants an object with __dlpack__."""

    def __init__(self, capsule):
        self._capsule = capsule

    def __dlpack__(self, stream=None):
        return self._capsule

    def __dlpack_device__(self):
        return (1, 0)


def test_wrong_types_raise_type_error():
    for bad in [None, 3, "text", object()]:
        with pytest.raises(TypeError):
            _C._tensor_info(bad)


def test_empty_is_aligned():
    a = _C._empty([3, 5], "int32")
    assert a.shape == (3, 5) and a.dtype == np.int32
    assert a.ctypes.data % 64 == 0


def test_torch_tensor_interop():
    torch = pytest.importorskip("torch")
    t = torch.arange(10, dtype=torch.float32)
    info = _C._tensor_info(t)
    assert info["data_ptr"] == t.data_ptr()
    assert info["dtype"] == "float32"
    bf = torch.zeros(4, dtype=torch.bfloat16)
    assert _C._tensor_info(bf)["dtype"] == "bfloat16"
    assert not _C._tensor_info(torch.zeros(4, 4).t())["contiguous"]


def test_exception_hierarchy():
    assert issubclass(c10d.DistError, RuntimeError)
    for cls in [
        c10d.DistStoreError,
        c10d.DistNetworkError,
        c10d.DistBackendError,
        c10d.DistTimeoutError,
    ]:
        assert issubclass(cls, c10d.DistError)
    assert issubclass(c10d.DistStoreTimeoutError, c10d.DistStoreError)
    assert issubclass(c10d.DistStoreTimeoutError, c10d.DistTimeoutError)
    assert issubclass(c10d.DistQueueEmptyError, c10d.DistStoreError)


def test_future_then_and_errors():
    f = c10d.Future()
    assert not f.done()
    chained = f.then(lambda fut: fut.value() + 1)
    seen = []
    f.add_done_callback(lambda fut: seen.append(fut.value()))
    threading.Thread(target=lambda: f.set_result(41)).start()
    assert chained.wait() == 42
    assert seen == [41]

    # A raising callback: torch's RuntimeError naming it, caused by the callback's error,
    # raised again on every wait.
    g = c10d.Future()
    failing = g.then(lambda fut: 1 / 0)
    g.set_result(1)
    for _ in range(2):
        with pytest.raises(
            RuntimeError,
            match="Got the following error when running the callback: ZeroDivisionError",
        ) as info:
            failing.wait()
        assert isinstance(info.value.__cause__, ZeroDivisionError)

    # A Python error set on a future is raised as itself, every time (it aborted the process
    # the second time).
    h = c10d.Future()
    h.set_exception(ValueError("bad"))
    for wait in (h.wait, h.value, h.wait):
        with pytest.raises(ValueError, match="bad"):
            wait()
    work = _C._create_work_from_future(h)
    for _ in range(2):
        with pytest.raises(ValueError, match="bad"):
            work.wait()
    assert isinstance(work.exception(), ValueError)
    with pytest.raises(AssertionError, match="not an Exception"):
        c10d.Future().set_exception("bad")

    # then() runs its callback on a failed future too, which may handle the error.
    def handle(fut):
        try:
            fut.wait()
        except ValueError:
            return "handled"

    assert h.then(handle).wait() == "handled"


def test_collect_all_and_wait_all():
    from c10d.futures import collect_all, wait_all

    a, b = c10d.Future(devices=[]), c10d.Future()
    both = collect_all([a, b])
    a.set_result(1)
    assert not both.done()
    threading.Thread(target=lambda: b.set_result([2])).start()
    assert [f.value() for f in both.wait()] == [1, [2]]
    assert wait_all([a, b]) == [1, [2]] and collect_all([]).wait() == []
    bad = c10d.Future()
    bad.set_exception(KeyError("k"))
    with pytest.raises(KeyError):
        wait_all([a, bad])
    assert c10d.Future[int] is c10d.Future  # annotations of comm hooks


def test_bare_work_has_no_result_or_future():
    # A Work() made in Python (a base for Python backends' works) runs nothing: torch's
    # answers, instead of blocking forever.
    w = c10d.Work()
    with pytest.raises(RuntimeError, match="result\\(\\) not implemented"):
        w.result()
    with pytest.raises(RuntimeError, match="getFuture not implemented"):
        w.get_future()
    assert not w.is_completed()


def test_work_from_future():
    f = c10d.Future()
    w = _C._create_work_from_future(f)
    assert not w.is_completed()
    with pytest.raises(c10d.DistTimeoutError):
        w.wait(0.05)
    a = np.ones(2)
    f.set_result([a])
    assert w.wait()
    assert w.is_success()
    assert w.result()[0] is a  # the future's tensors
    assert w.exception() is None


def test_debug_level_and_env(monkeypatch):
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    c10d.set_debug_level_from_env()
    assert c10d.get_debug_level() == c10d.DebugLevel.DETAIL
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "bogus")
    with pytest.raises(ValueError, match="OFF, INFO, DETAIL"):
        c10d.set_debug_level_from_env()
    c10d.set_debug_level(c10d.DebugLevel.OFF)
    names = [name for name, _, _ in c10d.env_variables()]
    assert "TORCH_DISTRIBUTED_DEBUG" in names and "MASTER_ADDR" in names


def test_debug_level_pickles():
    assert pickle.loads(pickle.dumps(c10d.DebugLevel.INFO)) == c10d.DebugLevel.INFO
