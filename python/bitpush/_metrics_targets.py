"""The metrics endpoints of a cluster YAML (docs/metrics.md): which process listens where.

One list, used by `bitpush metrics-config` (the Prometheus scrape configuration) and
`bitpush top` (the terminal view): the scheduler at metrics.port, server r at port + 1 + r,
worker node n at port + 1 + S + n, each on the host of its cluster address.
"""
from typing import List, NamedTuple, Optional


class Target(NamedTuple):
    role: str            # "scheduler", "server" or "worker"
    rank: Optional[int]  # None for the scheduler
    host: str            # the host its metrics listen on (as reached from this machine)
    port: int

    @property
    def label(self) -> str:
        return self.role if self.rank is None else "%s %d" % (self.role, self.rank)

    @property
    def url(self) -> str:
        host = "[%s]" % self.host if ":" in self.host else self.host
        return "http://%s:%d/metrics" % (host, self.port)


def _host_of(address: str, bind_address: str) -> str:
    """The host a process of `address` serves its metrics on: its cluster address's host (an
    ipc:// or inproc:// address is this machine), or bind_address when that names one
    interface of a single-host cluster."""
    if address.startswith("tcp://"):
        rest = address[len("tcp://"):]
        host = rest[1:rest.index("]")] if rest.startswith("[") else rest.rsplit(":", 1)[0]
    else:
        host = "127.0.0.1"
    if bind_address not in ("0.0.0.0", "::", "") and host in ("127.0.0.1", "localhost", "::1"):
        return bind_address
    return host


def targets(config: dict) -> List[Target]:
    """Every metrics endpoint of the parsed cluster YAML (`_C.load_cluster_config`'s dict), in
    the order scheduler, servers, workers; [] when metrics.port is 0 (metrics off)."""
    knobs = config["knobs"]
    port = int(knobs.get("metrics.port", "0") or 0)
    if port == 0:
        return []
    bind = knobs.get("metrics.bind_address", "127.0.0.1")
    out = [Target("scheduler", None, _host_of(config["scheduler"], bind), port)]
    servers = config["servers"]
    for r, address in enumerate(servers):
        out.append(Target("server", r, _host_of(address, bind), port + 1 + r))
    for n, address in enumerate(config["workers"]):
        out.append(Target("worker", n, _host_of(address, bind), port + 1 + len(servers) + n))
    return out
