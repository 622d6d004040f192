"""The training worker: one DDP process, started by torchrun (`python -m kubeddp.trainer.worker`)
`nproc_per_node` times per node. Entry point: entry.py; the loop: loop.py."""
