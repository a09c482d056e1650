"""torch's profiler records c10d's operations (src/c10d/pg/profiler.h): each one an event
"<backend>:<operation>" with its input shapes, ended when its Work completes. Installed when
the program imports torch (before or after c10d); torch is never imported here otherwise."""

import ctypes
import importlib.abc
import importlib.util
import os
import queue
import sys
import threading
import warnings

from . import _C

# torch::profiler::impl::profilerEnabled(): whether the calling thread profiles.
_RECORDING_SYMBOL = "_ZN5torch8profiler4impl15profilerEnabledEv"
_installed = False


def install() -> None:
    """Hands torch's profiler to c10d's operations, when torch is loaded (once)."""
    global _installed
    if _installed or "torch" not in sys.modules:
        return
    _installed = True
    import torch

    library = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    try:
        loaded = ctypes.CDLL(library, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        recording = ctypes.cast(getattr(loaded, _RECORDING_SYMBOL), ctypes.c_void_p).value
    except (OSError, AttributeError):
        return  # a torch built otherwise: its profiler sees no c10d events
    _C._set_profiler_bridge(recording, _open)


def watch_for_torch() -> None:
    """Installs now if torch is loaded, else as soon as the program imports it."""
    if "torch" in sys.modules:
        install()
    elif not any(isinstance(finder, _TorchImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _TorchImport())


class _TorchImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: on the import of torch it steps aside, and has the module's
    loader install the bridge once torch's __init__ ran."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def run_then_install(module):
            run(module)
            try:
                install()
            except Exception:  # torch imported fine; only its profiler misses c10d's events
                pass

        spec.loader.exec_module = run_then_install
        return spec


# The name record_comm() gives the events of the collectives issued inside it (None: each
# event is named "<backend>:<op>").
comm_name = None


def _open(name, shapes):
    import torch

    if comm_name is not None:
        name = comm_name

    # Shapes are what torch records of an event's inputs; tensors on "meta" have no data.
    inputs = [torch.empty(shape, device="meta") for shape in shapes]
    handle = torch.autograd._record_function_with_args_enter(name, *inputs)
    return lambda: _closer.close(name, handle)


class _Closer:
    """Ends events on a thread of its own: torch counts an event asynchronous when it ends on
    another thread than it began on, as the events of its backends' Works do; an operation's
    event has ended when its wait() returns."""

    def __init__(self):
        self._lock = threading.Lock()
        self._queue = None
        self._pid = None

    # How long an operation waits for its event to end before it goes on without.
    WAIT_S = 10

    def close(self, name, handle) -> None:
        done = threading.Event()
        self._started().put((handle, done))
        if not done.wait(self.WAIT_S):
            warnings.warn(
                f"c10d: torch's profiler did not end the event {name!r} within {self.WAIT_S} s "
                "(thread c10d-profiler); the operation goes on without it"
            )

    def _started(self):
        with self._lock:
            if self._queue is None or self._pid != os.getpid():  # none yet, or forked
                self._queue, self._pid = queue.SimpleQueue(), os.getpid()
                threading.Thread(
                    target=self._run, args=(self._queue,), name="c10d-profiler", daemon=True
                ).start()
            return self._queue

    @staticmethod
    def _run(events):
        import torch

        while True:
            handle, done = events.get()
            try:
                torch.autograd._record_function_with_args_exit(handle)
            except Exception:  # the profiler stopped meanwhile: nothing to end
                pass
            finally:
                done.set()


_closer = _Closer()
