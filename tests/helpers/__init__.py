"""Helpers shared by the multi-process tests: process trees (procs), network namespaces (netns),
and test-only workloads (workloads)."""
