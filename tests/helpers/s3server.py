"""A real S3-compatible server (moto's, from the dev extra) on 127.0.0.1, for checkpoint tests.

The server runs as its own process (tests.helpers.procs: killed with its tree whatever
happens); the environment for kubeddp carries test credentials and the endpoint, and nothing
from the machine (no ~/.aws files, no instance metadata).
"""

from __future__ import annotations

import contextlib
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers import procs
from tests.helpers.ports import free_port

BUCKET = "kubeddp-test"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "kubeddp-test", "AWS_SECRET_ACCESS_KEY": "kubeddp-secret"}
# Nothing from the machine: no shared files, no metadata service (it would be asked and wait).
ISOLATED = {
    "AWS_CONFIG_FILE": "/nonexistent/aws-config",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass
class S3Server:
    endpoint: str

    def env(self, **extra: str) -> dict[str, str]:
        """Credentials and endpoint for kubeddp's processes (or for `env` with them removed)."""
        return {**ISOLATED, **CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint, **extra}

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )

    def keys(self, prefix: str, bucket: str = BUCKET) -> list[str]:
        pages = (
            self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        )
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))


@contextlib.contextmanager
def started(log_dir: Path) -> Iterator[S3Server]:
    """moto's server on a free port of 127.0.0.1 with the bucket BUCKET made."""
    port = free_port()
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    with procs.started(argv, log_dir / "moto-server.log", procs.child_env(ISOLATED)) as proc:

        def answers() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        procs.wait_until(answers, 60, "the S3 server's port", proc)
        server = S3Server(f"http://127.0.0.1:{port}")
        server.client().create_bucket(Bucket=BUCKET)
        yield server
