"""The rendezvous plan and its error: plain data, below the modules that make a plan
(rendezvous.py), check it (user_input.py) and run it (agent.py), so none of them imports another
in a circle."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field


class RendezvousError(ValueError):
    """The environment is inconsistent; the message names the variables and the fix."""


@dataclass
class RendezvousPlan:
    source: str
    nnodes: str  # "N" or "MIN:MAX"
    nproc_per_node: int
    node_rank: int | None  # None when elastic (torchrun assigns ranks)
    rdzv_backend: str  # static | c10d | etcd | etcd-v2
    rdzv_endpoint: str  # host:port
    world_size: int | None  # None when elastic
    rdzv_id: str = "kubeddp"
    max_restarts: int = 0
    rdzv_conf: str = ""
    standalone: bool = False
    in_kubernetes: bool = False
    wait_for_host: bool = True  # wait for the endpoint's DNS name and TCP port before torchrun
    argv: list[str] = field(default_factory=list)

    @property
    def host(self) -> str:
        return self.rdzv_endpoint.rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.rdzv_endpoint.rsplit(":", 1)[1])

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=False)
