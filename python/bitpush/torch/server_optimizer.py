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
server rule; other optimizers are refused by name).

Embedded mode only (one training process per worker node); CUDA parameters are staged through
host memory (the worker's copy of the weights lives on the host).

Thread-safety: as any torch optimizer: one training thread.
"""

import fnmatch
import importlib

import torch

from .optimizer import LANS, CLAN, _GradientExchange, _cluster_knob, _error_cls

__all__ = ["ServerOptimizer", "QWD", "cluster_optimizer_placement", "cluster_optimizer_pull"]

# SDP4Bit's quantisation of weight differences (paper 002's qWD): INT4, groups of 2048,
# stochastic rounding once at the server.
QWD = "sdp4bit:hadamard=off,group=2048"

_RULES = ("sgd", "adamw", "lans")


def _bp():
    return importlib.import_module("bitpush.torch")


def cluster_optimizer_placement():
    """The cluster's optimizer.placement ("worker" or "server"), or None when no cluster config
    is known (read like cluster_error_feedback())."""
    return _cluster_knob("optimizer.placement")


def _cluster_placements():
    """(placement, [(pattern, placement), ...]) of the cluster's YAML, or (None, [])."""
    placement = _cluster_knob("optimizer.placement")
    if placement is None:
        return None, []
    path = None
    fn = getattr(_bp(), "config_path", None)
    try:
        path = fn() if callable(fn) else None
    except Exception:  # not initialised
        path = None
    if not path:
        path = importlib.import_module("bitpush._env").bootstrap().config
    overrides = importlib.import_module("bitpush._C").load_cluster_config(path)[
        "optimizer_overrides"]
    return placement, [tuple(o) for o in overrides]


def placement_of(name, placement, overrides):
    """The placement of parameter `name`: the first override whose pattern matches it (fnmatch,
    as the C++ side matches compression.overrides), else `placement`."""
    for pattern, where in overrides:
        if fnmatch.fnmatchcase(name, pattern):
            return where
    return placement


def cluster_optimizer_pull():
    """The cluster's optimizer.pull (canonical compressor spec): how a ServerOptimizer built
    without `pull` receives the weights; None when no cluster config is known."""
    return _cluster_knob("optimizer.pull")


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
            _bp()._check_compression(pull, "ServerOptimizer pull")
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
        bp = _bp()
        if bp.is_initialized() and bp.mode() != "embedded":
            raise _error_cls()("ServerOptimizer: this process runs in %s mode; the optimizer on "
                               "the servers needs an embedded worker (one training process per "
                               "worker node, BITPUSH_MODE=embedded)" % bp.mode())
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
        self._bp_weights_from_servers(bp.init_server_weights)
        if self._bp_local:
            # The worker-placed parameters start from rank 0's too, as the servers' do.
            bp.broadcast_parameters([(self._bp_name(p), p) for p in self._bp_params
                                     if id(p) in self._bp_local], root_rank=0)
        self._bp_declared = True
        bp._announce_compression([self._bp_name(p) for p in self._bp_params])

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
        bp = _bp()
        for p in self._bp_params:
            if id(p) in self._bp_local:
                bp.declare(self._bp_name(p), p.detach(), compression=self._bp_spec(p),
                           average=True)
            else:
                bp.declare(self._bp_name(p), self._bp_weights(p), compression=self._bp_spec(p),
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
        handle = _bp()._push_pull_step_async(g, self._bp_weights(p), self._bp_name(p), lr)
        self._bp_handles[id(p)] = (p, handle)

    def synchronize(self):
        """Pushes the gradients backward did not (zeros for a parameter without one), waits
        for every parameter's round and leaves the new weights in the parameters. Raises
        BitpushError when the cluster failed."""
        for p in self._bp_params:
            if id(p) not in self._bp_handles:
                self._bp_start(p)
        bp = _bp()
        try:
            for p, handle in list(self._bp_handles.values()):
                out = bp.synchronize(handle)
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
        self._bp_sync_for_step()
        if self._local is not None:
            self._local.step()
        return loss

    def zero_grad(self, set_to_none=False):
        if self._bp_handles:
            raise _error_cls()("ServerOptimizer.zero_grad() while gradients are being pushed: "
                               "call step() or synchronize() first")
        return super().zero_grad(set_to_none=set_to_none)

    def server_state(self):
        """{name: [bytes per partition]}: the servers' optimizer state of every parameter."""
        bp = _bp()
        return {self._bp_name(p): bp.server_optimizer_state(self._bp_name(p))
                for p in self._bp_params if id(p) not in self._bp_local}

    def state_dict(self):
        sd = super().state_dict()
        residuals = self._bp_ef_state()
        sd["bitpush"] = {"rule": self.rule,
                         "names": [self._bp_name(p) for p in self._bp_params],
                         "ef_residuals": residuals,
                         "node": _bp().node_rank() if residuals else None}
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
        bp = _bp()
        if local is not None and self._local is not None:
            self._local.load_state_dict(local)
        if server is not None:
            names = [self._bp_name(p) for p in self._bp_params if id(p) not in self._bp_local]
            missing = [n for n in names if n not in server]
            if missing:
                raise ValueError("load_state_dict: the checkpoint has no server state for '%s'"
                                 % missing[0])
            if bp.rank() == 0:
                for n in names:
                    bp.restore_server_optimizer_state(n, server[n])
            bp.barrier()
            self._bp_weights_from_servers(bp.pull_server_weights)
        self._bp_restore_ef_state(meta.get("ef_residuals"))


def _server_rule(optimizer):
    """(rule, group fields) of a torch optimizer the servers can run, or a TypeError."""
    cls = type(optimizer)
    if isinstance(optimizer, (LANS, CLAN)):
        return "lans", ("lr", "betas", "eps", "weight_decay")
    if cls is torch.optim.SGD or isinstance(optimizer, torch.optim.SGD):
        for g in optimizer.param_groups:
            if g.get("dampening", 0) != 0 or g.get("maximize", False):
                raise TypeError("optimizer.placement server: SGD with dampening or maximize has "
                                "no server rule")
        return "sgd", ("lr", "momentum", "nesterov", "weight_decay")
    if isinstance(optimizer, torch.optim.AdamW):
        if any(g.get("amsgrad") or g.get("maximize", False) for g in optimizer.param_groups):
            raise TypeError("optimizer.placement server: AdamW with amsgrad or maximize has no "
                            "server rule")
        return "adamw", ("lr", "betas", "eps", "weight_decay")
    if isinstance(optimizer, torch.optim.Adam):
        if any(g.get("weight_decay", 0) != 0 or g.get("amsgrad") or g.get("maximize", False)
               for g in optimizer.param_groups):
            raise TypeError("optimizer.placement server: Adam with weight_decay (an L2 term, "
                            "not AdamW's decoupled decay), amsgrad or maximize has no server "
                            "rule; use torch.optim.AdamW")
        return "adamw", ("lr", "betas", "eps", "weight_decay")
    raise TypeError("optimizer.placement server: the servers run SGD, AdamW (and Adam without "
                    "weight decay), LANS and CLAN; %s has no server rule" % cls.__name__)


def _placements(optimizer, named_parameters):
    """{id(param): "worker" | "server"} under the YAML's optimizer.placement and
    optimizer.overrides (parameter names as DistributedOptimizer names them)."""
    placement, overrides = _cluster_placements()
    params = [p for g in optimizer.param_groups for p in g["params"]]
    names = {}
    if named_parameters is not None:
        for name, p in named_parameters:
            names.setdefault(id(p), name)
    return {id(p): placement_of(names.get(id(p), "param.%d" % i), placement or "worker",
                                overrides)
            for i, p in enumerate(params)}


def _from_torch_optimizer(optimizer, named_parameters, compression, backward_passes_per_step,
                          where):
    """DistributedOptimizer with parameters placed on the servers (`where`: _placements)."""
    rule, fields = _server_rule(optimizer)
    if named_parameters is None:
        # The names DistributedOptimizer gives (the wrapped optimizer's order), kept although
        # the groups below are split.
        named_parameters = [("param.%d" % i, p) for i, p in
                            enumerate(p for g in optimizer.param_groups for p in g["params"])]
    server_groups, local_groups = [], []
    for g in optimizer.param_groups:
        on_server = [p for p in g["params"] if where[id(p)] == "server"]
        on_worker = [p for p in g["params"] if where[id(p)] != "server"]
        hyper = {k: g[k] for k in fields if k in g}
        if on_server:
            server_groups.append({"params": on_server, **hyper})
        if on_worker:
            # The wrapped optimizer's own group (every key it reads), over these parameters.
            local_groups.append({**{k: v for k, v in g.items() if k != "params"},
                                 "params": on_worker})
    if compression is None and isinstance(optimizer, CLAN):
        compression = optimizer.compression
    local = None
    if local_groups:
        # The same class and defaults, over the worker-placed parameters; its groups join the
        # ServerOptimizer's (shared dicts: an LR scheduler's change reaches both).
        if isinstance(optimizer, CLAN):
            raise TypeError("optimizer.overrides: CLAN / LANS with some parameters on the "
                            "workers is not supported; place all on the servers or none")
        local = type(optimizer)(local_groups, **optimizer.defaults)
    opt = ServerOptimizer(server_groups + local_groups, rule=rule,
                          named_parameters=named_parameters, compression=compression,
                          backward_passes_per_step=backward_passes_per_step, _local=local)
    return opt
