"""Code that runs inside the training pod: launcher/ (the launch process), worker/ (each training
process), and what both use: the config, shared constants and the workloads."""

__version__ = "0.1.0"
