"""kubeddp: PyTorch DDP on Kubernetes; code lives in `kubeddp.trainer` and `kubeddp.tools`."""

from kubeddp.trainer import __version__

__all__ = ["__version__"]
