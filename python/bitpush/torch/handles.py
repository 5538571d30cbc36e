"""The completion of a push_pull: ``Handle`` (``synchronize`` waits on it, ``poll`` asks it),
and the deferred start of a CUDA tensor's push_pull (`_DeferredStart`, started by the
`_Starter` thread once the tensor's producer on its stream completed).

A Handle belongs to whoever started the push_pull; the session's in-flight table
(`_State.in_flight`, under `_State.lock`) refers to it until it completes. One `_Starter`
thread per session, created on the first deferred push_pull and stopped by shutdown.

Thread-safety: a Handle may be waited on from any thread.
"""
import threading

from .errors import BitpushError, _error


class _DeferredStart:
    """A push_pull that starts once `ready` (a torch.cuda.Event recorded after the tensor's
    producer on its stream) completed: the starter thread waits on the event — never on the
    whole stream, and never on the caller's thread — then starts the C++ push_pull. Behaves
    like the C++ handle (ready(), wait(timeout_ms)) from then on."""

    __slots__ = ("_started", "_inner", "_error")

    def __init__(self):
        self._started = threading.Event()
        self._inner = None
        self._error = None

    def ready(self):
        if not self._started.is_set():
            return False
        return self._error is not None or self._inner.ready()

    def wait(self, timeout_ms=None):
        if timeout_ms is None:
            while not self._started.wait(0.1):
                pass
        elif not self._started.wait(timeout_ms / 1000.0):
            raise _error("Timeout", "bitpush: push_pull not started after %d ms: its tensor is "
                         "not ready on the GPU yet" % timeout_ms)
        if self._error is not None:
            raise self._error
        self._inner.wait(timeout_ms)


class _Starter:
    """The thread that starts deferred push_pulls in the order they were asked for (one per
    process, started on first use)."""

    def __init__(self):
        import queue
        self._queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="bitpush-cuda-start",
                                        daemon=True)
        self._thread.start()

    def submit(self, ready, start, deferred):
        self._queue.put((ready, start, deferred))

    def close(self):
        self._queue.put(None)

    def _run(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            ready, start, deferred = item
            try:
                ready.synchronize()
                deferred._inner = start()
            except BaseException as e:  # delivered to whoever waits on the handle
                deferred._error = e if isinstance(e, BitpushError) else \
                    _error("Internal", "bitpush: starting a deferred push_pull: %s" % e)
            deferred._started.set()


class Handle:
    """The completion of one push_pull_async. Keeps its input and output tensors alive until
    the operation completed; ``synchronize(handle)`` returns the output."""

    __slots__ = ("_handle", "_state", "name", "tensor", "output", "_done", "_staged",
                 "__weakref__")

    def __init__(self, handle, state, name, tensor, output, staged=None):
        self._handle = handle
        self._state = state
        self.name = name
        self.tensor = tensor
        self.output = output
        self._done = False
        # Embedded mode, CUDA tensor: the CPU copy the operation writes, copied into `output`
        # on completion.
        self._staged = staged

    def ready(self):
        """True once the push_pull completed (successfully or not); never blocks."""
        return self._done or self._handle.ready()

    def wait(self, timeout=None):
        """Blocks until completion and returns the output tensor; raises BitpushError with the
        operation's failure. timeout (seconds): BitpushError (code Timeout) after that long,
        the operation goes on. Ctrl-C raises KeyboardInterrupt (the operation goes on)."""
        timeout_ms = None if timeout is None else max(0, int(timeout * 1000))
        try:
            self._handle.wait(timeout_ms)
        except BitpushError as e:
            if e.code != "Timeout" or self._handle.ready():
                self._release()
            raise
        if self._staged is not None and not self._done:
            self.output.copy_(self._staged)
        self._release()
        return self.output

    def _release(self):
        if self._done:
            return
        self._done = True
        with self._state.lock:
            if self._state.in_flight.get(self.name) is self:
                del self._state.in_flight[self.name]

    def __repr__(self):
        return "<bitpush.torch.Handle '%s' %s>" % (self.name,
                                                   "ready" if self.ready() else "in flight")


def synchronize(handle, timeout=None):
    """Waits for `handle` and returns its output tensor (raises BitpushError on failure)."""
    if not isinstance(handle, Handle):
        raise TypeError("bitpush: synchronize takes a Handle from push_pull_async, got %s"
                        % type(handle).__name__)
    return handle.wait(timeout)


def poll(handle):
    """True once `handle` completed (successfully or not); never blocks."""
    return handle.ready()
