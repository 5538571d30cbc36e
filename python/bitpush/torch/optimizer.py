"""CLAN / LANS and DistributedOptimizer: training with bitpush from PyTorch.

Both optimizers exchange gradients the Horovod way: a hook on each parameter's gradient
accumulator starts ``push_pull_async`` of that gradient as soon as backward has produced it,
so communication overlaps the rest of backward; ``step()`` (or ``synchronize()``) waits for
every handle. What differs is what happens with the averaged gradient:

- ``CLAN`` (paper 001 Algorithm 5) applies the LANS update (Algorithm 2; the C++ kernel of
  optimizers/lans.h through ``bitpush._C.lans_step``) to each parameter, one block per tensor.
  The gradient goes through the tensor's compressor; the cluster's
  ``compression.error_feedback`` decides between Algorithm 3 (``none``) and Algorithm 4
  (``both``). ``LANS`` is CLAN with compression ``"none"`` (Algorithm 2).
- ``DistributedOptimizer`` wraps any torch optimizer: the averaged gradient is written into
  ``p.grad`` and the inner optimizer's ``step()`` runs.

Every worker must build the same optimizer over the same parameters in the same order: tensor
names come from ``named_parameters`` (else ``param.<index>``), and the first step pushes every
gradient in parameter order, so the declarations the engine checks across workers agree even
if backward produced gradients in a different order. A parameter that got no gradient in a
step is pushed as zeros, so every worker pushes every tensor every step and all stay in step;
its averaged gradient is then written into ``p.grad`` and the parameter is updated like any
other (a parameter no worker touched has a zero averaged gradient).

Thread-safety: an optimizer belongs to the thread that runs forward/backward/step.
docs/training.md is the user's guide.
"""

import contextlib
import importlib
import math
import os

import torch

__all__ = ["CLAN", "LANS", "DistributedOptimizer", "cluster_error_feedback",
           "cluster_compression", "ONEBIT_ERROR_FEEDBACK_DECAY"]

# CLAN's default error_feedback_decay for onebit-compressed tensors: the worker residual is
# multiplied by it before every push. Chosen from the digits and charlm measurements in
# docs/training.md ("Compressed training at the examples' defaults"; 0.1..0.3 are within noise
# of each other, 1.0 is paper 001's Algorithm 4 as printed).
ONEBIT_ERROR_FEEDBACK_DECAY = 0.2


def _bp():
    # bitpush.torch imports this module at its end; look it up lazily so the import order
    # of the package does not matter.
    return importlib.import_module("bitpush.torch")


def _C():
    return importlib.import_module("bitpush._C")


def _error_cls():
    return getattr(_bp(), "BitpushError", RuntimeError)


def _is_uncompressed(spec):
    return spec is None or str(spec).strip().split(":")[0] in ("", "none")


def cluster_error_feedback():
    """The cluster's compression.error_feedback ("none", "worker", "server", "both"), or None
    when no cluster config is known (not initialised and BITPUSH_CONFIG unset).

    The value comes from the C++ parser (bitpush._C.load_cluster_config, the one reader of the
    cluster YAML): the config this process was initialised with, else the YAML named by
    BITPUSH_CONFIG (the launcher's and LocalCluster's environment; read through bitpush._env,
    the package's one reader of environment variables). A config the parser refuses raises
    BitpushError naming the file, line and key.
    """
    return _cluster_knob("compression.error_feedback")


def cluster_compression():
    """The cluster's compression.spec (canonical, e.g. "onebit:scaled=true"): what a tensor
    declared without a spec of its own gets (unless a compression.overrides pattern matches its
    name), or None when no cluster config is known. Read like cluster_error_feedback()."""
    return _cluster_knob("compression.spec")


def _cluster_knob(key):
    path = None
    fn = getattr(_bp(), "config_path", None)
    if callable(fn):
        try:
            path = fn()
        except Exception:  # not initialised
            path = None
    if not path:
        path = importlib.import_module("bitpush._env").bootstrap().config
    if not path or not os.path.exists(path):
        return None
    return _C().load_cluster_config(path)["knobs"][key]


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
        _bp()._check_compression(compression, what)
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
                raise _error_cls()(
                    "%s: the gradient of '%s' was computed more than backward_passes_per_step=%d"
                    " times before step() (call step() or synchronize() after every %d backward"
                    " passes)" % (self._bp_what, self._bp_name(p), self._bp_passes,
                                  self._bp_passes))
            self._bp_delay[key] -= 1
            if self._bp_delay[key] > 0:
                return
            if not self._bp_declared:
                # The first exchange goes in parameter order from synchronize(): the engine
                # checks declarations across workers in the order they are made.
                return
            self._bp_start(p)
        return hook

    def _bp_start(self, p):
        if p.grad is None:
            p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
        elif not p.grad.is_contiguous():
            p.grad = p.grad.contiguous()
        handle = _bp().push_pull_async(p.grad, self._bp_name(p), compression=self._bp_spec(p),
                                       average=True, output=p.grad)
        self._bp_handles[id(p)] = (p, handle)

    def synchronize(self):
        """Waits for every gradient's push_pull (starting the ones backward did not: a
        parameter without a gradient is pushed as zeros) and writes the averaged gradients
        into p.grad. Raises BitpushError when the cluster failed."""
        for p in self._bp_params:
            if id(p) not in self._bp_handles:
                self._bp_start(p)
        if not self._bp_declared:
            _bp()._announce_compression([self._bp_name(p) for p in self._bp_params])
        self._bp_declared = True
        bp = _bp()
        try:
            for p, handle in list(self._bp_handles.values()):
                out = bp.synchronize(handle)
                if out is not None and out.data_ptr() != p.grad.data_ptr():
                    with torch.no_grad():
                        p.grad.copy_(out)
        finally:
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
        bp = _bp()
        if not self._bp_declared:
            return None
        out = {}
        for p in self._bp_params:
            r = bp.error_feedback_state(self._bp_name(p))
            if r is not None:
                out[self._bp_name(p)] = r
        return out

    def _bp_restore_ef_state(self, residuals):
        """Declares every gradient (in parameter order, as the first exchange would) and puts
        the saved residuals back."""
        if not residuals:
            return
        bp = _bp()
        self._bp_declare_all()
        for p in self._bp_params:
            name = self._bp_name(p)
            if name in residuals:
                bp.restore_error_feedback_state(name, residuals[name])

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
        if meta.get("ef_residuals") and node is not None and node != _bp().node_rank():
            raise ValueError(
                "load_state_dict: the checkpoint holds node %d's worker error-feedback "
                "residuals, but this process is on node %d, whose residuals differ (a "
                "checkpoint saved by one worker and loaded by all would diverge); save "
                "and load with bitpush.torch.save_checkpoint / load_checkpoint, which "
                "keep every node's" % (node, _bp().node_rank()))
        return meta

    def _bp_declare_all(self):
        """Declares every gradient in parameter order, as the first exchange would (a no-op for
        the ones already declared)."""
        bp = _bp()
        for p in self._bp_params:
            bp.declare(self._bp_name(p), p.detach(), compression=self._bp_spec(p), average=True)

    def _bp_sync_for_step(self):
        if self._bp_skip_sync:
            if not self._bp_synchronized:
                raise _error_cls()("%s: step() inside skip_synchronize() without a prior "
                                   "synchronize()" % self._bp_what)
        elif not self._bp_synchronized:
            self.synchronize()
        self._bp_synchronized = False


class CLAN(_GradientExchange, torch.optim.Optimizer):
    """Compressed LANS (paper 001 Algorithm 5) over a bitpush cluster.

    Args:
        params: parameters or parameter groups (fp32, contiguous; CPU or CUDA).
        lr, betas, eps, weight_decay: η, (β1, β2), ε and λ of LANS (per group).
        compression: the compressor spec of every gradient ("onebit", "topk:ratio=0.01",
            "dithering:levels=63", "none", ...; docs/compressors.md); None (the default) = the
            cluster YAML's (compression.spec and compression.overrides), as for push_pull.
            Tensors below the cluster's compression.min_compress_bytes travel uncompressed
            whatever the spec.
        error_feedback: None (the default) = whatever the cluster runs (the YAML's
            compression.error_feedback: "worker" or "both" is Algorithm 4, "none" Algorithm 3);
            True / False assert Algorithm 4 / 3 and are refused, naming the YAML key, when the
            cluster runs otherwise. Not checked when the gradients go uncompressed.
        eps_inside_sqrt: ε inside the square root (Algorithm 2 as printed) instead of
            sqrt(v^) + ε (the paper's proof, MXNet; default).
        normalize_grad: divide g~ by its block L2 norm first (MXNet LANS; the paper does not).
        trust_ratio_fallback: a trust ratio that is 0, inf or NaN becomes 1 (default).
        phi_bounds: (lower, upper) clamp of φ(‖x‖); None = identity.
        named_parameters: (name, param) pairs for the tensor names (else "param.<index>").
        backward_passes_per_step: backward passes accumulated locally before the push.
        error_feedback_decay: γ in [0, 1]: before each step's first push every worker
            error-feedback residual e_i is multiplied by γ (leaky error feedback), so what the
            compressor dropped is paid back within a few steps instead of being carried on.
            None (the default) = per tensor, by its compressor: ONEBIT_ERROR_FEEDBACK_DECAY
            (0.2) for onebit, 1.0 for the others (top-k and random-k send few elements a step:
            their residual is the gradient still waiting its turn); measured in docs/training.md,
            "Compressed training at the examples' defaults". 1.0 keeps the whole residual
            (paper 001 Algorithm 4 as printed). Acts only on tensors that keep a worker
            residual (compressed, compression.error_feedback worker or both); the servers'
            residuals are not touched.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0,
                 compression=None, error_feedback=None, eps_inside_sqrt=False,
                 normalize_grad=False, trust_ratio_fallback=True, phi_bounds=None,
                 named_parameters=None, backward_passes_per_step=1,
                 error_feedback_decay=None):
        if not lr >= 0.0:
            raise ValueError("lr must be >= 0, got %r" % (lr,))
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError("betas must be in [0, 1), got %r" % (betas,))
        if not eps > 0.0:
            raise ValueError("eps must be > 0, got %r" % (eps,))
        if not weight_decay >= 0.0:
            raise ValueError("weight_decay must be >= 0, got %r" % (weight_decay,))
        lower, upper = (0.0, math.inf) if phi_bounds is None else phi_bounds
        if not 0.0 <= lower <= upper:
            raise ValueError("phi_bounds must be (lower, upper) with 0 <= lower <= upper, got %r"
                             % (phi_bounds,))
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        eps_inside_sqrt=bool(eps_inside_sqrt),
                        normalize_grad=bool(normalize_grad),
                        trust_ratio_fallback=bool(trust_ratio_fallback),
                        phi_bounds=(float(lower), float(upper)))
        torch.optim.Optimizer.__init__(self, params, defaults)
        for i, p in enumerate(q for g in self.param_groups for q in g["params"]):
            _check_param(p, i, named_parameters)
        _bp()._check_compression(compression, type(self).__name__)
        self.compression = None if compression is None else str(compression)
        self.error_feedback = None if error_feedback is None else bool(error_feedback)
        self._check_error_feedback()
        if error_feedback_decay is not None:
            if not 0.0 <= error_feedback_decay <= 1.0:
                raise ValueError("%s: error_feedback_decay must be in [0, 1] (1 keeps the "
                                 "whole residual), got %r"
                                 % (type(self).__name__, error_feedback_decay))
            error_feedback_decay = float(error_feedback_decay)
        self.error_feedback_decay = error_feedback_decay
        self._ef_decays = None  # [(name, γ)] of the tensors to decay, once they are declared
        self._ef_restored = False
        # Decay before the next push rather than right after the exchange: between steps
        # (state_dict, checkpoints) every process of a node reads the same residual, and a
        # restored run decays it at the same point as the uninterrupted one.
        self._ef_decay_pending = True
        self._exchange_init(named_parameters, self.compression, backward_passes_per_step,
                            type(self).__name__)

    def _check_error_feedback(self):
        spec = self.compression if self.compression is not None else cluster_compression()
        ef = cluster_error_feedback()
        if self.error_feedback is None and ef is not None:
            self.error_feedback = ef in ("worker", "both")  # the cluster's, whatever it is
        if _is_uncompressed(spec):
            return
        if ef is None or self.error_feedback is None:
            return  # unknown (no cluster yet): the user's responsibility, docs/training.md
        if self.error_feedback and ef not in ("worker", "both"):
            raise ValueError(
                "%s(error_feedback=True) needs worker error feedback, but the cluster runs "
                "compression.error_feedback: %s; set compression.error_feedback: both (paper "
                "001 Algorithm 4; or worker) in the cluster YAML, or pass error_feedback=False"
                % (type(self).__name__, ef))
        if not self.error_feedback and ef != "none":
            raise ValueError(
                "%s(error_feedback=False) is Algorithm 3 (no error feedback), but the cluster "
                "runs compression.error_feedback: %s; set compression.error_feedback: none in "
                "the cluster YAML, or pass error_feedback=True" % (type(self).__name__, ef))

    def _bp_start(self, p):
        if self._ef_decay_pending:
            # The first push of a step: none of this optimizer's rounds is in flight.
            self._ef_decay_pending = False
            self._decay_error_feedback()
        super()._bp_start(p)

    def _bp_restore_ef_state(self, residuals):
        # (load_state_dict and load_checkpoint): the restored residuals are decayed before the
        # first push, as the uninterrupted run decays them before its next one.
        super()._bp_restore_ef_state(residuals)
        self._ef_restored = self._ef_restored or bool(residuals)
        # A checkpoint is taken between steps: the next push is a step's first (also when this
        # process restores in place, after a failed step had already decayed its residuals).
        self._ef_decay_pending = True

    def _decay_error_feedback(self):
        if self.error_feedback_decay == 1.0:
            return  # Algorithm 4 as printed (and LANS)
        bp = _bp()
        if self._ef_decays is None:
            if not self._bp_declared and not self._ef_restored:
                return  # nothing declared yet: every residual is still zero
            self._ef_decays = []
            # In daemon mode the residual is the node's and the daemon applies local rank 0's
            # restore; the node's other processes leave it to that one.
            if bp.mode() == "daemon" and bp.local_rank() != 0:
                return
            for p in self._bp_params:
                name = self._bp_name(p)
                if bp.error_feedback_state(name) is None:
                    continue  # uncompressed, or the cluster keeps no worker residual
                gamma = self.error_feedback_decay
                if gamma is None:
                    gamma = (ONEBIT_ERROR_FEEDBACK_DECAY if _compressor_method(name) == "onebit"
                             else 1.0)
                if gamma != 1.0:
                    self._ef_decays.append((name, gamma))
        for name, gamma in self._ef_decays:
            r = bp.error_feedback_state(name)
            bp.restore_error_feedback_state(name, r.mul_(gamma))

    def _lans_options(self, group):
        o = _C().LansOptions()
        o.beta1, o.beta2 = float(group["betas"][0]), float(group["betas"][1])
        o.eps = float(group["eps"])
        o.weight_decay = float(group["weight_decay"])
        o.eps_inside_sqrt = bool(group["eps_inside_sqrt"])
        o.normalize_grad = bool(group["normalize_grad"])
        o.trust_ratio_fallback = bool(group["trust_ratio_fallback"])
        o.phi_lower, o.phi_upper = float(group["phi_bounds"][0]), float(group["phi_bounds"][1])
        return o

    @torch.no_grad()
    def step(self, closure=None):
        """Synchronizes the gradients (unless inside skip_synchronize()) and applies one LANS
        update per parameter with the averaged gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._bp_sync_for_step()
        self._ef_decay_pending = True
        C = _C()
        for group in self.param_groups:
            options = self._lans_options(group)
            lr = float(group["lr"])
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                if g.dtype != torch.float32 or not g.is_contiguous() or g.device != p.device:
                    g = g.to(device=p.device, dtype=torch.float32).contiguous()
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                    state["exp_avg_sq"] = torch.zeros_like(p,
                                                           memory_format=torch.contiguous_format)
                state["step"] += 1
                m, v = state["exp_avg"], state["exp_avg_sq"]
                args = (options, lr, int(state["step"]), p.data_ptr(), m.data_ptr(),
                        v.data_ptr(), g.data_ptr(), p.numel())
                if p.is_cuda:
                    stream = torch.cuda.current_stream(p.device).cuda_stream
                    C.lans_step_cuda(*args, stream)
                else:
                    C.lans_step(*args)
        return loss

    def state_dict(self):
        sd = super().state_dict()
        # The worker's error-feedback residuals (paper 001 Algorithm 4's e_i) come from the
        # engine (embedded) or the node's daemon (daemon mode); the servers' residuals stay on
        # the servers (docs/training.md, "Checkpoints").
        residuals = self._bp_ef_state()
        sd["bitpush"] = {"compression": self.compression,
                         "error_feedback": self.error_feedback,
                         "names": [self._bp_name(p) for p in self._bp_params],
                         "ef_residuals": residuals,
                         # Whose residuals these are: every node keeps its own.
                         "node": _bp().node_rank() if residuals else None}
        return sd

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        meta = self._bp_check_meta(state_dict.pop("bitpush", None))
        super().load_state_dict(state_dict)
        if meta is not None:
            self._bp_restore_ef_state(meta.get("ef_residuals"))
        # Keep the kernel's invariants: fp32, contiguous, on the parameter's device.
        for group in self.param_groups:
            for p in group["params"]:
                st = self.state.get(p)
                if not st:
                    continue
                for k in ("exp_avg", "exp_avg_sq"):
                    st[k] = st[k].to(device=p.device, dtype=torch.float32).contiguous()
                st["step"] = int(st["step"])


class LANS(CLAN):
    """Uncompressed LANS (paper 001 Algorithm 2): CLAN with compression "none"; works with any
    compression.error_feedback setting."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0,
                 eps_inside_sqrt=False, normalize_grad=False, trust_ratio_fallback=True,
                 phi_bounds=None, named_parameters=None, backward_passes_per_step=1):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         compression="none", error_feedback=False, error_feedback_decay=1.0,
                         eps_inside_sqrt=eps_inside_sqrt, normalize_grad=normalize_grad,
                         trust_ratio_fallback=trust_ratio_fallback, phi_bounds=phi_bounds,
                         named_parameters=named_parameters,
                         backward_passes_per_step=backward_passes_per_step)


def _compressor_method(name):
    """The compressor method ("onebit", "topk", ..., "none") tensor `name` travels with, as the
    engine's rule resolves it (CLAN's spec, else the cluster's compression.spec or a matching
    compression.overrides pattern; "none" below compression.min_compress_bytes)."""
    s = _bp()._require()
    with s.lock:
        index = s.declarations[name].index
    spec, _why = s.client.compression_of([index])[0]
    return spec.split(":")[0]


def _check_param(p, index, named_parameters):
    where = "parameter %d" % index
    if not isinstance(p, torch.Tensor):
        raise TypeError("%s is a %s, not a tensor" % (where, type(p).__name__))
    if p.dtype != torch.float32:
        raise TypeError("%s has dtype %s; CLAN/LANS update fp32 parameters only (keep fp32 "
                        "master weights)" % (where, p.dtype))
    if not p.is_contiguous():
        raise ValueError("%s is not contiguous (strides %s); the LANS kernel updates one dense "
                         "block per tensor: pass contiguous parameters" % (where, p.stride()))
    if p.device.type not in ("cpu", "cuda"):
        raise ValueError("%s is on %s; CLAN/LANS run on CPU or CUDA tensors" % (where, p.device))
    if p.is_sparse:
        raise ValueError("%s is sparse; CLAN/LANS need dense parameters" % where)


class _DistributedOptimizer:
    # Methods of the subclass DistributedOptimizer builds, with bases (_GradientExchange, the
    # wrapped optimizer's class): the Horovod pattern, so isinstance, LR schedulers and the
    # inner class's step() keep working.

    def __init__(self, params, named_parameters, compression, backward_passes_per_step):
        super(self.__class__, self).__init__(params)
        self._exchange_init(named_parameters, compression, backward_passes_per_step,
                            "DistributedOptimizer")

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._bp_sync_for_step()
        super(self.__class__, self).step()
        return loss

    def zero_grad(self, set_to_none=False):
        if self._bp_handles:
            raise _error_cls()("DistributedOptimizer.zero_grad() while gradients are being "
                               "pushed: call step() or synchronize() first")
        return super(self.__class__, self).zero_grad(set_to_none=set_to_none)


def DistributedOptimizer(optimizer, named_parameters=None, compression=None,
                         backward_passes_per_step=1):
    """Wraps a torch optimizer so that every gradient is averaged over the bitpush workers
    before its step().

    compression: the compressor spec of every gradient; None (the default) = the cluster
    YAML's (compression.spec and compression.overrides), as for push_pull and CLAN.

    Hooks start push_pull_async of each gradient during backward; ``synchronize()`` waits and
    writes the averaged gradients into p.grad (clip them there, then call ``step()`` inside
    ``skip_synchronize()``); ``step()`` synchronizes if that has not happened yet and then runs
    the wrapped optimizer. With backward_passes_per_step=k the gradient accumulated over k
    backward passes (their sum, as torch accumulates) is pushed once.

    The result is an instance of a subclass of the optimizer's class built over the same
    param_groups (hyper-parameters kept); the wrapped optimizer's existing state is not
    carried over, so wrap it before training starts.

    When the cluster YAML says ``optimizer.placement: server``, the result is a
    ``bitpush.torch.ServerOptimizer`` running the same rule on the servers (SGD, AdamW, Adam
    without weight decay, LANS, CLAN; its hyper-parameters per group), and the workers keep no
    optimizer state.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("DistributedOptimizer wraps a torch.optim.Optimizer, got %s"
                        % type(optimizer).__name__)
    server = importlib.import_module("bitpush.torch.server_optimizer")
    named_parameters = None if named_parameters is None else list(named_parameters)
    where = server._placements(optimizer, named_parameters)
    if any(w == "server" for w in where.values()):
        if isinstance(optimizer, _GradientExchange):
            optimizer.remove_hooks()  # CLAN / LANS: their gradients go to the servers instead
        return server._from_torch_optimizer(optimizer, named_parameters, compression,
                                            backward_passes_per_step, where)
    if isinstance(optimizer, (CLAN, _GradientExchange)):
        raise TypeError("%s already exchanges gradients over bitpush; do not wrap it in "
                        "DistributedOptimizer" % type(optimizer).__name__)
    methods = {k: v for k, v in _DistributedOptimizer.__dict__.items()
               if k not in ("__dict__", "__weakref__")}
    cls = type(optimizer.__class__.__name__, (_GradientExchange, optimizer.__class__), methods)
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step)
