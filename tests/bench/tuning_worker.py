"""Run kubeddp's Trainer several times in one torchrun job, one config per run.

Start-up (imports, process group) is paid once, so many knob settings fit in a few minutes.
Runs go rep-major (every config once, then again, in a rotated order), so machine-load drifts
hit all configs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))  # torchrun runs this file as a script
from overhead_worker import run_trainer  # noqa: E402


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
            overrides = [*base, *overrides, f"checkpoint.dir={out / (tag + '-ckpt')}"]
            ctx = run_trainer(overrides, out / f"{tag}.json", ctx)
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
