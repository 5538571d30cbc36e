"""The gradient exchange every bitpush optimizer shares (CLAN, LANS, DistributedOptimizer,
ServerOptimizer, BinSGDM mix `_GradientExchange` in).

Gradients are exchanged the Horovod way: a hook on each parameter's gradient accumulator starts
``push_pull_async`` of that gradient as soon as backward has produced it, so communication
overlaps the rest of backward; ``step()`` (or ``synchronize()``) waits for every handle. What
happens with the averaged gradient is the optimizer's own.

Every worker must build the same optimizer over the same parameters in the same order: tensor
names come from ``named_parameters`` (else ``param.<index>``), and the first step pushes every
gradient in parameter order, so the declarations the engine checks across workers agree even
if backward produced gradients in a different order. A parameter that got no gradient in a
step is pushed as zeros, so every worker pushes every tensor every step and all stay in step;
its averaged gradient is then written into ``p.grad`` and the parameter is updated like any
other (a parameter no worker touched has a zero averaged gradient). The exchange also reads
and restores the gradients' worker error-feedback residuals (state_dict, checkpoints).

Non-finite gradients (the cluster's ``compression.non_finite``, docs/errors.md): with ``error``
(the default) a NaN or inf reaches the engine, which fails the round on every worker with a
BitpushError naming the tensor, the worker and the round. With ``skip`` the hooks push nothing
during backward; ``synchronize()`` first checks this worker's gradients, sums the count of
non-finite ones over every worker (one push_pull of a 1-element tensor), and when it is not 0
every worker skips the step: nothing is pushed, no error-feedback state, round or optimizer
state changes, ``steps_skipped`` counts it, and every gradient is left NaN on every worker (as
DDP's all-reduce spreads one worker's NaN, so a GradScaler sees the overflow everywhere alike). The price is the overlap of communication with backward, and one small round trip.

Thread-safety: the state belongs to the optimizer, i.e. to the thread that runs
forward/backward/step (the hooks run during backward).
"""
import contextlib

import torch

from . import handles
from .collectives import push_pull_async
from .compression import _announce_compression, _check_compression
from .declarations import declare
from .error_feedback import error_feedback_state, restore_error_feedback_state
from .cluster_knobs import cluster_non_finite
from .errors import BitpushError, _error
from .session import node_rank

# Skipped steps logged one by one before they are only counted (every 100th is logged).
_SKIP_LOG_FIRST = 5


class _GradientExchange:
    """The hook / handle machinery shared by CLAN and DistributedOptimizer.

    Expects ``self.param_groups`` to exist; call ``_exchange_init`` after the optimizer's own
    ``__init__``.
    """

    def _exchange_init(self, named_parameters, compression, backward_passes_per_step,
                       what):
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be >= 1, got %r"
                             % (backward_passes_per_step,))
        params = [p for g in self.param_groups for p in g["params"]]
        if len({id(p) for p in params}) != len(params):
            raise ValueError("%s: a parameter appears twice in the parameter groups" % what)
        if named_parameters is not None:
            named = list(named_parameters)
            if named and not isinstance(named[0], tuple):
                raise ValueError("named_parameters must be (name, tensor) pairs, e.g. "
                                 "model.named_parameters()")
            names = {}
            for name, p in named:
                if id(p) in names:
                    continue  # a tied weight is one tensor: the first name wins
                names[id(p)] = name
            if len(set(names.values())) != len(names):
                raise ValueError("named_parameters has duplicate names")
            missing = [i for i, p in enumerate(params) if id(p) not in names]
            if missing:
                raise ValueError("%s: parameter %d of the optimizer is not in named_parameters"
                                 % (what, missing[0]))
            self._bp_names = {id(p): names[id(p)] for p in params}
        else:
            self._bp_names = {id(p): "param.%d" % i for i, p in enumerate(params)}
        self._bp_params = [p for p in params if p.requires_grad]
        _check_compression(compression, what)
        # None: every tensor gets the cluster's spec (compression.spec, or the first matching
        # compression.overrides pattern), as push_pull does.
        self._bp_compression = None if compression is None else str(compression)
        self._bp_passes = int(backward_passes_per_step)
        self._bp_delay = {id(p): self._bp_passes for p in self._bp_params}
        self._bp_handles = {}  # id(p) -> (p, handle)
        self._bp_declared = False
        self._bp_synchronized = False
        self._bp_skip_sync = False
        self._bp_grad_accs = []
        self._bp_hook_handles = []
        self._bp_what = what
        self._bp_skip_non_finite = cluster_non_finite() == "skip"
        self._bp_step_skipped = False
        self.steps_skipped = 0
        self._bp_exchanges = 0  # synchronize() calls that got this far: the step, for messages
        for p in self._bp_params:
            # Horovod's trick: expand_as gives a view whose grad_fn's first input is the
            # parameter's AccumulateGrad node; its post-hook runs once p.grad holds this
            # backward pass's (accumulated) gradient.
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            self._bp_hook_handles.append(acc.register_hook(self._bp_make_hook(p)))
            self._bp_grad_accs.append(acc)

    def remove_hooks(self):
        """Detaches the gradient hooks (e.g. before building another bitpush optimizer over
        the same parameters); later gradients are pushed by synchronize()/step()."""
        for h in self._bp_hook_handles:
            h.remove()
        self._bp_hook_handles = []
        self._bp_grad_accs = []

    def _bp_name(self, p):
        return self._bp_names[id(p)]

    def _bp_spec(self, p):
        return self._bp_compression

    def _bp_make_hook(self, p):
        def hook(*_):
            key = id(p)
            if key in self._bp_handles:
                raise BitpushError(
                    "%s: the gradient of '%s' was computed more than backward_passes_per_step=%d"
                    " times before step() (call step() or synchronize() after every %d backward"
                    " passes)" % (self._bp_what, self._bp_name(p), self._bp_passes,
                                  self._bp_passes))
            self._bp_delay[key] -= 1
            if self._bp_delay[key] > 0:
                return
            if not self._bp_declared or self._bp_skip_non_finite:
                # The first exchange goes in parameter order from synchronize(): the engine
                # checks declarations across workers in the order they are made. With
                # compression.non_finite: skip, synchronize() checks the step before any push.
                return
            self._bp_start(p)
        return hook

    def _bp_start(self, p):
        if p.grad is None:
            p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
        elif not p.grad.is_contiguous():
            p.grad = p.grad.contiguous()
        handle = push_pull_async(p.grad, self._bp_name(p), compression=self._bp_spec(p),
                                 average=True, output=p.grad)
        self._bp_handles[id(p)] = (p, handle)

    def _bp_check_finite(self):
        """compression.non_finite: skip. Counts this worker's non-finite gradients, sums the
        count over every worker and returns True when the step may go on; otherwise marks the
        step skipped (nothing pushed) and returns False."""
        bad = [self._bp_name(p) for p in self._bp_params
               if p.grad is not None and not bool(torch.isfinite(p.grad).all())]
        flag = torch.tensor([float(len(bad))], dtype=torch.float32)
        # One tensor per optimizer (named after its first parameter), raw, summed.
        name = "bitpush.non_finite.%s" % (self._bp_name(self._bp_params[0])
                                          if self._bp_params else "")
        total = handles.synchronize(push_pull_async(flag, name, compression="none",
                                                    average=False, output=flag))
        total = float((total if total is not None else flag)[0])
        if total == 0:
            return True
        self._bp_step_skipped = True
        self.steps_skipped += 1
        if self.steps_skipped <= _SKIP_LOG_FIRST or self.steps_skipped % 100 == 0:
            print("bitpush: %s skipped a step (%d so far): %d non-finite gradient(s) over the "
                  "workers%s (compression.non_finite: skip)"
                  % (self._bp_what, self.steps_skipped, int(total),
                     "; here: %s" % ", ".join("'%s'" % n for n in bad[:3]) if bad else ""),
                  flush=True)
        # Every worker's gradients turn NaN, as DDP's all-reduce would spread the bad worker's:
        # a GradScaler loop (synchronize, unscale_, step inside skip_synchronize) then sees the
        # overflow on every worker and lowers its scale on all of them alike.
        with torch.no_grad():
            for p in self._bp_params:
                if p.grad is not None:
                    p.grad.fill_(float("nan"))
                self._bp_delay[id(p)] = self._bp_passes
        return False

    def synchronize(self):
        """Waits for every gradient's push_pull (starting the ones backward did not: a
        parameter without a gradient is pushed as zeros) and writes the averaged gradients
        into p.grad. Raises BitpushError when the cluster failed. With compression.non_finite:
        skip, a step whose gradients hold a NaN or inf on any worker is skipped instead
        (nothing pushed; step() then changes nothing)."""
        self._bp_step_skipped = False
        if self._bp_skip_non_finite and not self._bp_check_finite():
            self._bp_synchronized = True
            return
        for p in self._bp_params:
            if id(p) not in self._bp_handles:
                self._bp_start(p)
        if not self._bp_declared:
            _announce_compression([self._bp_name(p) for p in self._bp_params])
        self._bp_declared = True
        try:
            for p, handle in list(self._bp_handles.values()):
                out = handles.synchronize(handle)
                if out is not None and out.data_ptr() != p.grad.data_ptr():
                    with torch.no_grad():
                        p.grad.copy_(out)
        except BitpushError as e:
            raise _error(getattr(e, "code", "Internal"), "%s (%s, step %d counting from 0)"
                         % (e, self._bp_what, self._bp_exchanges)) from e
        finally:
            self._bp_exchanges += 1
            self._bp_handles.clear()
            for p in self._bp_params:
                self._bp_delay[id(p)] = self._bp_passes
        self._bp_synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Within it, step() does not call synchronize(): use after an explicit
        synchronize() (e.g. to clip the averaged gradients first)."""
        self._bp_skip_sync = True
        try:
            yield
        finally:
            self._bp_skip_sync = False

    def _bp_ef_state(self):
        """{name: residual tensor} of the parameters whose gradients keep a worker
        error-feedback residual (None before the first exchange). In daemon mode the residual
        is the node's (kept by its bitpush-worker after the local reduce): every process of the
        node gets the same values, and on restore the daemon applies local rank 0's."""
        if not self._bp_declared:
            return None
        out = {}
        for p in self._bp_params:
            r = error_feedback_state(self._bp_name(p))
            if r is not None:
                out[self._bp_name(p)] = r
        return out

    def _bp_restore_ef_state(self, residuals):
        """Declares every gradient (in parameter order, as the first exchange would) and puts
        the saved residuals back."""
        if not residuals:
            return
        self._bp_declare_all()
        for p in self._bp_params:
            name = self._bp_name(p)
            if name in residuals:
                restore_error_feedback_state(name, residuals[name])

    def _bp_check_meta(self, meta):
        """Checks a state_dict's "bitpush" entry (None passes) against this optimizer: the
        same tensors, and worker states saved on this node. Returns it."""
        if meta is None:
            return None
        names = [self._bp_name(p) for p in self._bp_params]
        if meta.get("names") is not None and list(meta["names"]) != names:
            raise ValueError("load_state_dict: the checkpoint's tensors %r are not this "
                             "optimizer's %r" % (meta["names"][:4], names[:4]))
        node = meta.get("node")
        if meta.get("ef_residuals") and node is not None and node != node_rank():
            raise ValueError(
                "load_state_dict: the checkpoint holds node %d's worker error-feedback "
                "residuals, but this process is on node %d, whose residuals differ (a "
                "checkpoint saved by one worker and loaded by all would diverge); save "
                "and load with bitpush.torch.save_checkpoint / load_checkpoint, which "
                "keep every node's" % (node, node_rank()))
        return meta

    def _bp_declare_all(self):
        """Declares every gradient in parameter order, as the first exchange would (a no-op for
        the ones already declared)."""
        for p in self._bp_params:
            declare(self._bp_name(p), p.detach(), compression=self._bp_spec(p), average=True)

    def _bp_sync_for_step(self):
        """Synchronizes unless done already; False when the step is to be skipped (a
        non-finite gradient under compression.non_finite: skip), True otherwise."""
        if self._bp_skip_sync:
            if not self._bp_synchronized:
                raise BitpushError("%s: step() inside skip_synchronize() without a prior "
                                   "synchronize()" % self._bp_what)
        elif not self._bp_synchronized:
            self.synchronize()
        self._bp_synchronized = False
        return not self._bp_step_skipped
