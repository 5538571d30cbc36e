"""What a new user meets first: the shipped example YAMLs, the ports tests and LocalCluster pick,
and the commands and paths README.md and docs/ tell them to use."""
import glob
import os
import re
import socket

from bitpush import _C
from bitpush.testing import ephemeral_port_range, free_ports

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def _port(address):
    return int(address.rsplit(":", 1)[1])


def test_example_yamls_listen_below_the_ephemeral_range():
    low, high = ephemeral_port_range()
    examples = sorted(glob.glob(os.path.join(ROOT, "deploy", "examples", "*.yaml")))
    assert examples
    for path in examples:
        c = _C.load_cluster_config(path)
        for address in [c["scheduler"]] + c["servers"] + c["workers"]:
            assert address.startswith("tcp://"), address
            port = _port(address)
            assert not low <= port <= high, (
                "%s: %s is in the ephemeral range %d..%d, where an outgoing connection can take "
                "it first" % (os.path.relpath(path, ROOT), address, low, high))


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range():
    low, _ = ephemeral_port_range()
    seen = set()
    for _ in range(5):
        ports = free_ports(4)
        assert len(set(ports)) == 4
        for p in ports:
            assert 1024 <= p < low, p
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("127.0.0.1", p))
            finally:
                s.close()
        seen.update(ports)
    assert len(seen) == 20  # later calls move on instead of handing out the same ports


def test_docs_run_python_from_the_build_tree_the_build_makes():
    # The Python package is built into build/python (python/CMakeLists.txt); any other
    # PYTHONPATH in a doc sends a new user to a directory that does not exist.
    wrong = []
    for path in DOCS:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                for m in re.finditer(r"PYTHONPATH=([^\s`'\";:]+)", line):
                    if m.group(1) != "build/python":
                        wrong.append("%s:%d: PYTHONPATH=%s" % (os.path.relpath(path, ROOT), n,
                                                              m.group(1)))
    assert not wrong, "docs name a Python path the build does not make:\n" + "\n".join(wrong)


def test_docs_point_only_at_files_in_the_repository():
    # A path that leaves the repository (../something) is not there for a user who has only
    # the repository.
    outside = []
    for path in DOCS:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if re.search(r"(^|[\s`(\[])\.\./", line):
                    outside.append("%s:%d: %s" % (os.path.relpath(path, ROOT), n, line.strip()))
    assert not outside, "docs point outside the repository:\n" + "\n".join(outside)
