"""BinSGDM (paper 004): the one-bit adaptive optimizer over a bitpush cluster.

Per parameter the worker keeps fp32 m and b, exponential moving averages (one factor beta) of
its own gradient g and of |g|; it binarises r = m / (b + eps) plus its error e stochastically
to +-1 (P(+1) = clamp((y + 1) / 2, 0, 1)), keeps e <- y - u, and pushes ceil(d/8) bytes with
no scale. Servers count the sign bits of the n pushes, average them, add their own error and
re-binarise; every worker pulls the same +-1 vector u and applies

    x <- x * (1 - lr * weight_decay) - lr * u          (decoupled weight decay, then the step)

All of that but the last line runs in C++: the compressor ``binsgdm`` and its worker state
(compressors/binsgdm/, the fused kernel of optimizers/binsgdm.h) inside the bitpush engine,
the popcount round on the servers. This module is the torch optimizer around it: it pushes
each parameter's gradient with the spec ``binsgdm:beta=...,eps=...,seed=...`` as soon as
backward produces it (the hooks of ``DistributedOptimizer``) and applies the pulled signs.

A tensor the cluster sends uncompressed (below ``compression.min_compress_bytes``: biases,
norms) has no one-bit path; its averaged gradient goes through BinSGDM without the quantiser
(the paper's SoftSignSGD, Algorithm 2): m, b over the averaged gradient, x <- x * (1 - lr *
wd) - lr * m / (b + eps).

The cluster must keep worker error feedback (``compression.error_feedback: both``, Algorithm 1
with the server's error too, or ``worker``): the worker state that holds m, b and e is the
method's error-feedback state.

Thread-safety: an optimizer belongs to the thread that runs forward/backward/step.
"""

import time

import torch

from .cluster_knobs import cluster_error_feedback
from .compression import _compressor_method
from .gradient_exchange import _GradientExchange
from .optimizer import _check_param
from .session import _trace_optimizer, node_rank

__all__ = ["BinSGDM"]


def _spec(beta, eps, seed):
    return "binsgdm:beta=%r,eps=%r,seed=%d" % (float(beta), float(eps), int(seed))


class BinSGDM(_GradientExchange, torch.optim.Optimizer):
    """BinSGDM (paper 004 Algorithm 1) over a bitpush cluster.

    Args:
        params: parameters or parameter groups (fp32, contiguous).
        lr: alpha, the step of every coordinate (the update is exactly +-lr per element);
            per group, LR schedulers apply. The paper's CNN rule is 0.001 x batch / 256.
        beta: the one EMA factor of m and b (per group; fixed at construction: it is part of
            the tensor's compressor spec). Paper: 0.95 (CNN, ViT), 0.9 (BERT), 0.99 (LSTM).
        eps: added to b in r = m / (b + eps) (per group, fixed at construction).
        weight_decay: lambda, decoupled (AdamW style), per group.
        seed: the random streams of the stochastic binarisation (worker w, key, round).
        named_parameters: (name, param) pairs for the tensor names (else "param.<index>").
        backward_passes_per_step: backward passes accumulated locally before the push.
    """

    def __init__(self, params, lr=1e-3, beta=0.95, eps=1e-8, weight_decay=0.0, seed=0,
                 named_parameters=None, backward_passes_per_step=1):
        if not lr >= 0.0:
            raise ValueError("lr must be >= 0, got %r" % (lr,))
        if not 0.0 < beta < 1.0:
            raise ValueError("beta must be in (0, 1), got %r" % (beta,))
        if not eps > 0.0:
            raise ValueError("eps must be > 0, got %r" % (eps,))
        if not weight_decay >= 0.0:
            raise ValueError("weight_decay must be >= 0, got %r" % (weight_decay,))
        if int(seed) < 0:
            raise ValueError("seed must be >= 0, got %r" % (seed,))
        defaults = dict(lr=lr, beta=float(beta), eps=float(eps),
                        weight_decay=float(weight_decay))
        torch.optim.Optimizer.__init__(self, params, defaults)
        for i, p in enumerate(q for g in self.param_groups for q in g["params"]):
            _check_param(p, i, named_parameters)
        for g in self.param_groups:
            if not 0.0 < g["beta"] < 1.0 or not g["eps"] > 0.0:
                raise ValueError("BinSGDM: a parameter group's beta must be in (0, 1) and eps "
                                 "> 0, got beta=%r eps=%r" % (g["beta"], g["eps"]))
        self.seed = int(seed)
        ef = cluster_error_feedback()
        if ef is not None and ef not in ("worker", "both"):
            raise ValueError(
                "BinSGDM keeps m, b and its error in the worker's error-feedback state, but the "
                "cluster runs compression.error_feedback: %s; set compression.error_feedback: "
                "both (paper 004 Algorithm 1, the server's error too) or worker in the cluster "
                "YAML" % ef)
        # Each parameter's spec, from its group's beta and eps at construction.
        self._specs = {}
        for g in self.param_groups:
            for p in g["params"]:
                self._specs[id(p)] = _spec(g["beta"], g["eps"], self.seed)
        self._compressed = None  # id(p) -> bool, once declared
        self._exchange_init(named_parameters, None, backward_passes_per_step, "BinSGDM")

    def _bp_spec(self, p):
        return self._specs[id(p)]

    def _is_compressed(self, p):
        if self._compressed is None:
            self._compressed = {id(q): _compressor_method(self._bp_name(q)) == "binsgdm"
                                for q in self._bp_params}
        return self._compressed[id(p)]

    @torch.no_grad()
    def step(self, closure=None):
        """Synchronizes (pushes every gradient, pulls the servers' signs) unless inside
        skip_synchronize(), then applies x <- x (1 - lr wd) - lr u to every parameter."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self._bp_sync_for_step():
            return loss
        start = time.monotonic_ns()
        for group in self.param_groups:
            # lr as the fp32 the servers' signs are scaled by; the decay factor from it in
            # double, rounded once (optimizers/binsgdm.h: the reference's exact arithmetic).
            lr = torch.tensor(float(group["lr"]), dtype=torch.float32).item()
            wd = float(group["weight_decay"])
            beta, eps = group["beta"], group["eps"]
            for p in group["params"]:
                if p.grad is None or not p.requires_grad:
                    continue
                if self._is_compressed(p):
                    update = p.grad  # the servers' +-1 signs
                else:
                    # SoftSignSGD on the averaged gradient (no one-bit path for this tensor).
                    state = self.state[p]
                    if len(state) == 0:
                        state["m"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                        state["b"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                    m, b = state["m"], state["b"]
                    m.mul_(beta).add_(p.grad, alpha=1.0 - beta)
                    b.mul_(beta).add_(p.grad.abs(), alpha=1.0 - beta)
                    update = m / (b + eps)
                if wd != 0.0:
                    p.mul_(float(1.0 - lr * wd))
                p.add_(update, alpha=-lr)
        _trace_optimizer(start)
        return loss

    def state_dict(self):
        sd = super().state_dict()
        # m, b and e of the one-bit tensors live in the engine (the worker state of binsgdm);
        # the servers' errors stay on the servers.
        states = self._bp_ef_state()
        sd["bitpush"] = {"optimizer": "BinSGDM", "seed": self.seed,
                         "names": [self._bp_name(p) for p in self._bp_params],
                         "ef_residuals": states,
                         "node": node_rank() if states else None}
        return sd

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        meta = self._bp_check_meta(state_dict.pop("bitpush", None))
        super().load_state_dict(state_dict)
        if meta is not None:
            self._bp_restore_ef_state(meta.get("ef_residuals"))
        for group in self.param_groups:
            for p in group["params"]:
                st = self.state.get(p)
                if not st:
                    continue
                for k in ("m", "b"):
                    if k in st:
                        st[k] = st[k].to(device=p.device, dtype=torch.float32).contiguous()
