"""requirements/image.lock pins every Python package of the image but torch, each with sha256
hashes, and satisfies what kubeddp and torch require; the Dockerfile installs it with
--require-hashes (tests/e2e/test_image_build.py builds the image from it)."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "requirements" / "image.lock"
ENTRY = re.compile(
    r"^([A-Za-z0-9._-]+)==(\S+) \\\n((?:    --hash=sha256:[0-9a-f]{64}(?: \\)?\n)+)", re.M
)


def locked() -> dict[str, tuple[Version, int]]:
    text = LOCK.read_text()
    entries = ENTRY.findall(text)
    body = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert sum(1 + hashes.count("--hash") for _, _, hashes in entries) == len(body), (
        "a line of image.lock is neither a pin nor a hash"
    )
    return {canonicalize_name(n): (Version(v), h.count("--hash")) for n, v, h in entries}


def _linux(req: Requirement) -> bool:
    env = {"sys_platform": "linux", "platform_system": "Linux", "extra": ""}
    return not req.marker or req.marker.evaluate({**env, "platform_machine": "x86_64"})


def test_every_pin_has_a_hash_and_torch_is_not_in_it() -> None:
    pins = locked()
    assert pins and all(count >= 1 for _, count in pins.values())
    assert "torch" not in pins


def test_the_lock_satisfies_kubeddp_and_torch() -> None:
    pins = locked()
    # kubeddp's own (no extras) as installed from pyproject.toml, and torch's
    wanted = [Requirement(text) for text in importlib.metadata.requires("kubeddp") or []]
    wanted += [Requirement(text) for text in importlib.metadata.requires("torch") or []]
    for req in wanted:
        name = canonicalize_name(req.name)
        if name == "torch" or not _linux(req):
            continue
        assert name in pins, f"{req} is not in {LOCK.name}; run .ci/lock_image_deps.py"
        assert req.specifier.contains(pins[name][0], prereleases=True), (
            f"{LOCK.name} has {name}=={pins[name][0]}, which is not {req}"
        )


def test_the_dockerfile_installs_the_lock_with_hashes() -> None:
    text = (REPO / "Dockerfile").read_text()
    assert "COPY requirements/image.lock /tmp/deps/" in text
    assert "--require-hashes --no-deps -r /tmp/deps/image.lock" in text
