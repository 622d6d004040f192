"""Who may touch a job's checkpoints: every keeper request signed with the job's secret.

The secret is a file (a mounted Kubernetes Secret) named by KUBEDDP_CHECKPOINT_KEEPER_TOKEN_FILE
in the keeper's pod and every training pod (the keeper also takes `--token-file`). It never
crosses the wire and never appears in argv, logs or messages: a request carries an HMAC-SHA256
over its method, path, time, a fresh nonce, the keeper's epoch and its body's SHA-256 (a
block's: the digest the writer recorded, which the keeper checks the block against), so a
request read off the network cannot be changed, and the keeper refuses it a second time (it
remembers nonces for the allowed clock skew) or later than the skew.

A restart forgets the nonces, so each keeper start draws a new epoch (16 random bytes, never
written anywhere) and a request is good only for the epoch it was signed for: one captured
before a restart is refused after it. A pod learns the epoch, and the keeper's clock, from the
keeper's signed refusal (401 with X-Kubeddp-Refusal `epoch` or `clock`) and signs again: a
pod's first request and its first after a keeper restart cost one round trip, and a pod whose
clock is off signs with the keeper's time (saying so in one line) instead of failing.

Replies are signed the same way over the request's nonce, the status, the body's SHA-256, the
epoch, the keeper's time and the refusal: a pod never takes a forged "committed", a forged
listing (whose digests it checks every fetched block against) or a forged epoch or time.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from kubeddp.trainer import constants

SCHEME = "KUBEDDP-HMAC-SHA256"
DATE_HEADER = "X-Kubeddp-Date"
NONCE_HEADER = "X-Kubeddp-Nonce"
BODY_HEADER = "X-Kubeddp-Content-Sha256"
REPLY_HEADER = "X-Kubeddp-Reply-Signature"
EPOCH_HEADER = "X-Kubeddp-Epoch"
KEEPER_DATE_HEADER = "X-Kubeddp-Keeper-Date"
REFUSAL_HEADER = "X-Kubeddp-Refusal"
# why a request was refused (401), as a pod reads it: EPOCH and CLOCK are signed again
EPOCH, CLOCK, UNSIGNED, SIGNATURE, REPLAY, FULL = (
    "epoch", "clock", "unsigned", "signature", "replay", "full"
)  # fmt: skip
MAX_SKEW_SECONDS = 300
MIN_SECRET_BYTES = 16
MAX_SECRET_BYTES = 4096
MAX_REMEMBERED = 200_000  # nonces within the skew window; only signed requests are remembered
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


class SecretError(ValueError):
    """The secret's file is missing, unreadable or not a secret (one line, never its content)."""


class Secret:
    """The job's keeper secret. Its repr never shows it."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def __repr__(self) -> str:
        return "Secret(<hidden>)"

    def sign(self, text: str) -> str:
        return hmac.new(self._key, text.encode(), hashlib.sha256).hexdigest()

    @classmethod
    def from_file(cls, path: str) -> Secret:
        where = f"the checkpoint keeper's secret file {path!r}"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise SecretError(f"{where} is not a regular file; mount the job's Secret")
                raw = os.read(fd, MAX_SECRET_BYTES + 1)
            finally:
                os.close(fd)
        except OSError as exc:
            raise SecretError(
                f"{where} cannot be read ({exc.strerror or exc}); mount the job's keeper Secret "
                f"there, or unset {constants.ENV_CHECKPOINT_KEEPER_TOKEN_FILE}"
            ) from None
        key = raw.strip()
        if not MIN_SECRET_BYTES <= len(key) <= MAX_SECRET_BYTES:
            raise SecretError(
                f"{where} holds {len(key)} bytes; a secret has {MIN_SECRET_BYTES} to "
                f"{MAX_SECRET_BYTES} (e.g. 32 random bytes, base64)"
            )
        return cls(key)


def secret_from_env(env: Mapping[str, str]) -> Secret | None:
    path = env.get(constants.ENV_CHECKPOINT_KEEPER_TOKEN_FILE)
    return Secret.from_file(path) if path else None


def _request_text(
    method: str, target: str, date: str, nonce: str, body_sha256: str, epoch: str
) -> str:
    return f"kubeddp-keeper-request-v2\n{method}\n{target}\n{date}\n{nonce}\n{body_sha256}\n{epoch}"


@dataclass(frozen=True)
class ReplyFacts:
    """What a signed reply says besides its body: the keeper's epoch and time, and why it
    refused (empty: it did not)."""

    epoch: str = ""
    date: str = ""
    refusal: str = ""


def _reply_text(nonce: str, status: int, body_sha256: str, facts: ReplyFacts) -> str:
    return (
        f"kubeddp-keeper-reply-v2\n{nonce}\n{status}\n{body_sha256}\n{facts.epoch}\n"
        f"{facts.date}\n{facts.refusal}"
    )


def request_headers(
    secret: Secret,
    method: str,
    target: str,
    body_sha256: str = EMPTY_SHA256,
    epoch: str = "",
    offset: float = 0.0,
) -> dict[str, str]:
    """The headers that sign one request (`target`: its path and query, as sent) for the
    keeper's `epoch`, dated by this clock plus `offset` (the keeper's clock, once learnt)."""
    date, nonce = str(int(time.time() + offset)), secrets.token_hex(16)
    signature = secret.sign(_request_text(method, target, date, nonce, body_sha256, epoch))
    return {
        DATE_HEADER: date,
        NONCE_HEADER: nonce,
        BODY_HEADER: body_sha256,
        EPOCH_HEADER: epoch,
        "Authorization": f"{SCHEME} {signature}",
    }


def reply_headers(
    secret: Secret, nonce: str, status: int, body_sha256: str, facts: ReplyFacts
) -> dict[str, str]:
    """The headers that sign one reply."""
    return {
        EPOCH_HEADER: facts.epoch,
        KEEPER_DATE_HEADER: facts.date,
        REFUSAL_HEADER: facts.refusal,
        REPLY_HEADER: secret.sign(_reply_text(nonce, status, body_sha256, facts)),
    }


def signed_reply(
    secret: Secret, nonce: str, status: int, body: bytes, headers: Mapping[str, str]
) -> ReplyFacts | None:
    """What a reply says, when it is signed with the job's secret for this request; else None."""
    facts = ReplyFacts(
        headers.get(EPOCH_HEADER) or "",
        headers.get(KEEPER_DATE_HEADER) or "",
        headers.get(REFUSAL_HEADER) or "",
    )
    text = _reply_text(nonce, status, hashlib.sha256(body).hexdigest(), facts)
    given = headers.get(REPLY_HEADER) or ""
    return facts if hmac.compare_digest(secret.sign(text), given) else None


class RequestCheck:
    """The keeper's side: a request's signature, its epoch and time, and that it was not seen
    before. Each keeper start draws a new epoch: a request signed for an earlier start, whose
    nonce this one never saw, is refused for its epoch."""

    def __init__(self, secret: Secret, max_skew: float = MAX_SKEW_SECONDS) -> None:
        self.secret = secret
        self.max_skew = max_skew
        self.epoch = secrets.token_hex(16)
        self._seen: dict[str, float] = {}
        self._order: deque[tuple[float, str]] = deque()
        self._lock = threading.Lock()

    def facts(self, refusal: str = "") -> ReplyFacts:
        return ReplyFacts(self.epoch, str(int(time.time())), refusal)

    def problem(self, method: str, target: str, headers: Mapping[str, str]) -> Refusal | None:
        """None when the request is the job's, for this epoch and now; else why not (for a
        401, without secrets)."""
        date, nonce = headers.get(DATE_HEADER) or "", headers.get(NONCE_HEADER) or ""
        body, epoch = headers.get(BODY_HEADER) or "", headers.get(EPOCH_HEADER) or ""
        scheme, _, given = (headers.get("Authorization") or "").partition(" ")
        if scheme != SCHEME or not date.isdigit() or not 16 <= len(nonce) <= 64 or not body:
            return Refusal(UNSIGNED, "the request is not signed with the job's keeper secret")
        expected = self.secret.sign(_request_text(method, target, date, nonce, body, epoch))
        if not hmac.compare_digest(expected, given.strip()):
            return Refusal(SIGNATURE, "the request's signature does not match the job's keeper "
                           "secret")  # fmt: skip
        if not hmac.compare_digest(epoch, self.epoch):
            return Refusal(EPOCH, "the request was signed for another start of the keeper (its "
                           "epoch); sign it again for this one")  # fmt: skip
        skew = time.time() - int(date)
        if abs(skew) > self.max_skew:
            return Refusal(CLOCK, f"the request was signed {skew:+.0f} s from the keeper's "
                           f"clock (at most {self.max_skew:g} s allowed); check the nodes' "
                           "clocks (NTP)")  # fmt: skip
        return self._remember(nonce)

    def _remember(self, nonce: str) -> Refusal | None:
        now = time.monotonic()
        with self._lock:
            while self._order and self._order[0][0] < now:
                self._seen.pop(self._order.popleft()[1], None)
            if nonce in self._seen:
                return Refusal(REPLAY, "the request was already made once (a replay)")
            if len(self._seen) >= MAX_REMEMBERED:
                return Refusal(FULL, "too many requests within the clock skew window; retry")
            expiry = now + 2 * self.max_skew
            self._seen[nonce] = expiry
            self._order.append((expiry, nonce))
        return None


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused: `code` (EPOCH, CLOCK, ...: the reply's X-Kubeddp-Refusal) and
    the line the reply's body says."""

    code: str
    line: str
