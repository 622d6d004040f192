"""Slow links between network-namespace nodes (tests/helpers/netns.py), shaped with `tc`.

`netem` is not available on these machines; `tbf` is, and so are `htb` and the `u32` filter.
`shape_link` slows one node's eth0 as a whole (every peer); `shape_pair` slows only the traffic
between two nodes, both ways: on each side an htb root sends packets for the other's address
to a class whose queue is a tbf at `rate`, and everything else to a class that stays fast.
The qdiscs live in the nodes' namespaces and go with them.
"""

from __future__ import annotations

import subprocess

from tests.helpers.netns import Node

FAST = "100gbit"


def _tc(namespace: str, *args: str) -> None:
    done = subprocess.run(
        ["tc", "-n", namespace, *args], capture_output=True, text=True, timeout=30
    )
    if done.returncode != 0:
        raise RuntimeError(f"tc -n {namespace} {' '.join(args)} failed: {done.stderr.strip()}")


def _tbf(rate: str) -> list[str]:
    # A small bucket, so even short messages go at `rate`; a long queue, so TCP is slowed, not
    # made to drop and retransmit most of what it sends.
    return ["tbf", "rate", rate, "burst", "16kb", "latency", "500ms"]


def shape_link(node: Node, rate: str) -> None:
    """Everything `node` sends goes at `rate`."""
    _tc(node.namespace, "qdisc", "add", "dev", "eth0", "root", *_tbf(rate))


def shape_pair(a: Node, b: Node, rate: str) -> None:
    """Traffic between `a` and `b` goes at `rate` both ways; their other links stay fast."""
    for here, there in ((a, b), (b, a)):
        ns = here.namespace
        _tc(ns, "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "10")
        for cls in ("1:10", "1:20"):
            _tc(ns, "class", "add", "dev", "eth0", "parent", "1:", "classid", cls,
                "htb", "rate", FAST)  # fmt: skip
        _tc(ns, "qdisc", "add", "dev", "eth0", "parent", "1:20", "handle", "20:", *_tbf(rate))
        _tc(ns, "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "1",
            "u32", "match", "ip", "dst", f"{there.address}/32", "flowid", "1:20")  # fmt: skip
