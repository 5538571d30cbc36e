"""`bitpush metrics-config`: a Prometheus scrape configuration for a cluster YAML.

    bitpush metrics-config cluster.yaml [-o FILE] [--job NAME] [--scrape-interval 5s]

Prints (or writes to FILE) a Prometheus configuration with one scrape job whose targets are
every metrics endpoint of the cluster (docs/metrics.md: the scheduler at metrics.port, server r
at port + 1 + r, worker node n at port + 1 + S + n; python/bitpush/_metrics_targets.py), one
static_configs entry per process so that each carries the labels the Grafana dashboard
(deploy/grafana/bitpush.json) groups by: `role`, `rank` (absent for the scheduler) and `node`
("server 1"). docs/observability.md, "Dashboard", shows an example.

The YAML is read by the C++ parser (bitpush._C.load_cluster_config), so a file accepted here is
accepted by every daemon. The output is written by hand (no YAML library): double-quoted
scalars in JSON syntax, which YAML reads as the same strings.

Exit status: 0 written; 2 a bad command line, a YAML the parser refuses, metrics off
(metrics.port 0) or an output file that cannot be written — each with one line naming it.
"""
import argparse
import json
import re
import sys

from ._metrics_targets import targets

__all__ = ["main", "render"]

EXIT_OK = 0
EXIT_USAGE = 2

# Prometheus' duration syntax (a non-zero one: a scrape interval of 0 is refused).
_DURATION = re.compile(r"^(\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?$")


def _q(text):
    return json.dumps(str(text))


def _address(target):
    host = "[%s]" % target.host if ":" in target.host else target.host
    return "%s:%d" % (host, target.port)


def render(config, source, job="bitpush", scrape_interval="5s"):
    """The Prometheus configuration (text) for the parsed cluster YAML `config`
    (`_C.load_cluster_config`'s dict) read from `source` (named in the header comment).
    Raises ValueError when metrics are off."""
    endpoints = targets(config)
    if not endpoints:
        raise ValueError("metrics are off: metrics.port is 0 (set metrics.port in the YAML's "
                         "metrics: section, docs/metrics.md)")
    source = " ".join(str(source).split())  # one line, whatever the path holds
    lines = [
        "# Prometheus scrape configuration for the bitpush cluster of %s:" % source,
        "# one target per process (%d), labelled role, rank and node as the dashboard"
        % len(endpoints),
        "# deploy/grafana/bitpush.json expects. Use it as prometheus.yml, or copy the job into",
        "# the scrape_configs of an existing one. Written by `bitpush metrics-config`",
        "# (docs/observability.md, \"Dashboard\").",
        "scrape_configs:",
        "  - job_name: %s" % _q(job),
        "    scrape_interval: %s" % scrape_interval,
        "    metrics_path: /metrics",
        "    # bitpush_node_info carries role and rank itself, with the values given here: keep",
        "    # them instead of renaming them to exported_role / exported_rank.",
        "    honor_labels: true",
        "    static_configs:",
    ]
    for t in endpoints:
        labels = ["role: %s" % _q(t.role)]
        if t.rank is not None:
            labels.append("rank: %s" % _q(t.rank))
        labels.append("node: %s" % _q(t.label))
        lines.append("      - targets: [%s]" % _q(_address(t)))
        lines.append("        labels: {%s}" % ", ".join(labels))
    return "\n".join(lines) + "\n"


def _parser():
    p = argparse.ArgumentParser(
        prog="bitpush metrics-config",
        description="Print a Prometheus scrape configuration for the metrics endpoints of a "
        "cluster YAML: one job, one target per process labelled role, rank and node "
        "(docs/observability.md, 'Dashboard').")
    p.add_argument("config", help="the cluster YAML (its metrics.port must be set)")
    p.add_argument("-o", "--output", metavar="FILE", default=None,
                   help="write the configuration to FILE instead of standard output")
    p.add_argument("--job", default="bitpush", metavar="NAME",
                   help="the scrape job's name, the dashboard's `job` variable "
                   "(default bitpush)")
    p.add_argument("--scrape-interval", default="5s", metavar="DURATION",
                   help="how often Prometheus scrapes each process, a Prometheus duration "
                   "such as 5s, 15s or 1m (default 5s)")
    return p


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2, already printed)
        return e.code if isinstance(e.code, int) else EXIT_USAGE

    def fail(text):
        print("bitpush metrics-config: %s" % text, file=sys.stderr)
        return EXIT_USAGE

    if not args.job.strip():
        return fail("--job: the job name is empty")
    interval = args.scrape_interval
    if not interval or not _DURATION.match(interval) or not re.search(r"[1-9]", interval):
        return fail("--scrape-interval %r: not a Prometheus duration above 0 (e.g. 5s, 15s, "
                    "1m, 1m30s)" % interval)

    from . import BitpushError, _C
    try:
        config = _C.load_cluster_config(args.config)
    except BitpushError as e:
        return fail(str(e))
    try:
        text = render(config, args.config, args.job, interval)
    except ValueError as e:
        return fail("%s: %s" % (args.config, e))

    if args.output is None:
        sys.stdout.write(text)
        return EXIT_OK
    try:
        with open(args.output, "w") as f:
            f.write(text)
    except OSError as e:
        return fail("-o %s: cannot write: %s" % (args.output, e.strerror or e))
    print("bitpush metrics-config: wrote %s (%d targets)"
          % (args.output, text.count("- targets:")))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
