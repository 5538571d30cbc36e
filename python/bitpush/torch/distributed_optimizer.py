"""DistributedOptimizer: any torch optimizer, its gradients averaged over the bitpush workers
before its step() (gradient_exchange.py's hooks; the averaged gradient is written into
``p.grad`` and the inner optimizer's ``step()`` runs).

When the cluster YAML places parameters on the servers (optimizer.placement: server, or an
optimizer.overrides pattern), the result is a ServerOptimizer running the same rule there
(SGD, AdamW, Adam without weight decay, LANS, CLAN); parameters left on the workers are stepped
by the wrapped optimizer's class.

Thread-safety: an optimizer belongs to the thread that runs forward/backward/step.
docs/training.md and docs/optimizer.md are the user's guides.
"""
import time

import torch

from .cluster_knobs import _cluster_placements, cluster_compression, placement_of
from .errors import BitpushError
from .gradient_exchange import _GradientExchange
from .optimizer import CLAN, LANS
from .server_optimizer import ServerOptimizer
from .session import _trace_optimizer

__all__ = ["DistributedOptimizer"]


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
        if self._bp_sync_for_step():
            start = time.monotonic_ns()
            super(self.__class__, self).step()
            _trace_optimizer(start)
        return loss

    def zero_grad(self, set_to_none=False):
        if self._bp_handles:
            raise BitpushError("DistributedOptimizer.zero_grad() while gradients are being "
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
    named_parameters = None if named_parameters is None else list(named_parameters)
    where = _placements(optimizer, named_parameters)
    if any(w == "server" for w in where.values()):
        if isinstance(optimizer, _GradientExchange):
            optimizer.remove_hooks()  # CLAN / LANS: their gradients go to the servers instead
        return _from_torch_optimizer(optimizer, named_parameters, compression,
                                     backward_passes_per_step, where)
    if isinstance(optimizer, (CLAN, _GradientExchange)):
        raise TypeError("%s already exchanges gradients over bitpush; do not wrap it in "
                        "DistributedOptimizer" % type(optimizer).__name__)
    _steer_adam(optimizer, compression)
    methods = {k: v for k, v in _DistributedOptimizer.__dict__.items()
               if k not in ("__dict__", "__weakref__")}
    cls = type(optimizer.__class__.__name__, (_GradientExchange, optimizer.__class__), methods)
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step)


def _steer_adam(optimizer, compression):
    """Adam / AdamW over onebit trails uncompressed Adam by more than a point in the model zoo,
    where sdp4bit holds (docs/training.md, "Compressed Adam"): one line says so."""
    spec = compression if compression is not None else cluster_compression()
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        if spec is not None and str(spec).split(":")[0] == "onebit":
            print("bitpush: DistributedOptimizer(%s) with onebit trails uncompressed %s by "
                  "1-4 points in the model zoo; sdp4bit (or bitpush.torch.BinSGDM) stays within "
                  "a point (docs/training.md, \"Compressed Adam\")"
                  % (type(optimizer).__name__, type(optimizer).__name__), flush=True)


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
