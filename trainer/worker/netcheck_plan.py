"""The network check's arithmetic, without processes: who meets whom, the bus bandwidth, the
verdict on the slowest node pair, and the lines that report them.

Every node pair's link is measured in O(nodes) rounds: a round-robin tournament (the circle
method) pairs one representative rank per node with another node's in each round, every node at
most once per round, every pair exactly once overall: n - 1 rounds for an even n, n for an odd n
(one node sits each round out). Pairs of one round run at the same time, so a round costs one
exchange, and a node's link carries one exchange at a time.

Bus bandwidth is nccl-tests' number for all-reduce (its doc/PERFORMANCE.md): the algorithm
bandwidth (bytes / time) times 2(n-1)/n, what each link of a ring carries; it is comparable
across world sizes and with published nccl-tests figures.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

MIB = 2**20
GB = 1e9


@dataclass(frozen=True)
class Member:
    """One rank, and the node it runs on."""

    rank: int
    node_rank: int
    local_rank: int
    pod: str
    node: str  # the Kubernetes node ("" outside Kubernetes)

    def where(self) -> str:
        return f"{self.pod} ({self.node})" if self.node else self.pod


def representatives(members: list[Member]) -> list[Member]:
    """The first rank of each node, in node order."""
    firsts: dict[int, Member] = {}
    for m in sorted(members, key=lambda m: (m.node_rank, m.local_rank, m.rank)):
        firsts.setdefault(m.node_rank, m)
    return list(firsts.values())


def tournament(count: int) -> list[list[tuple[int, int]]]:
    """Rounds of pairs (a < b) of `count` nodes: every pair once, every node once per round."""
    if count < 2:
        return []
    slots: list[int | None] = list(range(count)) + ([None] if count % 2 else [])
    half = len(slots) // 2
    rounds = []
    for _ in range(len(slots) - 1):
        pairs = []
        for i in range(half):
            a, b = slots[i], slots[-1 - i]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(sorted(pairs))
        slots = [slots[0], slots[-1], *slots[1:-1]]  # the circle turns; slot 0 stays
    return rounds


def bus_bandwidth(nbytes: int, seconds: float, world: int) -> float:
    """nccl-tests' all-reduce bus bandwidth, bytes per second."""
    if seconds <= 0 or world < 2:
        return 0.0
    return nbytes / seconds * 2 * (world - 1) / world


def message_sizes(max_mb: float) -> list[int]:
    """The all-reduce sizes in bytes: 1/64, 1/8 and all of network.check_max_mb (at least 4
    bytes each, whole float32 elements), smallest first, no repeats."""
    largest = max(4, int(max_mb * MIB) // 4 * 4)
    return sorted({max(4, largest // 64 // 4 * 4), max(4, largest // 8 // 4 * 4), largest})


def seconds_per_all_reduce(nbytes: int, bus_bps: float, world: int) -> float:
    """How long an all-reduce of `nbytes` takes at bus bandwidth `bus_bps` (0: no estimate)."""
    if bus_bps <= 0 or world < 2:
        return 0.0
    return nbytes / (bus_bps * world / (2 * (world - 1)))


def fits(elapsed: float, nbytes: int, bus_bps: float, world: int, budget: float) -> bool:
    """Whether a size's warm-up and one timed run, at the bandwidth the last size had, still
    end within the budget: the check never starts what it cannot finish in time."""
    return elapsed + 2 * seconds_per_all_reduce(nbytes, bus_bps, world) <= budget


def pair_message(largest: int, link_bps: float, rounds: int, budget: float) -> int:
    """The node-to-node message: the largest all-reduce size, halved until a warm-up and one
    timed exchange per round fit the budget at `link_bps` (64 KiB at least)."""
    size = largest
    while size > PAIR_FLOOR and link_bps > 0 and rounds * 2 * size / link_bps > budget:
        size = max(PAIR_FLOOR, size // 2 // 4 * 4)
    return size


PAIR_FLOOR = 64 * 1024


@dataclass(frozen=True)
class Link:
    a: Member
    b: Member
    bytes_per_second: float

    def describe(self) -> str:
        return f"{self.a.where()} <-> {self.b.where()}"


@dataclass(frozen=True)
class Verdict:
    links: list[Link]
    median: float  # bytes per second; 0 without links
    slowest: Link | None
    slow: bool  # the slowest is over slow_factor below the median (3+ nodes only)

    @property
    def ratio(self) -> float:
        """How many times the slowest link is below the median."""
        if self.slowest is None or self.slowest.bytes_per_second <= 0:
            return 0.0
        return self.median / self.slowest.bytes_per_second


def judge(links: list[Link], slow_factor: float) -> Verdict:
    """The slowest link, and whether it lags the median of all links by over `slow_factor`.
    With two nodes there is one link and nothing to compare it with: never slow."""
    if not links:
        return Verdict([], 0.0, None, False)
    median = statistics.median(link.bytes_per_second for link in links)
    slowest = min(links, key=lambda link: link.bytes_per_second)
    slow = len(links) >= 3 and slowest.bytes_per_second * slow_factor < median
    return Verdict(links, median, slowest, slow)


@dataclass
class CheckResult:
    """What the check measured; rank 0's copy is the one reported."""

    world_size: int
    nodes: int
    seconds: float = 0.0
    bus: dict[int, float] = field(default_factory=dict)  # message bytes -> bytes per second
    verdict: Verdict | None = None
    pair_bytes: int = 0  # the node-to-node message, each way
    cut_short: str = ""  # why a measurement was skipped (the time budget)

    def describe(self) -> str:
        """The log line: bus bandwidth per size, then the node pairs."""
        sizes = ", ".join(f"{rate(bw)} at {size_text(n)}" for n, bw in self.bus.items())
        ranks = f"{self.world_size} rank" + ("s" if self.world_size != 1 else "")
        nodes = f"{self.nodes} node" + ("s" if self.nodes != 1 else "")
        text = (
            f"[kubeddp] network check ({self.seconds:.1f} s, {ranks} on {nodes}): all-reduce "
            f"bus bandwidth {sizes or 'not measured'}"
        )
        v = self.verdict
        if v is not None and v.slowest is not None:
            each = f" ({size_text(self.pair_bytes)} each way)" if self.pair_bytes else ""
            if len(v.links) == 1:
                text += f"; node link{each} {rate(v.slowest.bytes_per_second)}"
            else:
                text += (
                    f"; node pairs{each}: median {rate(v.median)}, slowest "
                    f"{v.slowest.describe()} {rate(v.slowest.bytes_per_second)}"
                )
        if self.cut_short:
            text += f" ({self.cut_short})"
        return text

    def slow_line(self, slow_factor: float) -> str | None:
        v = self.verdict
        if v is None or not v.slow or v.slowest is None:
            return None
        return (
            f"[kubeddp] warning: slow network link {v.slowest.describe()}: "
            f"{rate(v.slowest.bytes_per_second)}, {v.ratio:.1f}x below the median of "
            f"the {len(v.links)} node pairs (network.slow_factor={slow_factor:g}); check that "
            "link (NIC, cable, switch port) or move the job off one of those nodes"
        )


def rate(bytes_per_second: float) -> str:
    """`12.34 GB/s`, or `2.5 MB/s` below 1 GB/s (decimal units, as nccl-tests prints)."""
    if bytes_per_second >= GB:
        return f"{bytes_per_second / GB:.2f} GB/s"
    return f"{bytes_per_second / 1e6:.3g} MB/s"


def size_text(nbytes: int) -> str:
    return f"{nbytes / MIB:g} MiB" if nbytes >= MIB else f"{nbytes / 1024:g} KiB"
