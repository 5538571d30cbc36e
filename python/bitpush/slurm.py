"""`bitpush launch --slurm`: the cluster of a Slurm allocation (docs/launch.md, "Slurm").

Inside an allocation the launcher needs no host list: the Slurm environment names the nodes,
their tasks and GPUs, and this module turns it into an ordinary cluster YAML that the rest of
the launcher uses unchanged.

    job = read_job(env)                       # SlurmJob, or SlurmError naming the variable
    addresses = resolve_nodes(job.nodes)      # one IPv4 address per node
    text = cluster_yaml(job, addresses, overlay_text)   # the effective cluster YAML

Placement (the rule docs/launch.md states): the scheduler on the first node of the node list,
`servers_per_node` servers on every node, one worker node per node whose training processes
are its GPUs (one per GPU), else its Slurm tasks. Roles listen at their node's IPv4 address
(`resolve_nodes`) on ports from a block of 10 per job below Linux's ephemeral range, chosen by
the job id (`port_base`).

Two phases, told apart by SLURM_STEP_ID:
  - outside a job step (the batch script, or an salloc shell that may run on a login node),
    `srun_argv` gives the `srun` command that starts one launcher per node, passing the job's
    tasks per node in BITPUSH_SLURM_TASKS_PER_NODE (srun replaces SLURM_TASKS_PER_NODE with
    the step's own, one per node);
  - inside a step, each launcher builds the same YAML from the same variables and starts the
    roles of its own node (SLURM_NODEID in the step's node list).

Pure functions over a mapping of variables (the caller passes `_env.slurm_environ()`), so the
tests feed them any environment. Thread-safety: no state.
"""
import atexit
import os
import re
import shutil
import socket
import sys
from dataclasses import dataclass, field
from typing import List, Mapping, Optional

from . import _env

__all__ = ["SlurmError", "SlurmJob", "expand_hostlist", "expand_counts", "read_job",
           "resolve_nodes", "port_base", "cluster_section", "merge_overlay", "add_worker_socket",
           "cluster_yaml", "yaml_path", "socket_path", "srun_argv", "describe", "setup",
           "PORT_FIRST", "PORT_BLOCK", "PORT_BLOCKS", "MAX_SERVERS_PER_NODE"]

# Ports: job j uses PORT_FIRST + PORT_BLOCK * (j mod PORT_BLOCKS) .. + PORT_BLOCK - 1, i.e.
# 20000..31999, below Linux's ephemeral range (32768..60999): the kernel hands ports of that
# range to outgoing connections, so a daemon could find its port taken. Within the block:
# +0 the scheduler (first node), +1 the node's worker, +2.. its servers.
PORT_FIRST = 20000
PORT_BLOCK = 10
PORT_BLOCKS = 1200
MAX_SERVERS_PER_NODE = PORT_BLOCK - 2

# The largest allocation the host-list parser expands (a typo like n[1-99999999] should fail,
# not exhaust memory).
MAX_NODES = 65536

# Set by the launcher for the srun step it starts: the job's SLURM_TASKS_PER_NODE.
TASKS_VAR = _env.SLURM_TASKS_PER_NODE

_HOST_CHARS = re.compile(r"^[A-Za-z0-9._-]+$")


class SlurmError(ValueError):
    """The Slurm environment cannot describe a cluster; the message names the variable."""


# -- Slurm's compressed syntaxes ------------------------------------------------------------

def _split_top(text):
    """Splits at commas outside brackets."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError("nested '['")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError("']' without '['")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise ValueError("'[' without ']'")
    parts.append("".join(cur))
    return parts


def _expand_range_list(body):
    """'01-03,7' -> ['01', '02', '03', '7']; a range keeps the width of its lower bound."""
    out = []
    for item in body.split(","):
        item = item.strip()
        lo, sep, hi = item.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError("bad range '%s' in '[%s]'" % (item, body))
        if not sep:
            out.append(lo)
            continue
        a, b = int(lo), int(hi)
        if b < a:
            raise ValueError("range '%s' runs backwards" % item)
        if b - a + 1 > MAX_NODES:
            raise ValueError("range '%s' has more than %d hosts" % (item, MAX_NODES))
        out.extend(str(v).zfill(len(lo)) for v in range(a, b + 1))
    return out


def _expand_entry(entry):
    """'r[1-2]-n[01-02]' -> r1-n01, r1-n02, r2-n01, r2-n02 (brackets left to right)."""
    names = [""]
    rest = entry
    while rest:
        open_at = rest.find("[")
        if open_at < 0:
            literal, rest = rest, ""
            names = [n + literal for n in names]
            continue
        close_at = rest.find("]", open_at)
        literal, body, rest = rest[:open_at], rest[open_at + 1:close_at], rest[close_at + 1:]
        if not body:
            raise ValueError("empty '[]'")
        names = [n + literal + v for n in names for v in _expand_range_list(body)]
        if len(names) > MAX_NODES:
            raise ValueError("more than %d hosts" % MAX_NODES)
    return names


def expand_hostlist(text, var="SLURM_JOB_NODELIST"):
    """Slurm's compressed host list ('gpu[01-03,07],cpu5') as a list of names, in order.

    Entries are separated by commas outside brackets; `[...]` holds numbers and ranges
    `a-b` (zero-padded to the width of `a`); several brackets in one entry expand left to
    right. Raises SlurmError naming `var` for malformed text, an empty list or a host listed
    twice."""
    raw = "" if text is None else str(text).strip()
    if not raw:
        raise SlurmError("%s is empty" % var)
    hosts = []
    try:
        for entry in _split_top(raw):
            entry = entry.strip()
            if not entry:
                raise ValueError("empty entry")
            for name in _expand_entry(entry):
                if not _HOST_CHARS.match(name):
                    raise ValueError("'%s' is not a host name" % name)
                hosts.append(name)
                if len(hosts) > MAX_NODES:
                    raise ValueError("more than %d hosts" % MAX_NODES)
    except ValueError as e:
        raise SlurmError("%s=%r: not a Slurm host list: %s" % (var, raw, e)) from None
    seen = set()
    for h in hosts:
        if h in seen:
            raise SlurmError("%s=%r: host %s is listed twice" % (var, raw, h))
        seen.add(h)
    return hosts


def expand_counts(text, var):
    """Slurm's per-node counts ('2(x3),1' -> [2, 2, 2, 1]); SlurmError naming `var`."""
    raw = "" if text is None else str(text).strip()
    out = []
    for item in raw.split(","):
        m = re.match(r"^\s*(\d+)\s*(?:\(x(\d+)\))?\s*$", item)
        if not m or int(m.group(1)) < 1 or (m.group(2) is not None and int(m.group(2)) < 1):
            raise SlurmError("%s=%r: expected counts like '2(x3),1' (each at least 1)"
                             % (var, raw))
        repeat = int(m.group(2) or 1)
        if len(out) + repeat > MAX_NODES:
            raise SlurmError("%s=%r: more than %d nodes" % (var, raw, MAX_NODES))
        out.extend([int(m.group(1))] * repeat)
    return out


def _int_var(env, var, minimum=0):
    raw = env.get(var)
    if raw is None or not str(raw).strip():
        raise SlurmError("%s is not set; is this inside a Slurm allocation (sbatch, salloc, "
                         "srun)?" % var)
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise SlurmError("%s=%r is not an integer" % (var, raw)) from None
    if value < minimum:
        raise SlurmError("%s=%r must be at least %d" % (var, raw, minimum))
    return value


def _gpu_count(env):
    """(count, variable) of this node's GPUs: SLURM_GPUS_ON_NODE, else the entries of
    SLURM_JOB_GPUS, else of CUDA_VISIBLE_DEVICES; (0, None) when none says."""
    raw = env.get("SLURM_GPUS_ON_NODE")
    if raw is not None and str(raw).strip():
        return _int_var(env, "SLURM_GPUS_ON_NODE"), "SLURM_GPUS_ON_NODE"
    for var in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        raw = env.get(var)
        if raw is None:
            continue
        raw = str(raw).strip()
        if raw in ("", "NoDevFiles"):
            return 0, var
        items = [i.strip() for i in raw.split(",")]
        if any(not i for i in items):
            raise SlurmError("%s=%r: expected a comma-separated list of devices" % (var, raw))
        return len(items), var
    return 0, None


def _gpus_per_node(env):
    """SLURM_GPUS_PER_NODE ('4', 'a100:4', 'a100:2,v100:2') as a count; None when unset."""
    raw = env.get("SLURM_GPUS_PER_NODE")
    if raw is None or not str(raw).strip():
        return None
    total = 0
    for item in str(raw).split(","):
        count = item.strip().rsplit(":", 1)[-1]
        if not count.isdigit():
            raise SlurmError("SLURM_GPUS_PER_NODE=%r: expected [TYPE:]COUNT[,...]" % raw)
        total += int(count)
    return total


# -- the job -----------------------------------------------------------------------------------

@dataclass
class SlurmJob:
    """What the Slurm environment says, checked.

    nodes:      the node names, in Slurm's order (node 0 runs the scheduler)
    processes:  training processes per node
    gpus:       GPUs per training node (0 = CPU training); device indices 0..gpus-1 as the
                training processes see them (Slurm sets CUDA_VISIBLE_DEVICES)
    node_id:    this launcher's node (an index into nodes) inside a job step; None outside
    tasks_per_node: the job's tasks per node (for srun_argv), None inside a step that was not
                started by the launcher
    """
    job_id: int
    nodes: List[str]
    processes: List[int]
    gpus: int = 0
    node_id: Optional[int] = None
    tasks_per_node: Optional[List[int]] = None
    sources: dict = field(default_factory=dict)  # what decided each value, for the plan line

    @property
    def in_step(self):
        return self.node_id is not None

    @property
    def this_node(self):
        return None if self.node_id is None else self.nodes[self.node_id]


def read_job(env: Mapping[str, str], local_size: Optional[int] = None) -> SlurmJob:
    """The job of the Slurm environment `env` (see module docstring).

    local_size (--local-size) sets every node's training processes; with GPUs it must not
    exceed them (the first local_size GPUs are used). Raises SlurmError naming the variable
    that is missing, malformed or inconsistent."""
    job_id = _int_var(env, "SLURM_JOB_ID")
    in_step = bool(str(env.get("SLURM_STEP_ID", "")).strip())
    # A step may span part of the job: its launchers are the cluster.
    nodes_var = "SLURM_JOB_NODELIST"
    if in_step and env.get("SLURM_STEP_NODELIST") is not None:
        nodes_var = "SLURM_STEP_NODELIST"
    if env.get(nodes_var) is None:
        raise SlurmError("%s is not set; is this inside a Slurm allocation (sbatch, salloc, "
                         "srun)?" % nodes_var)
    nodes = expand_hostlist(env.get(nodes_var), nodes_var)

    # The job's tasks per node: outside a step SLURM_TASKS_PER_NODE; inside the launcher's own
    # step BITPUSH_SLURM_TASKS_PER_NODE (srun replaced SLURM_TASKS_PER_NODE with the step's).
    tasks = tasks_var = None
    if not in_step:
        tasks_var = "SLURM_TASKS_PER_NODE"
        if env.get(tasks_var) is None:
            raise SlurmError("SLURM_TASKS_PER_NODE is not set; is this inside a Slurm "
                             "allocation (sbatch, salloc)?")
    elif env.get(TASKS_VAR) is not None:
        tasks_var = TASKS_VAR
    if tasks_var is not None:
        tasks = expand_counts(env.get(tasks_var), tasks_var)
        if len(tasks) != len(nodes):
            raise SlurmError("%s=%r gives %d node(s) but %s=%r has %d"
                             % (tasks_var, env.get(tasks_var), len(tasks), nodes_var,
                                env.get(nodes_var), len(nodes)))

    node_id = None
    if in_step:
        step_tasks_var = "SLURM_STEP_TASKS_PER_NODE"
        if env.get(step_tasks_var) is not None:
            step_tasks = expand_counts(env.get(step_tasks_var), step_tasks_var)
            if any(t != 1 for t in step_tasks):
                raise SlurmError(
                    "%s=%r: bitpush launch --slurm runs one launcher per node (srun "
                    "--ntasks-per-node=1, or run it in the batch script and it calls srun "
                    "itself); each starts its node's training processes"
                    % (step_tasks_var, env.get(step_tasks_var)))
        node_id = _int_var(env, "SLURM_NODEID")
        if node_id >= len(nodes):
            raise SlurmError("SLURM_NODEID=%d but %s=%r has %d node(s)"
                             % (node_id, nodes_var, env.get(nodes_var), len(nodes)))
        here = env.get("SLURMD_NODENAME")
        if here and here != nodes[node_id]:
            raise SlurmError("SLURMD_NODENAME=%s but node %d of %s=%r is %s"
                             % (here, node_id, nodes_var, env.get(nodes_var), nodes[node_id]))

    sources = {}
    gpus, gpu_var = 0, None
    if in_step:  # the GPUs are visible on the nodes only (an salloc shell may be elsewhere)
        gpus, gpu_var = _gpu_count(env)
        per_node = _gpus_per_node(env)
        if per_node is not None:
            if gpu_var is not None and gpus != per_node:
                raise SlurmError("%s gives this node %d GPU(s) but SLURM_GPUS_PER_NODE=%r "
                                 "says %d" % (gpu_var, gpus, env.get("SLURM_GPUS_PER_NODE"),
                                              per_node))
            gpus, gpu_var = per_node, "SLURM_GPUS_PER_NODE"
        sources["gpus"] = gpu_var

    if local_size is not None:
        if gpus and local_size > gpus:
            raise SlurmError("--local-size %d is more than the %d GPU(s) of %s; one GPU per "
                             "training process" % (local_size, gpus, gpu_var))
        processes = [local_size] * len(nodes)
        gpus = local_size if gpus else 0
        sources["processes"] = "--local-size"
    elif gpus:
        if tasks is not None:
            for n, t in enumerate(tasks):
                if t != 1 and t != gpus:
                    raise SlurmError(
                        "%s=%r gives node %s %d task(s) but %s says %d GPU(s); bitpush runs "
                        "one training process per GPU: ask for --ntasks-per-node=%d (or 1), "
                        "or give --local-size" % (tasks_var, env.get(tasks_var), nodes[n], t,
                                                  gpu_var, gpus, gpus))
        processes = [gpus] * len(nodes)
        sources["processes"] = gpu_var
    elif tasks is not None:
        processes = tasks
        sources["processes"] = tasks_var
    else:
        processes = [1] * len(nodes)
        sources["processes"] = "default"
    return SlurmJob(job_id=job_id, nodes=nodes, processes=processes, gpus=gpus,
                    node_id=node_id, tasks_per_node=tasks, sources=sources)


# -- the cluster -------------------------------------------------------------------------------


def port_base(job_id: int) -> int:
    """The first port of the job's block: PORT_FIRST + PORT_BLOCK * (job_id mod PORT_BLOCKS)."""
    return PORT_FIRST + PORT_BLOCK * (job_id % PORT_BLOCKS)


def socket_path(job_id: int, uid: Optional[int] = None) -> str:
    """worker.socket for the job's node daemons (two jobs on one node must not share one)."""
    return "/tmp/bitpush-%d-slurm%d-worker-{rank}.sock" % (
        os.getuid() if uid is None else uid, job_id)


def resolve_nodes(nodes: List[str], resolve=socket.gethostbyname) -> List[str]:
    """The IPv4 address of every node (`resolve`: name -> address). The daemons listen at the
    address of their role, and a socket binds to an address, not a name. Every node resolves
    the same names, so every node writes the same YAML; a node name that resolves to a
    loopback address is refused in a job of several nodes (the others could not reach it)."""
    out = []
    for name in nodes:
        try:
            addr = resolve(name)
        except OSError as e:
            raise SlurmError("node %s of SLURM_JOB_NODELIST does not resolve to an IPv4 "
                             "address here: %s" % (name, e)) from None
        if len(nodes) > 1 and addr.startswith("127."):
            raise SlurmError("node %s of SLURM_JOB_NODELIST resolves to %s (loopback) here; "
                             "the other nodes of the job could not reach it: give the name "
                             "its network address (/etc/hosts, DNS)" % (name, addr))
        out.append(addr)
    return out


def cluster_section(job: SlurmJob, addresses: List[str], servers_per_node: int = 1) -> List[str]:
    """The placement as the keys of `cluster:` (lines without indentation): scheduler,
    servers, workers, at the nodes' `addresses` (resolve_nodes)."""
    if not 1 <= servers_per_node <= MAX_SERVERS_PER_NODE:
        raise SlurmError("--servers-per-node must be 1..%d, got %d"
                         % (MAX_SERVERS_PER_NODE, servers_per_node))
    base = port_base(job.job_id)
    lines = ["scheduler: %s:%d  # %s" % (addresses[0], base, job.nodes[0]),
             "servers: {hosts: [%s], count: %d, port: %d}"
             % (", ".join(addresses), servers_per_node, base + 2),
             "workers:"]
    for name, addr, p in zip(job.nodes, addresses, job.processes):
        what = "gpus: %d" % job.gpus if job.gpus else "processes: %d" % p
        lines.append("  - {host: %s, port: %d, %s}  # %s" % (addr, base + 1, what, name))
    return lines


_PLACED_KEYS = ("scheduler", "servers", "workers")


def _section_block(lines, name):
    """(header index, key indent, end index) of the top-level block `name:` in `lines`, or
    None. The header must be `name:` alone (block style); SlurmError otherwise."""
    header = None
    for i, line in enumerate(lines):
        m = re.match(r"^%s\s*:(.*)$" % re.escape(name), line)
        if m:
            if m.group(1).strip() and not m.group(1).strip().startswith("#"):
                raise SlurmError("write the overlay's %s: section in block style (one key per "
                                 "line) so the launcher can add its keys" % name)
            header = i
            break
    if header is None:
        return None
    indent, end = None, len(lines)
    for j in range(header + 1, len(lines)):
        text = lines[j]
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        if not text[0].isspace():
            end = j
            break
        if indent is None:
            indent = len(text) - len(text.lstrip())
    # Trailing blank and comment lines belong to whatever follows.
    while end > header + 1 and (not lines[end - 1].strip()
                                or lines[end - 1].lstrip().startswith("#")):
        end -= 1
    return header, indent or 2, end


def _section_keys(lines, block):
    header, indent, end = block
    keys = []
    for text in lines[header + 1:end]:
        if text.strip() and not text.lstrip().startswith("#") \
                and len(text) - len(text.lstrip()) == indent:
            keys.append(text.strip().split(":", 1)[0].strip())
    return keys


def _add_keys(lines, name, keys):
    """`lines` with `keys` (unindented lines) added to the top-level section `name:` (made
    when missing), at the section's own indentation."""
    block = _section_block(lines, name)
    if block is None:
        return lines + ["%s:" % name] + ["  " + k for k in keys]
    header, indent, end = block
    pad = " " * indent
    return lines[:end] + [pad + k for k in keys] + lines[end:]


def merge_overlay(overlay_text: str, cluster_keys: List[str], source: str = "overlay") -> str:
    """The overlay with the placed keys added to its `cluster:` section.

    The overlay is a cluster YAML without cluster.scheduler, cluster.servers and
    cluster.workers (the launcher places those): compression:, server:, worker: and the other
    cluster: keys (heartbeats, startup_timeout_s, token_file) pass through as written. It is
    edited as lines (the C++ parser validates the result); a section it has to extend must be
    in block style."""
    lines = overlay_text.splitlines()
    block = _section_block(lines, "cluster")
    if block is not None:
        for key in _section_keys(lines, block):
            if key in _PLACED_KEYS:
                raise SlurmError("%s: cluster.%s: leave it out under --slurm; the launcher "
                                 "places the scheduler, servers and workers on the "
                                 "allocation's nodes (docs/launch.md)" % (source, key))
    return "\n".join(_add_keys(lines, "cluster", cluster_keys)) + "\n"


def add_worker_socket(text: str, job_id: int) -> str:
    """`text` with worker.socket set to the job's path (for a YAML that sets none)."""
    lines = _add_keys(text.splitlines(), "worker", ["socket: %s" % socket_path(job_id)])
    return "\n".join(lines) + "\n"


def cluster_yaml(job: SlurmJob, addresses: List[str], overlay_text: str = "",
                 servers_per_node: int = 1, source: str = "overlay") -> str:
    """The effective cluster YAML of `job`: a header comment, then the overlay with the
    placement added. worker.socket is added by the caller when the result sets none (only the
    C++ parser can tell; add_worker_socket)."""
    header = ["# bitpush launch --slurm: job %d, %d node(s); placement by the launcher "
              "(docs/launch.md)" % (job.job_id, len(job.nodes))]
    body = merge_overlay(overlay_text, cluster_section(job, addresses, servers_per_node), source)
    return "\n".join(header) + "\n" + body


def yaml_path(job_id: int, tmpdir: Optional[str]) -> str:
    """Where a node writes the effective YAML: $TMPDIR (Slurm's per-job one where configured),
    else /tmp, named by the job."""
    return os.path.join(tmpdir or "/tmp", "bitpush-slurm-%d.yaml" % job_id)


def srun_argv(job: SlurmJob, launcher_argv: List[str], srun: str = "srun"):
    """(argv, variables): the srun command that runs `launcher_argv` once per node of `job`,
    with the whole node (--whole: every CPU and GPU the job has there, not one task's share),
    every variable exported (--export=ALL, whatever sbatch --export said) plus `variables`:
    the job's tasks per node in BITPUSH_SLURM_TASKS_PER_NODE. One launcher failing ends the
    step (--kill-on-bad-exit)."""
    tasks = ",".join(str(t) for t in job.tasks_per_node or [1] * len(job.nodes))
    n = len(job.nodes)
    argv = [srun, "--nodes=%d" % n, "--ntasks=%d" % n, "--ntasks-per-node=1", "--whole",
            "--kill-on-bad-exit=1", "--export=ALL"] + list(launcher_argv)
    return argv, {TASKS_VAR: tasks}


def describe(job: SlurmJob, servers_per_node: int) -> str:
    """One line: the placement, for the launcher's output."""
    base = port_base(job.job_id)
    procs = sorted(set(job.processes))
    per = ("%d" % procs[0]) if len(procs) == 1 else "/".join(str(p) for p in job.processes)
    return ("slurm job %d: %d node(s) (%s); scheduler on %s; %d server(s) per node; "
            "%s training process(es) per node (%s)%s; ports %d-%d"
            % (job.job_id, len(job.nodes), _short(job.nodes), job.nodes[0], servers_per_node,
               per, job.sources.get("processes", "?"),
               ", one per GPU" if job.gpus else "", base, base + PORT_BLOCK - 1))


def _short(nodes):
    return ",".join(nodes) if len(nodes) <= 4 else "%s,...,%s" % (nodes[0], nodes[-1])


# -- the launcher's hook -------------------------------------------------------------------------

def setup(args, launcher_argv, load_config, say):
    """`bitpush launch --slurm`, before the launcher reads its YAML (launch.main).

    Outside a job step: replaces this process with `srun_argv` running `launcher_argv` (does
    not return). Inside one: writes this node's effective YAML (yaml_path; removed when the
    launcher exits), sets args.host to this node and returns the YAML's path. `load_config`
    is the C++ parser (path -> dict, raises BitpushError); `say` prints a launcher line.
    Raises SlurmError (or BitpushError for a bad overlay)."""
    if args.host:
        raise SlurmError("--host does not go with --slurm: each node's launcher starts the "
                         "roles of its own node (SLURM_NODEID)")
    env = _env.slurm_environ()
    job = read_job(env, args.local_size)
    if not job.in_step:
        srun = shutil.which("srun")
        if srun is None:
            raise SlurmError("srun is not on PATH; outside a job step bitpush launch --slurm "
                             "runs srun to start one launcher per node")
        argv, variables = srun_argv(job, launcher_argv, srun)
        say("slurm job %d: one launcher on each of %d node(s) (%s): %s"
            % (job.job_id, len(job.nodes), _short(job.nodes), " ".join(argv[:7])))
        sys.stdout.flush()
        os.execve(srun, argv, dict(os.environ, **variables))
    servers = args.servers_per_node or 1
    overlay, source = "", "overlay"
    if args.config:
        source = args.config
        try:
            with open(args.config) as f:
                overlay = f.read()
        except OSError as e:
            raise SlurmError("--config %s: %s" % (args.config, e.strerror or e)) from None
    addresses = resolve_nodes(job.nodes)
    text = cluster_yaml(job, addresses, overlay, servers, source)
    path = yaml_path(job.job_id, env.get("TMPDIR"))
    _write(path, text)
    try:
        if not load_config(path)["worker_socket"]:
            text = add_worker_socket(text, job.job_id)
            _write(path, text)
            load_config(path)
    except Exception as e:  # BitpushError: the file is kept for the message's line numbers
        raise SlurmError("%s (%s is %s with the launcher's cluster keys added)"
                         % (e, path, source if args.config else "generated")) from None
    atexit.register(_remove, path)
    args.host = [addresses[job.node_id]]
    say(describe(job, servers) + "; this node %s (%s, node %d); cluster file %s"
        % (job.this_node, addresses[job.node_id], job.node_id, path))
    return path


def _write(path, text):
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _remove(path):
    try:
        os.unlink(path)
    except OSError:
        pass
