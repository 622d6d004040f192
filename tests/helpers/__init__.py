"""Helpers shared by the multi-process tests.

procs: start a command as a tree that is always cleaned up (torchrun workers included);
netns: network namespaces as cluster nodes; mounts: private tmpfs mounts (full, read-only), a
/tmp or a network of a program's own; tutorials: how each tutorial-style script runs;
privileges: skip without root, fail in CI; workloads: test workloads for workload.name=custom;
checkpoints: the resume scenario and assertions on what a run left in its checkpoint dir.
"""
