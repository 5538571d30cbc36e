"""The optimizer on the servers: ``bitpush.torch.ServerOptimizer`` (docs/optimizer.md,
"Server-side optimizer").

    opt = bp.ServerOptimizer(model.parameters(), rule="adamw", lr=1e-3, weight_decay=0.01,
                             named_parameters=model.named_parameters(),
                             compression="sdp4bit", pull=bp.QWD)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    for x, y in data:
        opt.zero_grad()
        loss_fn(model(x), y).backward()   # hooks push each gradient with the group's lr
        opt.step()                        # waits: the parameters now hold the new weights
        sched.step()

The servers hold every parameter's fp32 master weights and optimizer state (sgd with momentum
/ nesterov, adamw, or lans — CLAN's update on the averaged gradient), apply the update after
each round's average, and send the weights back: as the difference against the workers' copy
(every worker's parameters stay bit-identical to the servers' mirror; SDP4Bit's qWD with
``pull=QWD``) or raw. The workers keep no optimizer state (``opt.state`` stays empty).

Construction is collective (every worker, the same parameters in the same order): it declares
each parameter and installs rank 0's values on the servers; every worker's parameters are then
overwritten with them. Learning-rate schedulers work as with any torch optimizer: the lr of a
parameter's group when its gradient is pushed reaches the servers with it (the other
hyper-parameters are fixed at construction). ``state_dict()`` holds the servers' state (read
from them), ``load_state_dict()`` (collective) writes it back and pulls the weights, so a
resumed job continues bit for bit; ``bitpush.torch.save_checkpoint`` / ``load_checkpoint`` do
this for the whole job.

``DistributedOptimizer(opt)`` returns a ServerOptimizer when the cluster YAML says
``optimizer.placement: server`` (SGD, AdamW, Adam without weight decay, LANS and CLAN map to a
server rule; other optimizers are refused by name; distributed_optimizer.py).

Embedded mode only (one training process per worker node); CUDA parameters are staged through
host memory (the worker's copy of the weights lives on the host).

Thread-safety: as any torch optimizer: one training thread.
"""
import torch

from . import handles
from .broadcast import broadcast_parameters
from .collectives import barrier
from .compression import _announce_compression, _check_compression
from .declarations import declare
from .errors import BitpushError
from .gradient_exchange import _GradientExchange
from .server_weights import (_push_pull_step_async, init_server_weights, pull_server_weights,
                             restore_server_optimizer_state, server_optimizer_state)
from .session import is_initialized, mode, node_rank, rank

__all__ = ["ServerOptimizer", "QWD"]


# SDP4Bit's quantisation of weight differences (paper 002's qWD): INT4, groups of 2048,
# stochastic rounding once at the server.
QWD = "sdp4bit:hadamard=off,group=2048"

_RULES = ("sgd", "adamw", "lans")


class ServerOptimizer(_GradientExchange, torch.optim.Optimizer):
    """A torch optimizer whose update runs on the bitpush servers (see the module doc).

    Args:
        params: parameters or parameter groups (fp32, contiguous; CPU or CUDA).
        rule: "sgd", "adamw" or "lans".
        lr, momentum, nesterov (sgd), betas, eps (adamw, lans; eps default 1e-8 for adamw,
            1e-6 for lans), weight_decay: as torch.optim.SGD / AdamW and bitpush's LANS.
        named_parameters: (name, tensor) pairs naming the parameters (default param.<i>).
        compression: the gradients' compressor spec; None = the cluster's.
        pull: how the weights come back, a compressor spec (QWD for SDP4Bit); None = the
            cluster's optimizer.pull. pull_form: "difference", "raw" or None (the cluster's
            optimizer.pull_form).
        backward_passes_per_step: gradients accumulated over this many backward passes are
            pushed once.
    """

    def __init__(self, params, rule="lans", lr=1e-3, momentum=0.0, nesterov=False,
                 betas=(0.9, 0.999), eps=None, weight_decay=0.0, named_parameters=None,
                 compression=None, pull=None, pull_form=None, backward_passes_per_step=1,
                 _local=None):
        if rule not in _RULES:
            raise ValueError("ServerOptimizer: rule %r; the servers run %s"
                             % (rule, ", ".join(_RULES)))
        if eps is None:
            eps = 1e-6 if rule == "lans" else 1e-8
        if pull is not None:
            _check_compression(pull, "ServerOptimizer pull")
        if pull_form not in (None, "auto", "difference", "raw"):
            raise ValueError("ServerOptimizer: pull_form %r; expected 'difference', 'raw' or "
                             "None (the cluster's optimizer.pull_form)" % (pull_form,))
        defaults = dict(lr=lr, momentum=momentum, nesterov=nesterov, betas=tuple(betas),
                        eps=eps, weight_decay=weight_decay)
        torch.optim.Optimizer.__init__(self, params, defaults)
        self.rule = rule
        self.pull = pull
        self.pull_form = pull_form
        self.compression = compression
        for i, p in enumerate(p for g in self.param_groups for p in g["params"]):
            if p.dtype != torch.float32 or not p.is_contiguous() or p.is_sparse or \
                    p.device.type not in ("cpu", "cuda"):
                raise ValueError("ServerOptimizer: parameter %d is %s %s on %s; the servers keep "
                                 "fp32 master weights of dense, contiguous CPU or CUDA tensors"
                                 % (i, "a contiguous" if p.is_contiguous() else "a strided",
                                    p.dtype, p.device))
        if is_initialized() and mode() != "embedded":
            raise BitpushError("ServerOptimizer: this process runs in %s mode; the optimizer on "
                               "the servers needs an embedded worker (one training process per "
                               "worker node, BITPUSH_MODE=embedded)" % mode())
        self._exchange_init(named_parameters, compression, backward_passes_per_step,
                            "ServerOptimizer")
        self._bp_group = {id(p): g for g in self.param_groups for p in g["params"]}
        # DistributedOptimizer under optimizer.overrides: a torch optimizer over the parameters
        # placed on the workers (their groups are this optimizer's too); their gradients are
        # averaged into p.grad and it steps them here.
        self._local = _local
        self._bp_local = set() if _local is None else \
            {id(p) for g in _local.param_groups for p in g["params"]}
        # The worker's copy of each parameter's weights: the parameter itself on the CPU, a
        # pinned host copy for a CUDA parameter.
        self._bp_host = {}
        for p in self._bp_params:
            if p.is_cuda:
                self._bp_host[id(p)] = torch.empty(p.shape, dtype=torch.float32,
                                                   pin_memory=True).copy_(p.detach())
        # Collective, in parameter order: declare, then rank 0's weights to the servers and the
        # servers' copy into every worker's parameters.
        self._bp_declare_all()
        self._bp_weights_from_servers(init_server_weights)
        if self._bp_local:
            # The worker-placed parameters start from rank 0's too, as the servers' do.
            broadcast_parameters([(self._bp_name(p), p) for p in self._bp_params
                                     if id(p) in self._bp_local], root_rank=0)
        self._bp_declared = True
        _announce_compression([self._bp_name(p) for p in self._bp_params])

    def _bp_weights_from_servers(self, call):
        """Every server-placed parameter, in order, through `call(name, weights)`
        (init_server_weights or pull_server_weights), which leaves the servers' copy in the
        host weights; a CUDA parameter then takes them."""
        for p in self._bp_params:
            if id(p) in self._bp_local:
                continue
            w = self._bp_weights(p)
            call(self._bp_name(p), w)
            if p.is_cuda:
                with torch.no_grad():
                    p.copy_(w)

    def _bp_weights(self, p):
        return self._bp_host.get(id(p), p.data)

    def _bp_server_options(self, p):
        g = self._bp_group[id(p)]
        beta1, beta2 = g["betas"]
        return {"rule": self.rule, "weight_decay": float(g["weight_decay"]),
                "momentum": float(g["momentum"]), "nesterov": bool(g["nesterov"]),
                "beta1": float(beta1), "beta2": float(beta2), "eps": float(g["eps"]),
                "pull": self.pull, "pull_form": self.pull_form}

    def _bp_declare_all(self):
        for p in self._bp_params:
            if id(p) in self._bp_local:
                declare(self._bp_name(p), p.detach(), compression=self._bp_spec(p),
                        average=True)
            else:
                declare(self._bp_name(p), self._bp_weights(p), compression=self._bp_spec(p),
                        average=True, server_optimizer=self._bp_server_options(p))

    def _bp_start(self, p):
        if id(p) in self._bp_local:
            _GradientExchange._bp_start(self, p)  # the average into p.grad
            return
        g = p.grad
        if g is None:
            # Every key steps every round: a parameter without a gradient pushes zeros.
            g = torch.zeros(p.shape, dtype=torch.float32)
        elif p.is_cuda or g.dtype != torch.float32 or not g.is_contiguous():
            g = g.detach().to("cpu", torch.float32).contiguous()
        lr = float(self._bp_group[id(p)]["lr"])
        handle = _push_pull_step_async(g, self._bp_weights(p), self._bp_name(p), lr)
        self._bp_handles[id(p)] = (p, handle)

    def synchronize(self):
        """Pushes the gradients backward did not (zeros for a parameter without one), waits
        for every parameter's round and leaves the new weights in the parameters. Raises
        BitpushError when the cluster failed (with compression.non_finite: skip, a step with a
        non-finite gradient on any worker is skipped instead: nothing pushed)."""
        self._bp_step_skipped = False
        if self._bp_skip_non_finite and not self._bp_check_finite():
            self._bp_synchronized = True
            return
        for p in self._bp_params:
            if id(p) not in self._bp_handles:
                self._bp_start(p)
        try:
            for p, handle in list(self._bp_handles.values()):
                out = handles.synchronize(handle)
                if id(p) in self._bp_local:
                    if out is not None and out.data_ptr() != p.grad.data_ptr():
                        with torch.no_grad():
                            p.grad.copy_(out)
                elif p.is_cuda:
                    with torch.no_grad():
                        p.copy_(self._bp_host[id(p)], non_blocking=False)
        finally:
            self._bp_handles.clear()
            for p in self._bp_params:
                self._bp_delay[id(p)] = self._bp_passes
        self._bp_synchronized = True

    @torch.no_grad()
    def step(self, closure=None):
        """Completes the step: the servers' update of every parameter is in it on return."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._bp_sync_for_step() and self._local is not None:
            self._local.step()
        return loss

    def zero_grad(self, set_to_none=False):
        if self._bp_handles:
            raise BitpushError("ServerOptimizer.zero_grad() while gradients are being pushed: "
                               "call step() or synchronize() first")
        return super().zero_grad(set_to_none=set_to_none)

    def server_state(self):
        """{name: [bytes per partition]}: the servers' optimizer state of every parameter."""
        return {self._bp_name(p): server_optimizer_state(self._bp_name(p))
                for p in self._bp_params if id(p) not in self._bp_local}

    def state_dict(self):
        sd = super().state_dict()
        residuals = self._bp_ef_state()
        sd["bitpush"] = {"rule": self.rule,
                         "names": [self._bp_name(p) for p in self._bp_params],
                         "ef_residuals": residuals,
                         "node": node_rank() if residuals else None}
        sd["bitpush_server_state"] = self.server_state()
        if self._local is not None:
            sd["bitpush_local"] = self._local.state_dict()
        return sd

    def load_state_dict(self, state_dict):
        """Collective: every worker calls it with the same state. Restores the hyper-parameters
        here, the servers' state (from rank 0) and every worker's weights from the servers."""
        state_dict = dict(state_dict)
        meta = state_dict.pop("bitpush", None) or {}
        server = state_dict.pop("bitpush_server_state", None)
        local = state_dict.pop("bitpush_local", None)
        names = [self._bp_name(p) for p in self._bp_params]
        if meta.get("rule", self.rule) != self.rule:
            raise ValueError("load_state_dict: the checkpoint's optimizer ran rule %r on the "
                             "servers, this one runs %r" % (meta["rule"], self.rule))
        if meta.get("names") is not None and list(meta["names"]) != names:
            raise ValueError("load_state_dict: the checkpoint's tensors %r are not this "
                             "optimizer's %r" % (list(meta["names"])[:4], names[:4]))
        super().load_state_dict(state_dict)
        self._bp_group = {id(p): g for g in self.param_groups for p in g["params"]}
        if local is not None and self._local is not None:
            self._local.load_state_dict(local)
        if server is not None:
            names = [self._bp_name(p) for p in self._bp_params if id(p) not in self._bp_local]
            missing = [n for n in names if n not in server]
            if missing:
                raise ValueError("load_state_dict: the checkpoint has no server state for '%s'"
                                 % missing[0])
            if rank() == 0:
                for n in names:
                    restore_server_optimizer_state(n, server[n])
            barrier()
            self._bp_weights_from_servers(pull_server_weights)
        self._bp_restore_ef_state(meta.get("ef_residuals"))
