"""Code that runs inside the training pod: launch, rendezvous, DDP loop, checkpoints, metrics."""

__version__ = "0.1.0"
