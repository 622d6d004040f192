"""Where the upstream reference data lives (Kubeflow CRDs, the operators' env matrix).

Tests read it from $KUBEDDP_REFERENCE_DIR (a relative path is taken from the repository root),
default ../shared/reference beside the repository. The GitHub workflow downloads the same files
at the same pinned tags into a folder and sets the variable (see .github/workflows/ci.yml).
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENV = "KUBEDDP_REFERENCE_DIR"


def reference_dir() -> Path:
    configured = os.environ.get(ENV)
    return (REPO / configured) if configured else (REPO / ".." / "shared" / "reference")


REFERENCE_DIR = reference_dir()
CRDS = REFERENCE_DIR / "crds"
ENV_MATRIX = REFERENCE_DIR / "kubeflow-env-matrix.csv"
