"""The worker side of tensors whose optimizer runs on the servers (bitpush.torch.ServerOptimizer;
worker/client.h): a step's push_pull with the round's learning rate, the servers' master
weights installed and pulled, and their optimizer state read and restored.

Stateless; any thread (the tensor must be declared with a server_optimizer).
"""
from .declarations import _declared
from .errors import _error
from .handles import Handle
from .session import _require


def _push_pull_step_async(grad, weights, name, lr):
    """Starts the push_pull of a declared server-side optimizer tensor: `grad` (contiguous
    float32 CPU) goes to the servers with the round's learning rate and `weights` (contiguous
    float32 CPU, this worker's copy) receives the update. Returns a Handle whose output is
    `weights`."""
    s = _require()
    d = _declared(s, name, "push_pull")
    with s.declare_lock, s.lock:
        previous = s.in_flight.get(name)
        if previous is not None and not previous.ready():
            raise _error("FailedPrecondition",
                         "bitpush: a push_pull of tensor '%s' is still in flight; synchronize "
                         "its handle first" % name)
        g, w = grad.detach(), weights.detach()
        h = s.client.push_pull_step(d.index, g.data_ptr(), w.data_ptr(), g.numel(), float(lr),
                                    name)
        handle = Handle(h, s, name, g, weights)
        s.in_flight[name] = handle
    return handle


def init_server_weights(name, weights):
    """Collective (every worker, in the same order): rank 0's `weights` (contiguous float32
    CPU) become the servers' master weights of declared tensor `name`, and every worker's
    `weights` is overwritten with the servers' copy."""
    s = _require()
    d = _declared(s, name, "init_server_weights")
    s.client.init_server_weights(d.index, weights.data_ptr(), weights.numel())


def pull_server_weights(name, weights):
    """Overwrites `weights` (contiguous float32 CPU) with the servers' copy of tensor `name`
    (what every worker holds after the last round), e.g. after a restore."""
    s = _require()
    d = _declared(s, name, "pull_server_weights")
    s.client.pull_server_weights(d.index, weights.data_ptr(), weights.numel())


def server_optimizer_state(name):
    """The servers' optimizer state of tensor `name` (master weights, moments, step, the
    workers' copy) as a list of bytes, one per partition."""
    s = _require()
    return list(s.client.server_optimizer_state(_declared(s, name,
                                                          "server_optimizer_state").index))


def restore_server_optimizer_state(name, parts):
    """Writes a state read by server_optimizer_state back to the servers (one process for the
    cluster); every worker then calls pull_server_weights."""
    s = _require()
    s.client.restore_server_optimizer_state(
        _declared(s, name, "restore_server_optimizer_state").index, [bytes(p) for p in parts])
