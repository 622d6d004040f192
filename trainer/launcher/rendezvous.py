"""The rendezvous plan: a pure function from the launcher's environment to torchrun arguments.

Each way a pod can be launched (torchrun, PyTorchJob with a Master, Worker-only PyTorchJob,
elastic PyTorchJob, TrainJob, Indexed Job, plain env, nothing) is one planner below. Nothing
here touches the network or starts a process, so each is unit-tested with the exact env the
operators inject (tests/unit/test_rendezvous.py).
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kubeddp.trainer import constants
from kubeddp.trainer.launcher.agent import WORKER_MODULE, torchrun_argv
from kubeddp.trainer.launcher.rendezvous_plan import RendezvousError, RendezvousPlan
from kubeddp.trainer.launcher.user_input import check_plan

MAX_COUNT = 2**31 - 1  # node counts, ranks, restarts: what torchrun's C ints hold
_WHOLE_NUMBER = re.compile(r"\s*[+-]?[0-9]+\s*")  # ASCII digits only: int() takes '٣' and '1_0'
_ENDPOINT = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[^\s:\[\]/]+):(?P<port>[0-9]{1,5})")


def _int(env: Mapping[str, str], name: str, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None:
        raise RendezvousError(f"{name} is not set; set it to a whole number")
    if not _WHOLE_NUMBER.fullmatch(raw):
        raise RendezvousError(f"{name}={raw!r} is not an integer; set it to a whole number")
    value = int(raw)
    if value < minimum or value > MAX_COUNT:
        raise RendezvousError(f"{name}={value} must be >= {minimum} and <= {MAX_COUNT}")
    return value


def _port(env: Mapping[str, str], name: str, default: int) -> int:
    if not env.get(name):
        return default
    port = _int(env, name, 1)
    if port > 65535:
        raise RendezvousError(f"{name}={port} is not a TCP port; use 1-65535")
    return port


def _endpoint(raw: str, name: str, hint: str = "") -> tuple[str, int]:
    """`host:port` (an IPv6 host in brackets), the port 1-65535."""
    found = _ENDPOINT.fullmatch(raw)
    if not found:
        raise RendezvousError(f"{name}={raw!r} must be host:port{hint}")
    port = int(found.group("port"))
    if not 1 <= port <= 65535:
        raise RendezvousError(f"{name}={raw!r}: port {port} is not a TCP port; use 1-65535")
    return found.group("host"), port


def _require(env: Mapping[str, str], names: tuple[str, ...], source: str, fix: str) -> None:
    """The variables an operator always sets together: a partial set is one line, not a
    KeyError (or a silently different plan)."""
    missing = [name for name in names if not env.get(name)]
    if missing:
        given = [name for name in names if env.get(name)]
        raise RendezvousError(
            f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} set but "
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not; {source} sets "
            f"{', '.join(names)} together: {fix}"
        )


def resolve_nproc(
    value: str, source_var: str, env: Mapping[str, str], gpu_count: Callable[[], int]
) -> int:
    """`auto`/`gpu`/`cpu`/int -> workers on this node.

    On a CPU-only node `auto` must not mean one worker per core (torchrun's own `auto` does):
    a 64-core node would start 64 gloo workers. It means KUBEDDP_CPU_NPROC (default 1).
    """
    value = (value or "auto").strip()
    if value in ("auto", "gpu", "cpu"):
        gpus = gpu_count() if value != "cpu" else 0
        if gpus > 0:
            return gpus
        if value == "gpu":
            raise RendezvousError(
                f"{source_var}=gpu but no CUDA device is visible; request nvidia.com/gpu in the "
                "pod resources or set nprocPerNode to a number"
            )
        cpu_var = constants.ENV_CPU_NPROC
        if env.get(cpu_var):
            return _int(env, cpu_var, 1)
        return 1
    try:
        n = int(value)
    except ValueError:
        raise RendezvousError(
            f"{source_var}={value!r} is not a process count; use an integer, auto, gpu or cpu"
        ) from None
    if n < 1:
        raise RendezvousError(f"{source_var}={n} must be >= 1")
    return n


def _nnodes_range(raw: str, name: str) -> tuple[int, int]:
    parts = raw.split(":")
    try:
        if not all(_WHOLE_NUMBER.fullmatch(p) for p in parts):  # not '1_0', not '٣'
            raise ValueError(raw)
        nums = [int(p) for p in parts]
    except ValueError:
        raise RendezvousError(f"{name}={raw!r} must be N or MIN:MAX with integers") from None
    lo, hi = (nums[0], nums[0]) if len(nums) == 1 else (nums[0], nums[1])
    if len(nums) > 2 or lo < 1 or hi < lo:
        raise RendezvousError(f"{name}={raw!r} must be N or MIN:MAX with 1 <= MIN <= MAX")
    return lo, hi


def _in_kubernetes(env: Mapping[str, str]) -> bool:
    return "KUBERNETES_SERVICE_HOST" in env


def _static(
    source: str,
    env: Mapping[str, str],
    nnodes: int,
    node_rank: int,
    nproc: int,
    host: str,
    port: int,
    rank_var: str,
    nnodes_var: str,
) -> RendezvousPlan:
    if node_rank >= nnodes:
        raise RendezvousError(
            f"{rank_var}={node_rank} >= {nnodes_var}={nnodes} ({source}): node ranks run "
            f"0..{nnodes - 1}; set {rank_var} below {nnodes_var} or raise the node count"
        )
    return RendezvousPlan(
        source=source,
        nnodes=str(nnodes),
        nproc_per_node=nproc,
        node_rank=node_rank,
        rdzv_backend="static",
        rdzv_endpoint=f"{host}:{port}",
        world_size=nnodes * nproc,
        in_kubernetes=_in_kubernetes(env),
        wait_for_host=True,
    )


def _plan_pytorchjob(env: Mapping[str, str], nproc_flag: str | None, gpus: Callable[[], int]):
    addr = env.get("MASTER_ADDR") or env.get("PET_MASTER_ADDR")
    port = _port(env, "MASTER_PORT", constants.PYTORCHJOB_PORT)
    nproc_var = "PET_NPROC_PER_NODE"
    nproc = resolve_nproc(nproc_flag or env.get(nproc_var, "auto"), nproc_var, env, gpus)
    for name in ("WORLD_SIZE", "RANK"):
        if name not in env:
            raise RendezvousError(
                f"MASTER_ADDR is set but {name} is not; a PyTorchJob with a "
                "Master sets both: set it or unset MASTER_ADDR"
            )
    world_env = _int(env, "WORLD_SIZE", 1)
    rank_var = "PET_NODE_RANK" if "PET_NODE_RANK" in env else "RANK"
    rank = _int(env, rank_var)
    nnodes = _int(env, "PET_NNODES", 1) if "PET_NNODES" in env else world_env
    if world_env % nnodes:
        raise RendezvousError(
            f"WORLD_SIZE={world_env} is not a multiple of PET_NNODES={nnodes}; the operator sets "
            "WORLD_SIZE = replicas x nprocPerNode: fix whichever was set by hand"
        )
    if _int(env, "RANK") >= world_env:
        raise RendezvousError(
            f"RANK={env['RANK']} >= WORLD_SIZE={world_env}; RANK must be in 0..WORLD_SIZE-1"
        )
    nnodes_var = "PET_NNODES" if "PET_NNODES" in env else "WORLD_SIZE"
    return _static("pytorchjob", env, nnodes, rank, nproc, addr, port, rank_var, nnodes_var)


def _plan_elastic(env: Mapping[str, str], nproc_flag: str | None, gpus: Callable[[], int]):
    endpoint = env.get("PET_RDZV_ENDPOINT", "")
    host, port = _endpoint(
        endpoint,
        "PET_RDZV_ENDPOINT",
        " (the operator sets <job>-worker-0:23456 for an elasticPolicy)",
    )
    lo, hi = _nnodes_range(env.get("PET_NNODES", "1"), "PET_NNODES")
    nproc = resolve_nproc(
        nproc_flag or env.get("PET_NPROC_PER_NODE", "auto"), "PET_NPROC_PER_NODE", env, gpus
    )
    max_restarts = _int(env, "PET_MAX_RESTARTS") if env.get("PET_MAX_RESTARTS") else 3
    # All pods of one job must agree on the id; the job name prefix of the endpoint is shared.
    rdzv_id = env.get("PET_RDZV_ID") or host.split(".")[0].rsplit("-worker-", 1)[0]
    return RendezvousPlan(
        source="pytorchjob-elastic",
        nnodes=f"{lo}:{hi}",
        nproc_per_node=nproc,
        node_rank=None,
        rdzv_backend=env.get("PET_RDZV_BACKEND") or "c10d",
        rdzv_endpoint=f"{host}:{port}",
        world_size=None,
        rdzv_id=rdzv_id,
        max_restarts=max_restarts,
        rdzv_conf=env.get("PET_RDZV_CONF", ""),
        in_kubernetes=_in_kubernetes(env),
    )


TRAINJOB_VARS = ("PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR")


def _plan_trainjob(env: Mapping[str, str], nproc_flag: str | None, gpus: Callable[[], int]):
    _require(env, TRAINJOB_VARS, "a TrainJob", "set the missing ones, or unset the others")
    nnodes = _int(env, "PET_NNODES", 1)
    rank = _int(env, "PET_NODE_RANK")
    nproc = resolve_nproc(
        nproc_flag or env.get("PET_NPROC_PER_NODE", "auto"), "PET_NPROC_PER_NODE", env, gpus
    )
    port = _port(env, "PET_MASTER_PORT", constants.TRAINJOB_PORT)
    addr = env["PET_MASTER_ADDR"]
    return _static("trainjob", env, nnodes, rank, nproc, addr, port, "PET_NODE_RANK", "PET_NNODES")


def _plan_kubeddp_env(
    env: Mapping[str, str], nproc_flag: str | None, gpus: Callable[[], int], source: str
) -> RendezvousPlan:
    """The env kubeddp's own manifests set where no operator gives a master: the Indexed Job
    (node rank = JOB_COMPLETION_INDEX) and the Worker-only PyTorchJob (node rank from the
    replica-index label; the operator adds PET_NNODES and PET_NPROC_PER_NODE)."""
    rank_var = constants.ENV_NODE_RANK if source == "pytorchjob-workers" else "JOB_COMPLETION_INDEX"
    nnodes_var = constants.ENV_NNODES
    if not env.get(nnodes_var):
        raise RendezvousError(
            f"{rank_var} and {constants.ENV_MASTER_ADDR} are set but {nnodes_var} is "
            f"not; render the job with `kubeddp render {source.split('-')[0]}`"
        )
    nnodes = _int(env, nnodes_var, 1)
    operator_nnodes = env.get("PET_NNODES")
    if operator_nnodes is not None and operator_nnodes != str(nnodes):
        raise RendezvousError(
            f"{nnodes_var}={nnodes} but the operator's PET_NNODES={operator_nnodes}: the "
            "replicas changed after the manifest was rendered (kubectl scale?); render it again "
            "with the node count you want"
        )
    rank = _int(env, rank_var)
    nproc_var = next(
        (v for v in (constants.ENV_NPROC_PER_NODE, "PET_NPROC_PER_NODE") if env.get(v)),
        constants.ENV_NPROC_PER_NODE,
    )
    nproc = resolve_nproc(nproc_flag or env.get(nproc_var, "auto"), nproc_var, env, gpus)
    default_port = (
        constants.PYTORCHJOB_PORT if source == "pytorchjob-workers" else constants.INDEXEDJOB_PORT
    )
    port = _port(env, constants.ENV_MASTER_PORT, default_port)
    addr = env[constants.ENV_MASTER_ADDR]
    return _static(source, env, nnodes, rank, nproc, addr, port, rank_var, nnodes_var)


def _plan_indexedjob(env: Mapping[str, str], nproc_flag: str | None, gpus: Callable[[], int]):
    return _plan_kubeddp_env(env, nproc_flag, gpus, "indexedjob")


def _plan_pytorchjob_workers(
    env: Mapping[str, str], nproc_flag: str | None, gpus: Callable[[], int]
):
    return _plan_kubeddp_env(env, nproc_flag, gpus, "pytorchjob-workers")


def _plan_env(env: Mapping[str, str], nproc_flag: str | None, gpus: Callable[[], int]):
    for name in ("MASTER_PORT", "RANK", "WORLD_SIZE"):
        if name not in env:
            raise RendezvousError(
                f"MASTER_ADDR is set but {name} is not; set MASTER_ADDR, MASTER_PORT, RANK and "
                "WORLD_SIZE together (one process per pod), or none of them"
            )
    world = _int(env, "WORLD_SIZE", 1)
    rank = _int(env, "RANK")
    if rank >= world:
        raise RendezvousError(f"RANK={rank} >= WORLD_SIZE={world}; RANK must be in 0..{world - 1}")
    if nproc_flag and nproc_flag != "1":
        raise RendezvousError(
            f"--nproc-per-node={nproc_flag} conflicts with plain MASTER_ADDR/RANK/WORLD_SIZE env, "
            "which means one process per pod; drop the flag or launch through torchrun"
        )
    port = _port(env, "MASTER_PORT", constants.PYTORCHJOB_PORT)
    return _static("env", env, world, rank, 1, env["MASTER_ADDR"], port, "RANK", "WORLD_SIZE")


def _plan_standalone(env: Mapping[str, str], nproc_flag: str | None, gpus: Callable[[], int]):
    # torchrun's own default for --nproc-per-node is $PET_NPROC_PER_NODE; so is ours.
    source_var = "--nproc-per-node" if nproc_flag else "PET_NPROC_PER_NODE"
    nproc = resolve_nproc(
        nproc_flag or env.get("PET_NPROC_PER_NODE") or "auto", source_var, env, gpus
    )
    return RendezvousPlan(
        source="standalone",
        nnodes="1",
        nproc_per_node=nproc,
        node_rank=0,
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",  # torchrun picks a free port
        world_size=nproc,
        standalone=True,
        in_kubernetes=_in_kubernetes(env),
        wait_for_host=False,
    )


def detect_source(env: Mapping[str, str]) -> str:
    if "LOCAL_RANK" in env and ("TORCHELASTIC_RUN_ID" in env or "GROUP_RANK" in env):
        return "torchrun"
    if env.get("PET_RDZV_ENDPOINT") or ":" in env.get("PET_NNODES", ""):
        return "pytorchjob-elastic"
    has_master = bool(env.get("MASTER_ADDR"))
    if has_master and ("PET_NNODES" in env or "PET_NODE_RANK" in env):
        return "pytorchjob"
    if env.get("PET_MASTER_ADDR") and "PET_NODE_RANK" in env and not has_master:
        return "trainjob"
    if env.get(constants.ENV_MASTER_ADDR):
        if constants.ENV_NODE_RANK in env:
            return "pytorchjob-workers"
        if "JOB_COMPLETION_INDEX" in env:
            return "indexedjob"
        raise RendezvousError(
            f"{constants.ENV_MASTER_ADDR} is set but neither "
            f"{constants.ENV_NODE_RANK} nor JOB_COMPLETION_INDEX says this pod's node rank; "
            "render the job with `kubeddp render`"
        )
    if has_master:
        return "env"
    if env.get("PET_MASTER_ADDR"):  # part of a TrainJob's set
        _require(env, TRAINJOB_VARS, "a TrainJob", "set the missing ones, or unset the others")
    if "PET_NNODES" in env:
        raise RendezvousError(
            f"PET_NNODES={env['PET_NNODES']} is set but no master address (MASTER_ADDR / "
            f"PET_MASTER_ADDR / {constants.ENV_MASTER_ADDR}) nor PET_RDZV_ENDPOINT: "
            "render the PyTorchJob with `kubeddp render` (a Worker-only job gets "
            f"{constants.ENV_MASTER_ADDR} and {constants.ENV_NODE_RANK}), or give it "
            "a Master replica or an elasticPolicy"
        )
    if "RANK" in env or "WORLD_SIZE" in env:
        raise RendezvousError(
            "RANK/WORLD_SIZE are set but MASTER_ADDR is not; set MASTER_ADDR and MASTER_PORT "
            "to the rank-0 host, or unset RANK/WORLD_SIZE for a single-node run"
        )
    if "PET_NODE_RANK" in env:
        _require(env, TRAINJOB_VARS, "a TrainJob", "set the missing ones, or unset the others")
    stray = [name for name in ELASTIC_ONLY_VARS if env.get(name)]
    if stray:
        raise RendezvousError(
            f"{', '.join(stray)} {'is' if len(stray) == 1 else 'are'} set but "
            "PET_RDZV_ENDPOINT is not; an elastic PyTorchJob sets PET_RDZV_ENDPOINT "
            "(host:port) with them: set it, or unset them for a single-node run"
        )
    return "standalone"


@dataclass(frozen=True)
class NodeFlags:
    """torchrun's multi-node flags given to `kubeddp train/launch` (bare metal, no operator).

    Static: --nnodes N --node-rank R --master-addr HOST [--master-port P]; elastic: --nnodes
    MIN:MAX (or N) --rdzv-endpoint HOST:PORT [--rdzv-id ID]. Given, they win over the env.
    """

    nnodes: str | None = None
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None

    def given(self) -> bool:
        return any(value is not None for value in dataclasses.astuple(self))


def _flag_port(port: int, option: str) -> int:
    if not 1 <= port <= 65535:
        raise RendezvousError(f"{option} {port} is not a TCP port; use 1-65535")
    return port


def _plan_flags(
    flags: NodeFlags, env: Mapping[str, str], nproc_flag: str | None, gpus: Callable[[], int]
) -> RendezvousPlan:
    if flags.master_addr is not None and flags.rdzv_endpoint is not None:
        raise RendezvousError(
            f"--master-addr {flags.master_addr} and --rdzv-endpoint {flags.rdzv_endpoint} are "
            "both given: use --master-addr for a fixed node count, --rdzv-endpoint for elastic"
        )
    if flags.nnodes is None:
        given = "--master-addr" if flags.master_addr is not None else "--rdzv-endpoint"
        if flags.node_rank is not None:
            given = "--node-rank"
        raise RendezvousError(
            f"{given} is given but --nnodes is not; say how many nodes join, e.g. --nnodes 2"
        )
    lo, hi = _nnodes_range(flags.nnodes, "--nnodes")
    nproc = resolve_nproc(nproc_flag or "auto", "--nproc-per-node", env, gpus)
    if flags.rdzv_endpoint is not None:
        return _plan_flags_elastic(flags, env, lo, hi, nproc)
    if flags.master_addr is None:
        if hi == 1 and flags.node_rank in (None, 0) and flags.master_port is None:
            return _plan_standalone(env, nproc_flag, gpus)
        raise RendezvousError(
            f"--nnodes {flags.nnodes} needs the rendezvous host: --master-addr HOST (the host "
            "of node rank 0) with --node-rank, or --rdzv-endpoint HOST:PORT for elastic"
        )
    if lo != hi:
        raise RendezvousError(
            f"--nnodes {flags.nnodes} is a range, which needs --rdzv-endpoint HOST:PORT "
            "(elastic); with --master-addr give a fixed count"
        )
    if flags.node_rank is None:
        raise RendezvousError(
            f"--master-addr {flags.master_addr} needs --node-rank: 0 on the host of "
            f"{flags.master_addr}, 1..{hi - 1} on the others"
        )
    if flags.node_rank < 0:
        raise RendezvousError(f"--node-rank {flags.node_rank} must be >= 0")
    port = constants.TORCHRUN_PORT if flags.master_port is None else flags.master_port
    port = _flag_port(port, "--master-port")  # 0 is refused, not silently the default
    return _static(
        "flags", env, hi, flags.node_rank, nproc, flags.master_addr, port,
        "--node-rank", "--nnodes",
    )  # fmt: skip


def _plan_flags_elastic(
    flags: NodeFlags, env: Mapping[str, str], lo: int, hi: int, nproc: int
) -> RendezvousPlan:
    for value, option in ((flags.node_rank, "--node-rank"), (flags.master_port, "--master-port")):
        if value is not None:
            raise RendezvousError(
                f"{option} {value} does not go with --rdzv-endpoint (elastic: the rendezvous "
                "assigns node ranks and the endpoint names the port); drop it"
            )
    # The env's parser: an IPv6 host in brackets, so `::1` (no port) is not host ':' port 1.
    endpoint = flags.rdzv_endpoint or ""
    if not _ENDPOINT.fullmatch(endpoint):
        raise RendezvousError(
            f"--rdzv-endpoint {endpoint!r} must be HOST:PORT, e.g. node0:29400 (an IPv6 "
            "address in brackets: [fd00::1]:29400)"
        )
    host, port = _endpoint(endpoint, "--rdzv-endpoint")
    return RendezvousPlan(
        source="flags",
        nnodes=f"{lo}:{hi}" if lo != hi else str(hi),
        nproc_per_node=nproc,
        node_rank=None,
        rdzv_backend="c10d",
        rdzv_endpoint=f"{host}:{port}",
        world_size=None,
        rdzv_id=flags.rdzv_id or "kubeddp",
        max_restarts=3,  # as an elastic PyTorchJob: a lost node is why one runs elastic
        in_kubernetes=_in_kubernetes(env),
    )


# Settings of an elastic rendezvous: meaningless (so a sign of a broken env) without its endpoint.
ELASTIC_ONLY_VARS = ("PET_RDZV_BACKEND", "PET_RDZV_ID", "PET_RDZV_CONF")


_PLANNERS = {
    "pytorchjob": _plan_pytorchjob,
    "pytorchjob-elastic": _plan_elastic,
    "trainjob": _plan_trainjob,
    "indexedjob": _plan_indexedjob,
    "pytorchjob-workers": _plan_pytorchjob_workers,
    "env": _plan_env,
    "standalone": _plan_standalone,
}


def plan_from_env(
    env: Mapping[str, str],
    worker_args: list[str] | None = None,
    nproc_flag: str | None = None,
    max_restarts: int | None = None,
    gpu_count: Callable[[], int] = lambda: 0,
    worker_module: str = WORKER_MODULE,
    node_flags: NodeFlags | None = None,
    torchrun_flags: Sequence[str] = (),
) -> RendezvousPlan:
    """Turn a launcher's environment (or its multi-node flags, which win) into a
    RendezvousPlan, or raise RendezvousError. Each worker runs `python -m worker_module
    worker_args`; `torchrun_flags` are the user's other torchrun options (`--tee=3`...)."""
    plan = _plan(env, list(worker_args or []), nproc_flag, max_restarts, gpu_count,
                 worker_module, node_flags)  # fmt: skip
    if plan.source != "torchrun":  # under a user's torchrun there is no agent of ours
        cut = plan.argv.index("--module")  # after kubeddp's flags: a --local-addr of theirs wins
        plan.argv[cut:cut] = list(torchrun_flags)
    check_plan(plan)
    return plan


def _plan(
    env: Mapping[str, str],
    worker_args: list[str],
    nproc_flag: str | None,
    max_restarts: int | None,
    gpu_count: Callable[[], int],
    worker_module: str,
    node_flags: NodeFlags | None,
) -> RendezvousPlan:
    if node_flags is not None and node_flags.given():
        plan = _plan_flags(node_flags, env, nproc_flag, gpu_count)
        if max_restarts is not None:
            plan.max_restarts = max_restarts
        plan.argv = torchrun_argv(plan, worker_args, worker_module)
        return plan
    source = detect_source(env)
    if source == "torchrun":
        world = _int(env, "WORLD_SIZE", 1) if env.get("WORLD_SIZE") else 1
        plan = RendezvousPlan(
            source="torchrun",
            # torchrun sets GROUP_WORLD_SIZE to the nodes actually joined (also when elastic).
            nnodes=env.get("GROUP_WORLD_SIZE") or env.get("PET_NNODES") or "1",
            nproc_per_node=_int(env, "LOCAL_WORLD_SIZE", 1) if env.get("LOCAL_WORLD_SIZE") else 1,
            node_rank=_int(env, "GROUP_RANK") if env.get("GROUP_RANK") else 0,
            rdzv_backend="torchrun",
            rdzv_endpoint=f"{env.get('MASTER_ADDR', 'localhost')}:{env.get('MASTER_PORT', '0')}",
            world_size=world,
            wait_for_host=False,
            in_kubernetes=_in_kubernetes(env),
        )
        plan.argv = [sys.executable, "-m", worker_module, *worker_args]
        return plan
    plan = _PLANNERS[source](env, nproc_flag, gpu_count)
    if max_restarts is not None:
        plan.max_restarts = max_restarts
    plan.argv = torchrun_argv(plan, worker_args, worker_module)
    return plan
