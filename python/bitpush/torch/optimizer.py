"""CLAN / LANS: training with bitpush from PyTorch, the LANS update on the workers.

Gradients are exchanged by the hooks of gradient_exchange.py (push_pull_async during backward,
every handle waited for by ``step()`` or ``synchronize()``); then ``CLAN`` (paper 001
Algorithm 5) applies the LANS update (Algorithm 2; the C++ kernel of optimizers/lans.h through
``bitpush._C.lans_step``) to each parameter, one block per tensor. The gradient goes through
the tensor's compressor; the cluster's ``compression.error_feedback`` decides between
Algorithm 3 (``none``) and Algorithm 4 (``both``). ``LANS`` is CLAN with compression
``"none"`` (Algorithm 2). DistributedOptimizer (any torch optimizer) is in
distributed_optimizer.py, the optimizer on the servers in server_optimizer.py.

Thread-safety: an optimizer belongs to the thread that runs forward/backward/step.
docs/training.md is the user's guide.
"""
import math
import time

import torch

from .. import _C
from .cluster_knobs import cluster_compression, cluster_error_feedback, cluster_partition_bytes
from .compression import _check_compression, _compressor_method
from .error_feedback import (error_feedback_state, restore_error_feedback_state,
                             set_error_feedback_decay)
from .gradient_exchange import _GradientExchange
from .session import _trace_optimizer, local_rank, mode, node_rank

__all__ = ["CLAN", "LANS", "ONEBIT_ERROR_FEEDBACK_DECAY", "ONEBIT_WIDE_SCALE_ELEMENTS"]


# CLAN's default error_feedback_decay for onebit-compressed tensors: the worker residual is
# multiplied by it before every push. Chosen from the digits and charlm measurements in
# docs/training.md ("Compressed training at the examples' defaults"; 0.1..0.3 are within noise
# of each other, 1.0 is paper 001's Algorithm 4 as printed).
ONEBIT_ERROR_FEEDBACK_DECAY = 0.2


# Onebit sends one scale (mean |q|) per partition. Above this many elements per scale CLAN
# trails LANS on wide layers, and compression.partition_bytes of 4 bytes x this holds parity
# (docs/training.md, "Wide layers"): CLAN says so once at its first step.
ONEBIT_WIDE_SCALE_ELEMENTS = 65536


def _hint_wide_onebit(wide, per_scale):
    """One line naming the onebit tensors whose partitions (one scale each) hold more than
    ONEBIT_WIDE_SCALE_ELEMENTS elements, and the recipe."""
    if not wide:
        return
    names = ", ".join("'%s'" % n for n in wide[:3]) + (", ..." if len(wide) > 3 else "")
    print("bitpush: CLAN with onebit: %d tensor(s) (%s) share one scale per %d elements; on "
          "layers this wide CLAN trails LANS, and compression.partition_bytes: %d (one scale per "
          "%d elements) keeps it level (docs/training.md, \"Wide layers\")"
          % (len(wide), names, per_scale, 4 * ONEBIT_WIDE_SCALE_ELEMENTS,
             ONEBIT_WIDE_SCALE_ELEMENTS), flush=True)


def _is_uncompressed(spec):
    return spec is None or str(spec).strip().split(":")[0] in ("", "none")


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
            residuals are not touched. In embedded mode the engine applies it inside each
            compression (set_error_feedback_decay); in daemon mode, and for methods with their
            own kind of error state, this optimizer scales the residuals through
            error_feedback_state / restore_error_feedback_state before the step's first push.
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
        _check_compression(compression, type(self).__name__)
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
        if self._ef_decays is None:
            if not self._bp_declared and not self._ef_restored:
                return  # nothing declared yet: every residual is still zero
            self._ef_decays = []
            # In daemon mode the residual is the node's and the daemon applies local rank 0's
            # restore; the node's other processes leave it to that one.
            if mode() == "daemon" and local_rank() != 0:
                return
            partition_bytes = cluster_partition_bytes()
            wide, per_scale = [], 0
            for p in self._bp_params:
                name = self._bp_name(p)
                if error_feedback_state(name) is None:
                    continue  # uncompressed, or the cluster keeps no worker residual
                onebit = _compressor_method(name) == "onebit"
                if onebit and partition_bytes is not None:
                    per_scale = max(1, partition_bytes // p.element_size())
                    if min(p.numel(), per_scale) > ONEBIT_WIDE_SCALE_ELEMENTS:
                        wide.append(name)
                gamma = self.error_feedback_decay
                if gamma is None:
                    gamma = ONEBIT_ERROR_FEEDBACK_DECAY if onebit else 1.0
                # The engine keeps a tensor's decay until it is told another, so it is told
                # this optimizer's even when it is 1 (Algorithm 4 as printed, and LANS): a
                # tensor an earlier optimizer decayed gets this one's.
                if not set_error_feedback_decay(name, gamma) and gamma != 1.0:
                    # The engine cannot apply it inside the compression (daemon mode, or a
                    # method with its own kind of error state): scaled here before each step.
                    self._ef_decays.append((name, gamma))
            if node_rank() == 0:
                _hint_wide_onebit(wide, per_scale)
        for name, gamma in self._ef_decays:
            r = error_feedback_state(name)
            restore_error_feedback_state(name, r.mul_(gamma))

    def _lans_options(self, group):
        o = _C.LansOptions()
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
        if not self._bp_sync_for_step():
            return loss
        start = time.monotonic_ns()
        self._ef_decay_pending = True
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
                    _C.lans_step_cuda(*args, stream)
                else:
                    _C.lans_step(*args)
        _trace_optimizer(start)
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
                         "node": node_rank() if residuals else None}
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
