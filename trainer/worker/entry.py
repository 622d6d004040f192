"""One training process: its config, distributed init, the Trainer, teardown, the exit code.

Started by `kubeddp launch`, a worker takes no arguments: it trains with the config launch
loaded and checked, handed over in its environment (process_contract.resolved_config).
Started by a user's own torchrun (`torchrun -m kubeddp.trainer.worker --config F --set K=V`),
it reads --config/--set itself, with the parser launch uses for the same options.
"""

from __future__ import annotations

import os
import shlex
import sys
import traceback
from collections.abc import Mapping
from typing import TYPE_CHECKING, NoReturn

from kubeddp.trainer import exit_codes
from kubeddp.trainer.config import (
    Config,
    ConfigError,
    MetricsConfig,
    load_config_options,
    parse_config_options,
)
from kubeddp.trainer.process_contract import resolved_config
from kubeddp.trainer.worker.parent_death import die_with_launcher

if TYPE_CHECKING:  # both import torch, which run() imports only once the config is good
    from kubeddp.trainer.worker.distributed import DistContext
    from kubeddp.trainer.worker.network import NetworkReport

# Imported in functions: the training modules (checkpoint, diagnostics, distributed, loop,
# preemption import torch; metrics and failures 51 modules), once the config is known good: a bad
# config fails at once, without torch's second or two.


def main(argv: list[str] | None = None) -> int:
    die_with_launcher()  # first: a launcher killed from now on takes this worker with it
    try:
        cfg = worker_config(sys.argv[1:] if argv is None else argv, os.environ)
    except ConfigError as exc:
        print(f"kubeddp: error: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    try:
        return run(cfg)
    except KeyboardInterrupt:  # Ctrl-C outside the training loop (which saves and exits 130)
        print("[kubeddp] interrupted", file=sys.stderr, flush=True)
        os._exit(exit_codes.INTERRUPTED)  # peers may be gone: no teardown


def worker_config(argv: list[str], env: Mapping[str, str]) -> Config:
    """The config launch handed over in `env`, else (a user's own torchrun) --config/--set in
    `argv`; raises ConfigError (argparse exits 2 for an unknown argument)."""
    handed = resolved_config(env)
    if handed is None:
        return load_config_options(parse_config_options(argv, "kubeddp worker"), env)
    if argv:  # launch passes none: these would be ignored
        raise ConfigError(
            f"{shlex.join(argv)}: a worker that kubeddp launch started takes the config launch "
            "loaded, not arguments; give --config/--set to kubeddp launch"
        )
    return handed


def run(cfg: Config) -> int:
    """Train with `cfg` in this process; the exit code (143 after a preemption save, 130 after
    Ctrl-C)."""
    die_with_launcher()
    rank = int(os.environ.get("RANK", "0"))
    # Imported after the config is known good: torch takes a second or two to import.
    from kubeddp.trainer.worker import network
    from kubeddp.trainer.worker.checkpoint import CheckpointError, StorageUnreachable
    from kubeddp.trainer.worker.diagnostics import Diverged
    from kubeddp.trainer.worker.distributed import (
        DistributedSetupError,
        init_distributed,
        teardown,
    )
    from kubeddp.trainer.worker.loop import Trainer
    from kubeddp.trainer.worker.preemption import Preempted

    nccl_log = network.prepare(cfg.network)  # before NCCL starts: it reads its env once
    try:
        ctx = init_distributed(cfg.ddp)
    except DistributedSetupError as exc:
        print(f"kubeddp: error: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    except Exception as exc:  # the store or a peer is gone before the group formed
        return _failed(exc, rank)
    if ctx.is_main:  # the checkpoint manager copies it next to the checkpoints
        print("[kubeddp] effective config:\n" + cfg.to_yaml(), flush=True)
    try:
        net = network.start(cfg.network, ctx, nccl_log, _say)
    except Exception as exc:  # a peer or the network failed during the check
        return _failed(exc, rank)
    if cfg.network.check == "only":
        return _network_only(cfg.metrics, ctx, net)
    code = 0
    try:
        trainer = Trainer(cfg, ctx, net)
    except ValueError as exc:  # ConfigError/WorkloadError: a corpus or factory that is wrong
        print(f"kubeddp: error (rank {rank}): {exc}", file=sys.stderr, flush=True)
        teardown(barrier=False)
        return exit_codes.BAD_INPUT
    except Exception as exc:  # DDP's first broadcast failed: a peer is gone
        return _failed(exc, rank)
    try:
        code = trainer.fit()
    except (Preempted, Diverged) as exc:
        code = int(exc.code)
    except StorageUnreachable as exc:  # before training: another try may reach it
        print(f"kubeddp: error (rank {rank}): {exc}", file=sys.stderr, flush=True)
        code = exit_codes.STORAGE_UNREACHABLE
    except (CheckpointError, ValueError) as exc:
        print(f"kubeddp: error (rank {rank}): {exc}", file=sys.stderr, flush=True)
        code = exit_codes.BAD_INPUT
    except Exception as exc:  # a collective failed (peer, network, timeout) or the program's bug
        code = _report(exc, rank)
    finally:
        trainer.close()
        del trainer
    if code >= exit_codes.RETRYABLE_FROM:
        # Peers may already be gone (preempted, failed): a teardown could wait on them; exit now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    try:
        teardown(barrier=code == 0)
    except Exception as exc:  # a peer died after its training ended: its last save may be lost
        _failed(exc, rank)
    if rank == 0 and code == 0:
        print("[kubeddp] finished", flush=True)
    return code


def _say(line: str) -> None:
    print(line, flush=True)


def _network_only(settings: MetricsConfig, ctx: DistContext, net: NetworkReport) -> int:
    """network.check=only: the check ran; publish the transport on /metrics and end."""
    from kubeddp.trainer.worker.distributed import teardown
    from kubeddp.trainer.worker.metrics import TrainingMetrics

    metrics = TrainingMetrics(
        settings,
        ctx.rank,
        ctx.world_size,
        ctx.backend,
        device=ctx.device,
        transport=net.info_labels(),
    )
    metrics.close()
    if ctx.is_main:
        if net.describe():
            print(f"[kubeddp] NCCL transport: {net.describe()}", flush=True)
        print("[kubeddp] network check done (network.check=only): no training", flush=True)
    teardown(barrier=True)
    return 0


def _report(exc: BaseException, rank: int) -> int:
    """Print why this rank failed and return its exit code: the program's own error with its
    traceback (fatal), a peer's failure as one line (retryable)."""
    from kubeddp.trainer.worker import failures

    code = failures.exit_code_for(exc)
    if code < exit_codes.RETRYABLE_FROM:
        traceback.print_exception(exc, file=sys.stderr)
    print(
        f"kubeddp: error (rank {rank}): {failures.one_line(exc)}; exit code "
        f"{exit_codes.describe(code)}",
        file=sys.stderr,
        flush=True,
    )
    return code


def _failed(exc: BaseException, rank: int) -> NoReturn:
    """Before training started: report, and leave without the teardown (its barrier needs the
    peers that may be gone)."""
    code = _report(exc, rank)
    sys.stdout.flush()
    os._exit(code)
