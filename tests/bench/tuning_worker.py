"""Run kubeddp's Trainer several times in one torchrun job, one config per run.

Start-up (imports, process group) is paid once, so many knob settings fit in a few minutes.
Runs go rep-major (every config once, then again, in a rotated order), so machine-load drifts
hit all configs.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
from pathlib import Path

import torch.distributed as dist

from kubeddp.trainer import constants
from kubeddp.trainer.config import load_config
from kubeddp.trainer.distributed import init_distributed
from kubeddp.trainer.loop import Trainer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out-dir", required=True)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--base", required=True, help="JSON list of overrides for every run")
    p.add_argument("--configs", required=True, help="JSON list of [name, [overrides]]")
    args = p.parse_args()
    out = Path(args.out_dir)
    base: list[str] = json.loads(args.base)
    configs: list[tuple[str, list[str]]] = json.loads(args.configs)
    ctx = None
    for rep in range(args.reps):
        shift = rep % len(configs)  # rotate, so no config always runs first (cold caches)
        for name, overrides in configs[shift:] + configs[:shift]:
            tag = f"{name}-{rep}"
            cfg = load_config(None, [*base, *overrides, f"checkpoint.dir={out / (tag + '-ckpt')}"])
            if ctx is None:
                ctx = init_distributed(cfg.ddp)
            os.environ[constants.ENV_SUMMARY_FILE] = str(out / f"{tag}.json")
            trainer = Trainer(cfg, ctx)
            try:
                trainer.fit()
            finally:
                trainer.close()
                del trainer
                gc.collect()
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
