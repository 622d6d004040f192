"""Checkpoints in S3-compatible object storage: `checkpoint.dir: s3://bucket/prefix`.

Needs the `s3` extra (boto3). Credentials come from the standard AWS sources (in a pod: the
AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY of a Secret given with envFrom, or the role of the
service account); AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL points at MinIO, Ceph, R2 and the like.

Layout and atomicity as on a disk: <prefix>/ckpt-<step:08d>/{state.pt, config.yaml} are
uploaded first and the COMPLETE object last; a checkpoint without it is incomplete and ignored
(and removed by the next save). COMPLETE records each file's size and BLAKE3 block digests
(trainer/checkpoint_digest.py), checked wherever the checkpoint is read (worker/checkpoint/
state.py). Deleting removes COMPLETE first. Object stores have no rename: setting aside copies
the objects to <name>.bad/ and deletes the originals (COMPLETE first). There is no writer lock
on a bucket: give each run its own prefix.

An endpoint is not trusted to have stored what it answered 200 to: every object written is
checked (its size from a HEAD; with AWS_ENDPOINT_URL, an S3-compatible server that may lie, it
is read back whole and its digests compared) before COMPLETE is written, so an upload stored
short is a failed save (retryable), never a "finished" run. An answer that is not S3's (a
redirect, JSON or a web page) is refused at once instead of retried, and every request ends
within a deadline of its whole (trainer/deadline.py), not only a timeout per read.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import IO, Any

from kubeddp.trainer import constants, storage_rules
from kubeddp.trainer.checkpoint_digest import (
    READ_BYTES,
    BlockHasher,
    FileDigest,
    HashingWriter,
    marker_text,
)
from kubeddp.trainer.deadline import DeadlineExceeded, call_within
from kubeddp.trainer.endpoints import S3_ENDPOINT_ENVS, url_problem
from kubeddp.trainer.worker.checkpoint.storage import (
    CKPT_RE,
    MARKER,
    NOTE_BYTES,
    CheckpointError,
    CheckpointRef,
    StorageUnreachable,
    WriteBody,
    reason,
)

# Imported in functions: boto3 and botocore, the `s3` extra: optional.

PROBE = constants.CHECKPOINT_PROBE
OWNER_NOTE = ".kubeddp-checkpoints"
SPOOL_BYTES = 64 * 2**20
ENDPOINT_ENVS = S3_ENDPOINT_ENVS
# One request's whole deadline, botocore's retries with back-off included (10 tries: about 2
# minutes), plus its object's size at 1 MB/s: a drip-fed answer ends there, retryable.
REQUEST_SECONDS = 300.0
MIN_BYTES_PER_SECOND = 1e6
# Operations whose answer carries the object's own Content-Type (what the writer gave it)
OBJECT_READS = ("GetObject", "HeadObject")
NOT_S3_TYPES = ("application/json", "text/html", "text/plain")


class NotS3(CheckpointError):
    """The endpoint answered as no S3 server does (fatal: the address is wrong)."""


def parse_url(url: str) -> tuple[str, str]:
    """(bucket, prefix) of `s3://bucket[/prefix]`; CheckpointError naming what is wrong (the
    rule is storage_rules', which the chart applies too)."""
    problem = storage_rules.object_store_problem(url) if url.startswith("s3://") else "x"
    if problem:
        raise CheckpointError(
            f"checkpoint.dir {url!r} is not a valid S3 URL; write s3://BUCKET/PREFIX (bucket: "
            "3-63 lower-case letters, digits, dots or hyphens; the prefix: no empty, `.` or "
            "`..` part)"
        )
    bucket, _, prefix = url[len("s3://") :].partition("/")
    return bucket, prefix.rstrip("/")


def _buffer() -> IO[bytes]:
    """A file for one object on its way: in memory up to 64 MiB, then on local disk, so a
    large checkpoint does not take its size twice in host memory."""
    return tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES, mode="w+b")


def _endpoint() -> str | None:
    for name in ENDPOINT_ENVS:
        if os.environ.get(name):
            return os.environ[name]
    return None


def _endpoint_name() -> str:
    return next((name for name in ENDPOINT_ENVS if os.environ.get(name)), ENDPOINT_ENVS[-1])


class S3Storage:
    """A prefix of an S3 bucket (see the module docstring)."""

    def __init__(self, bucket: str, prefix: str, client: Any) -> None:
        self.bucket, self.prefix, self.client = bucket, prefix, client
        self.location = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        self._errors = _Errors()
        # read every object back after writing it (an S3-compatible endpoint may answer 200
        # to an upload it stored short); AWS S3 checks the checksum botocore sends with each
        self.read_back = True

    @classmethod
    def from_url(cls, url: str) -> S3Storage:
        bucket, prefix = parse_url(url)
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise CheckpointError(
                f"checkpoint.dir {url} needs boto3, which is not installed: "
                "pip install 'kubeddp[s3]'"
            ) from None
        endpoint = _endpoint()
        problem = url_problem(_endpoint_name(), endpoint, ("http", "https")) if endpoint else None
        if problem:
            raise CheckpointError(f"checkpoint.dir {url}: {problem}")
        session = boto3.session.Session()
        if session.get_credentials() is None:
            raise CheckpointError(
                f"checkpoint.dir {url}: no S3 credentials; set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (in a pod: from a Secret, with envFrom)"
            )
        config = Config(
            connect_timeout=10,
            read_timeout=120,
            # standard mode: throttling (SlowDown, 503) and 5xx retried with exponential
            # back-off and jitter (at most 20 s apart); then StorageUnreachable (retryable)
            retries={"max_attempts": _max_attempts(), "mode": "standard"},
            s3={"addressing_style": "path"} if _endpoint() else None,
        )
        client = session.client(
            "s3",
            endpoint_url=_endpoint(),
            region_name=session.region_name or "us-east-1",
            config=config,
        )
        # first: before botocore's region redirector, which recursed on a redirecting endpoint
        client.meta.events.register_first("needs-retry.s3", _refuse_what_is_not_s3)
        storage = cls(bucket, prefix, client)
        storage.read_back = _endpoint() is not None
        return storage

    # ---- names -------------------------------------------------------------------------------
    def _key(self, *names: str) -> str:
        return "/".join([self.prefix, *names] if self.prefix else names)

    def _url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def _key_of(self, ref: CheckpointRef) -> str:
        return str(ref.path)[len(f"s3://{self.bucket}/") :]

    def _all_keys(self, under: str) -> list[str]:
        keys = []
        for page in self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=under
        ):
            keys += [item["Key"] for item in page.get("Contents", [])]
        return keys

    def _groups(self) -> dict[str, set[str]]:
        """Top-level name -> the names of the objects under it ('' for a top-level object)."""
        base = self._key("")
        groups: dict[str, set[str]] = {}
        for key in self._all_keys(base):
            top, _, rest = key[len(base) :].partition("/")
            groups.setdefault(top, set()).add(rest)
        return groups

    # ---- the writer's claim ------------------------------------------------------------------
    def _timed(self, what: str, fn: Any, size: int = 0, **kwargs: Any) -> Any:
        """`fn(**kwargs)` within its whole deadline (DeadlineExceeded after it)."""
        seconds = REQUEST_SECONDS + size / MIN_BYTES_PER_SECOND
        return call_within(seconds, f"{what} at {self.location}", lambda: fn(**kwargs))

    def _call(self, what: str, fn: Any, size: int = 0, **kwargs: Any) -> Any:
        """One request; an endpoint that does not answer (or not whole, within its deadline)
        is StorageUnreachable (retryable), every other failure a one-line CheckpointError."""
        try:
            return self._timed(what, fn, size, **kwargs)
        except DeadlineExceeded as exc:
            raise StorageUnreachable(
                f"checkpoint.dir {self.location}: {exc}; check the endpoint "
                f"{self.client.meta.endpoint_url} and the network to it"
            ) from None
        except NotS3 as exc:
            raise NotS3(f"checkpoint.dir {self.location}: {exc}") from None
        except self._errors.unreachable as exc:
            raise StorageUnreachable(
                f"checkpoint.dir {self.location}: the S3 endpoint "
                f"{self.client.meta.endpoint_url} cannot be reached ({reason(exc)}); check "
                "AWS_ENDPOINT_URL and the network to it"
            ) from None
        except self._errors.client as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if _throttled(exc):
                raise StorageUnreachable(
                    f"checkpoint.dir {self.location}: {what} was refused as throttled or "
                    f"unavailable ({code or _status(exc)}) {_max_attempts()} times with back-off; "
                    "the pod is retried (raise the bucket's request rate or use another prefix)"
                ) from None
            raise CheckpointError(
                f"checkpoint.dir {self.location}: {what} failed ({code or reason(exc)}: "
                f"{exc.response.get('Error', {}).get('Message', '')}); " + _advice(code)
            ) from None
        except self._errors.boto as exc:
            raise CheckpointError(
                f"checkpoint.dir {self.location}: {what} failed ({reason(exc)})"
            ) from None

    def prepare(self) -> str | None:
        self._call("the bucket check", self.client.head_bucket, Bucket=self.bucket)
        key, token = self._key(PROBE), os.urandom(16).hex().encode()
        self._call("a test write", self.client.put_object, Bucket=self.bucket, Key=key, Body=token)
        got = self._call("a test read", self._read_back, key=key)
        if got != token:
            raise CheckpointError(
                f"checkpoint.dir {self.location}: the endpoint {self.client.meta.endpoint_url} "
                f"answered the test read with {_what(got)} instead of the object just written; "
                "AWS_ENDPOINT_URL must be the S3 API's address (not a console's or a web page's)"
            )
        self._call("a test delete", self.client.delete_object, Bucket=self.bucket, Key=key)
        # Says "this prefix is kubeddp's" (what the lock file says on a disk; safety.py).
        self.write_note(OWNER_NOTE, "checkpoints written by kubeddp\n")
        return None

    def release(self) -> None:
        return None

    def _read_back(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read(4096)

    def top_names(self) -> list[str]:
        return sorted(self._call("listing", self._groups))

    # ---- reading -----------------------------------------------------------------------------
    def list(self) -> list[CheckpointRef]:
        """Complete checkpoints, newest first; a prefix naming one checkpoint lists just it."""
        own = CKPT_RE.match(self.prefix.rpartition("/")[2])
        if own:
            keys = self._call("listing", self._all_keys, under=self._key(""))
            if self._key(MARKER) in keys:
                return [CheckpointRef(self._url(self.prefix), int(own.group(1)), self)]
            return []
        refs = []
        for name, objects in self._call("listing", self._groups).items():
            m = CKPT_RE.match(name)
            if m and MARKER in objects:
                refs.append(CheckpointRef(self._url(self._key(name)), int(m.group(1)), self))
        return sorted(refs, key=lambda r: r.step, reverse=True)

    def open_file(self, ref: CheckpointRef, name: str) -> IO[bytes]:
        key = f"{self._key_of(ref)}/{name}"
        size = self._call(f"reading {name}", self.client.head_object, Bucket=self.bucket,
                          Key=key).get("ContentLength", 0)  # fmt: skip
        data = _buffer()  # torch.load needs a seekable file
        try:
            self._call(f"reading {name}", self.client.download_fileobj, int(size or 0),
                       Bucket=self.bucket, Key=key, Fileobj=data)  # fmt: skip
        except BaseException:
            data.close()
            raise
        data.seek(0)
        return data

    # ---- writing -----------------------------------------------------------------------------
    def write(self, step: int, files: dict[str, WriteBody]) -> CheckpointRef:
        name = f"ckpt-{step:08d}"
        ref = CheckpointRef(self._url(self._key(name)), step, self)
        try:
            # The same step saved again: its marker goes first, so a kill mid-way leaves an
            # incomplete checkpoint (ignored), never one that mixes two saves.
            self._timed("a delete", self.client.delete_object, Bucket=self.bucket,
                        Key=self._key(name, MARKER))  # fmt: skip
            digests = {}
            for file, body in files.items():
                with _buffer() as data:
                    hashed = HashingWriter(data)
                    body(hashed)  # type: ignore[arg-type] - a write-only binary stream
                    digests[file] = hashed.hasher.finish()
                    data.seek(0)
                    self._timed(f"uploading {file}", self.client.upload_fileobj,
                                digests[file].size, Fileobj=data, Bucket=self.bucket,
                                Key=self._key(name, file))  # fmt: skip
                self._check_stored(self._key(name, file), digests[file])
            marker = marker_text(step, digests).encode()
            self._timed("writing the marker", self.client.put_object, Bucket=self.bucket,
                        Key=self._key(name, MARKER), Body=marker)  # fmt: skip
            self._check_stored(self._key(name, MARKER), _digest_of(marker))
        except Exception as exc:
            self._remove_quietly(name)
            retry = (
                isinstance(exc, (self._errors.unreachable, StorageUnreachable, DeadlineExceeded))
                or _throttled(exc)
            ) and not isinstance(exc, NotS3)
            raise (StorageUnreachable if retry else CheckpointError)(
                f"cannot write checkpoint {ref.path}: {reason(exc)} (check the endpoint, the "
                "bucket's permissions and quota)"
            ) from exc
        return ref

    def _check_stored(self, key: str, digest: FileDigest) -> None:
        """What the endpoint stored under `key` is what was sent: its size, and with
        `read_back` its bytes (an endpoint that stores part of an upload and answers 200 must
        not leave a checkpoint that looks whole). StorageUnreachable when it is not."""
        stored = self._timed("checking an upload", self.client.head_object, Bucket=self.bucket,
                             Key=key).get("ContentLength")  # fmt: skip
        if stored != digest.size:
            raise StorageUnreachable(
                f"the endpoint stored {stored} of the {digest.size} bytes of {self._url(key)} "
                "and answered 200; the save is not kept"
            )
        if not self.read_back:
            return
        hasher = BlockHasher(digest.block, digest.algorithm)
        body = self._timed("reading back an upload", self.client.get_object, digest.size,
                           Bucket=self.bucket, Key=key)["Body"]  # fmt: skip
        got = self._timed("reading back an upload", _hash_stream, digest.size, body=body,
                          hasher=hasher)  # fmt: skip
        if got != digest:
            raise StorageUnreachable(
                f"{self._url(key)} read back is not what was written ({got.size} bytes, "
                f"{digest.size} sent); the save is not kept"
            )

    def _remove_quietly(self, name: str) -> None:
        with contextlib.suppress(Exception):  # best effort; the next save's sweep retries
            keys = self._timed("listing", self._all_keys, under=self._key(name, ""))
            self._timed("a delete", self._delete_keys, keys=sorted(keys))

    def _delete_keys(self, keys: list[str]) -> None:
        marker = [k for k in keys if k.endswith("/" + MARKER)]
        rest = [k for k in keys if k not in marker]
        for batch in (marker, *[rest[i : i + 1000] for i in range(0, len(rest), 1000)]):
            if batch:
                self.client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
                )

    def delete(self, ref: CheckpointRef) -> None:
        key = self._key_of(ref)
        keys = self._call("listing", self._all_keys, under=key + "/")
        self._call("a delete", self._delete_keys, keys=keys)

    def remove_partial(self) -> None:
        for name, objects in self._call("listing", self._groups).items():
            if CKPT_RE.match(name) and MARKER not in objects:
                self._remove_quietly(name)

    def set_aside(self, ref: CheckpointRef, suffix: str = ".bad") -> str | None:
        try:
            return self._timed("setting aside", self._move, key=self._key_of(ref), suffix=suffix)
        except Exception:  # noqa: BLE001 - not moved: the caller reports it
            return None

    def _move(self, key: str, suffix: str) -> str | None:
        """Copy the objects under `key` to <name><suffix>[-N] and delete the originals."""
        base, _, name = key.rpartition("/")
        taken = set(self._groups())
        for attempt in range(100):
            target = f"{name}{suffix}" + (f"-{attempt}" if attempt else "")
            if target not in taken:
                break
        else:
            return None
        target_key = f"{base}/{target}" if base else target
        keys = self._all_keys(key + "/")
        for source in keys:
            copy = {"Bucket": self.bucket, "Key": source}
            self.client.copy(copy, self.bucket, target_key + source[len(key) :])
        self._delete_keys(keys)
        return self._url(target_key)

    def read_note(self, name: str) -> str | None:
        try:
            answer = self._call(f"reading {name}", self.client.get_object, Bucket=self.bucket,
                                Key=self._key(name), Range=f"bytes=0-{NOTE_BYTES - 1}")  # fmt: skip
            body = self._timed(f"reading {name}", answer["Body"].read, NOTE_BYTES)
        except StorageUnreachable:
            raise
        except CheckpointError:  # none there (NoSuchKey), or not readable: not a note
            return None
        return body.decode(errors="replace")

    def write_note(self, name: str, text: str | bytes) -> None:
        self._call(
            f"writing {name}",
            self.client.put_object,
            Bucket=self.bucket,
            Key=self._key(name),
            Body=text if isinstance(text, bytes) else text.encode(),
        )


def _hash_stream(body: Any, hasher: BlockHasher) -> FileDigest:
    while chunk := body.read(READ_BYTES):
        hasher.update(chunk)
    return hasher.finish()


def _digest_of(data: bytes) -> FileDigest:
    hasher = BlockHasher()
    hasher.update(data)
    return hasher.finish()


def _refuse_what_is_not_s3(response: Any = None, operation: Any = None, **_: Any) -> None:
    """botocore's `needs-retry` hook, before any retry: an answer no S3 server gives is
    refused at once (NotS3, fatal) instead of being retried for minutes as a server error (a
    JSON or HTML 200 that botocore cannot parse becomes a 500) or followed into a
    RecursionError (a redirect, which botocore's region redirector follows again and again)."""
    if response is None:
        return
    http = response[0]
    # the status as it came (botocore turns a 200 whose body it cannot parse into a 500)
    status = int(getattr(getattr(http, "raw", None), "status", 0) or http.status_code or 0)
    headers = getattr(http, "headers", {}) or {}
    name = getattr(operation, "name", "")
    if 300 <= status < 400 and status != 304:
        where = headers.get("Location") or "nowhere"
        raise NotS3(
            f"the S3 endpoint answered {status} with a redirect to {where[:200]}; "
            "AWS_ENDPOINT_URL must be the S3 API's own address (https, the right host and port)"
        )
    kind = str(headers.get("Content-Type") or "").split(";")[0].strip().lower()
    with_body = headers.get("Content-Length") not in (None, "0") or headers.get("Transfer-Encoding")
    # a success with a body no S3 operation sends (errors go on to botocore: a gateway's 502
    # in text is retried as it should be; an empty 204 may say any type)
    if 200 <= status < 300 and with_body and name not in OBJECT_READS and kind in NOT_S3_TYPES:
        what = "an HTML page" if kind == "text/html" else f"{kind} (S3 answers XML)"
        raise NotS3(
            f"the endpoint answered {name} with {status} and {what}: it is not an S3 API; "
            "AWS_ENDPOINT_URL must be the S3 API's address (not a console's or a web page's)"
        )


# Answers that say "later", not "no": retried with back-off, then retryable (202)
THROTTLED = frozenset((
    "SlowDown", "ServiceUnavailable", "Throttling", "ThrottlingException", "RequestLimitExceeded",
    "TooManyRequests", "RequestThrottled", "RequestThrottledException", "InternalError",
))  # fmt: skip
DEFAULT_ATTEMPTS = 10


def _max_attempts() -> int:
    """AWS_MAX_ATTEMPTS as botocore reads it, else 10 tries (about 2 minutes of back-off)."""
    raw = os.environ.get("AWS_MAX_ATTEMPTS", "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else DEFAULT_ATTEMPTS


def _status(exc: BaseException) -> int:
    response = getattr(exc, "response", None) or {}
    return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _throttled(exc: BaseException) -> bool:
    response = getattr(exc, "response", None) or {}
    code = response.get("Error", {}).get("Code", "")
    return code in THROTTLED or _status(exc) in (429, 500, 502, 503, 504)


def _what(body: bytes) -> str:
    if b"<html" in body[:1024].lower() or b"<!doctype html" in body[:1024].lower():
        return "an HTML page"
    return f"{len(body)} other bytes"


def _advice(code: str) -> str:
    if code in ("404", "NoSuchBucket"):
        return "create the bucket, or fix the bucket name in checkpoint.dir"
    if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
        return "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY and the bucket's policy"
    return "check the bucket and its permissions"


class _Errors:
    def __init__(self) -> None:
        from botocore import exceptions as e

        self.unreachable = (
            e.EndpointConnectionError,
            e.ConnectTimeoutError,
            e.ReadTimeoutError,
            e.ConnectionClosedError,
        )
        self.client = e.ClientError
        self.boto = e.BotoCoreError
