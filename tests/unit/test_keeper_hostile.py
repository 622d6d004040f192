"""Round five of the adversary's inputs against the checkpoint keeper (docs/ci-and-testing.md,
"Adversarial rounds"): one real `kubeddp keeper` with a secret, and a table of requests a
well-behaved pod never sends, each signed with the job's secret unless the row says otherwise
(so the row meets the check it is about, not the signature). What every row must leave: the
status the table names, and the claim as it was (the checkpoint, the loose file, nothing
outside the claim, nothing new).

Rows are (request, want): the request is built from the keeper's epoch at run time, so a row
about the epoch or the clock can take them apart.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kubeddp.trainer.checkpoint_digest import MIN_BLOCK_BYTES, BlockHasher
from kubeddp.trainer.keeper import auth as keeper_auth
from kubeddp.trainer.keeper.local_dir import scan
from kubeddp.trainer.keeper.sync import unit_upload
from tests.helpers.keeper import (
    Keeper,
    checkpoint,
    epoch_of,
    keeper_up,
    raw_exchange,
    request_bytes,
    write_secret,
)

pytestmark = pytest.mark.timeout(180)


@dataclass(frozen=True)
class Hostile:
    """One request: method, target, body; `tamper` changes the signed headers (after signing:
    the signature no longer holds unless it re-signs); `sign` False sends it unsigned."""

    method: str
    target: str
    body: bytes = b""
    tamper: Callable[[dict[str, str], str], dict[str, str]] | None = None
    sign: bool = True
    extra: dict[str, str] = field(default_factory=dict)
    epoch: str | None = None  # signed for this epoch; None: the keeper's


SECRETS: dict[str, keeper_auth.Secret] = {}  # the module keeper's, for rows that re-sign


def _resign(headers: dict[str, str], _epoch: str, method: str, target: str) -> dict[str, str]:
    """`headers` signed again as if for another method or path (the keeper's secret)."""
    text = keeper_auth._request_text(method, target, headers[keeper_auth.DATE_HEADER],
                                     headers[keeper_auth.NONCE_HEADER],
                                     headers[keeper_auth.BODY_HEADER],
                                     headers[keeper_auth.EPOCH_HEADER])  # fmt: skip
    return {**headers, "Authorization": f"{keeper_auth.SCHEME} {SECRETS['keeper'].sign(text)}"}


def _upload(kind: str, name: str, files: dict[str, int], keep: object = None) -> bytes:
    hashed = {}
    for rel, size in files.items():
        hasher = BlockHasher(MIN_BLOCK_BYTES)
        hasher.update(b"x" * size)
        hashed[rel] = {**hasher.finish().to_json(), "mtime_ns": 0}
    return json.dumps({"kind": kind, "name": name, "files": hashed, "keep": keep}).encode()


def _redated(seconds: float) -> Callable[[dict[str, str], str], dict[str, str]]:
    def change(headers: dict[str, str], _epoch: str) -> dict[str, str]:
        return {**headers, keeper_auth.DATE_HEADER: str(int(time.time() + seconds))}

    return change


def _set(name: str, value: str) -> Callable[[dict[str, str], str], dict[str, str]]:
    return lambda headers, _epoch: {**headers, name: value}


OK, BAD, UNAUTHORIZED, FORBIDDEN, NOT_FOUND = 200, 400, 401, 403, 404
# request: (the request, the statuses it may get); every row also keeps the claim as it was
ROWS: dict[str, tuple[Hostile, tuple[int, ...]]] = {
    # the signature and what it covers
    "epoch empty": (Hostile("DELETE", "/v2/file/notes.txt", epoch=""), (UNAUTHORIZED,)),
    "epoch of another start": (
        Hostile("DELETE", "/v2/file/notes.txt", epoch="0" * 32),
        (UNAUTHORIZED,),
    ),  # fmt: skip
    "epoch changed after signing": (
        Hostile("DELETE", "/v2/file/notes.txt", tamper=_set(keeper_auth.EPOCH_HEADER, "0" * 32)),
        (UNAUTHORIZED,),
    ),  # fmt: skip
    "epoch header twice": (
        Hostile("GET", "/v2/list", extra={"X-Kubeddp-Epoch": "x"}),
        (UNAUTHORIZED, BAD),
    ),  # fmt: skip
    "date a day ahead": (Hostile("GET", "/v2/list", tamper=_redated(86400)), (UNAUTHORIZED,)),
    "date negative": (
        Hostile("GET", "/v2/list", tamper=_set(keeper_auth.DATE_HEADER, "-5")),
        (UNAUTHORIZED,),
    ),  # fmt: skip
    "date huge": (
        Hostile("GET", "/v2/list", tamper=_set(keeper_auth.DATE_HEADER, "9" * 400)),
        (UNAUTHORIZED,),
    ),  # fmt: skip
    "nonce short": (
        Hostile("GET", "/v2/list", tamper=_set(keeper_auth.NONCE_HEADER, "ab")),
        (UNAUTHORIZED,),
    ),  # fmt: skip
    "nonce overlong": (
        Hostile("GET", "/v2/list", tamper=_set(keeper_auth.NONCE_HEADER, "a" * 65)),
        (UNAUTHORIZED,),
    ),  # fmt: skip
    "body digest of another body": (
        Hostile(
            "PUT",
            "/v2/link/a",
            b'{"target": "b"}',
            tamper=_set(keeper_auth.BODY_HEADER, hashlib.sha256(b'{"target": "c"}').hexdigest()),
        ),
        (UNAUTHORIZED,),
    ),  # fmt: skip
    "scheme lower case": (
        Hostile(
            "GET",
            "/v2/list",
            tamper=lambda h, e: {
                **h,
                "Authorization": h["Authorization"].replace("KUBEDDP", "kubeddp"),
            },
        ),
        (UNAUTHORIZED,),
    ),  # fmt: skip
    "GET's signature on a DELETE": (
        Hostile(
            "DELETE",
            "/v2/file/notes.txt",
            tamper=lambda h, e: _resign(h, e, "GET", "/v2/file/notes.txt"),
        ),
        (UNAUTHORIZED,),
    ),  # fmt: skip
    "a signed GET replayed as a DELETE": (
        Hostile(
            "DELETE", "/v2/file/notes.txt", tamper=lambda h, e: {**h, "Authorization": "replaced"}
        ),
        (UNAUTHORIZED,),
    ),  # fmt: skip
    "unsigned delete": (Hostile("DELETE", "/v2/file/notes.txt", sign=False), (UNAUTHORIZED,)),
    "unsigned upload": (
        Hostile("POST", "/v2/txn", _upload("file", "x", {"x": 1}), sign=False),
        (UNAUTHORIZED,),
    ),  # fmt: skip
    # paths: climbing, encodings, the keeper's own names
    "file dot dot": (Hostile("GET", "/v2/file/../secret"), (BAD, NOT_FOUND)),
    "file encoded dot dot": (Hostile("GET", "/v2/file/%2e%2e/secret"), (BAD, NOT_FOUND)),
    "file encoded slash": (
        Hostile("DELETE", "/v2/file/ckpt-00000004%2fstate.pt"),
        (FORBIDDEN, BAD),
    ),  # fmt: skip
    "file absolute": (Hostile("DELETE", "/v2/file//etc/passwd"), (BAD, NOT_FOUND)),
    "file nul": (Hostile("DELETE", "/v2/file/notes%00.txt"), (BAD,)),
    "file not utf-8": (Hostile("DELETE", "/v2/file/%ff%fe"), (BAD,)),
    "keeper's own folder": (Hostile("DELETE", "/v2/file/.kubeddp-keeper/aside"), (BAD,)),
    "keeper's record": (
        Hostile("DELETE", "/v2/file/ckpt-00000004/.kubeddp-keeper.json"),
        (BAD, FORBIDDEN),
    ),  # fmt: skip
    "older keeper's staging": (Hostile("DELETE", "/v2/file/.incoming/x"), (BAD,)),
    "path of 5000 bytes": (Hostile("DELETE", "/v2/file/" + "a" * 5000), (BAD, 431)),
    "name of 300 bytes": (Hostile("DELETE", "/v2/file/" + "a" * 300), (BAD,)),
    "list with a query": (Hostile("GET", "/v2/list?../../x"), (OK,)),
    "api path doubled slash": (Hostile("GET", "/v2//list"), (NOT_FOUND,)),
    "unknown route": (Hostile("GET", "/v2/admin"), (NOT_FOUND,)),
    "old api version": (Hostile("GET", "/v1/list"), (NOT_FOUND,)),
    # checkpoints are whole
    "delete a checkpoint's file": (
        Hostile("DELETE", "/v2/file/ckpt-00000004/state.pt"),
        (FORBIDDEN,),
    ),  # fmt: skip
    "delete a checkpoint": (Hostile("DELETE", "/v2/file/ckpt-00000004"), (FORBIDDEN,)),
    "link into a checkpoint": (
        Hostile("PUT", "/v2/link/ckpt-00000004/x", b'{"target": "y"}'),
        (FORBIDDEN,),
    ),  # fmt: skip
    "link named as a checkpoint": (
        Hostile("PUT", "/v2/link/ckpt-00000009", b'{"target": "notes.txt"}'),
        (FORBIDDEN,),
    ),  # fmt: skip
    "file upload into a checkpoint": (
        Hostile(
            "POST",
            "/v2/txn",
            _upload("file", "ckpt-00000004/evil.pt", {"ckpt-00000004/evil.pt": 10}),
        ),
        (BAD,),
    ),  # fmt: skip
    "file upload planting a marker": (
        Hostile(
            "POST",
            "/v2/txn",
            _upload("file", "ckpt-00000011/COMPLETE", {"ckpt-00000011/COMPLETE": 10}),
        ),
        (BAD,),
    ),  # fmt: skip
    "file upload into a set-aside one": (
        Hostile(
            "POST", "/v2/txn", _upload("file", "ckpt-00000004.bad/x", {"ckpt-00000004.bad/x": 1})
        ),
        (BAD,),
    ),  # fmt: skip
    "unit without its marker": (
        Hostile("POST", "/v2/txn", _upload("unit", "ckpt-00000012", {"ckpt-00000012/state.pt": 1})),
        (BAD,),
    ),  # fmt: skip
    "unit with a file outside it": (
        Hostile(
            "POST",
            "/v2/txn",
            _upload("unit", "ckpt-00000012", {"ckpt-00000012/COMPLETE": 1, "notes.txt": 1}),
        ),
        (BAD,),
    ),  # fmt: skip
    "unit named with a slash": (
        Hostile(
            "POST", "/v2/txn", _upload("unit", "a/ckpt-00000012", {"a/ckpt-00000012/COMPLETE": 1})
        ),
        (BAD,),
    ),  # fmt: skip
    "unit keep zero": (
        Hostile(
            "POST",
            "/v2/txn",
            _upload("unit", "ckpt-00000012", {"ckpt-00000012/COMPLETE": 1}, keep=0),
        ),
        (BAD,),
    ),  # fmt: skip
    "unit keep a bool": (
        Hostile(
            "POST",
            "/v2/txn",
            _upload("unit", "ckpt-00000012", {"ckpt-00000012/COMPLETE": 1}, keep=True),
        ),
        (BAD,),
    ),  # fmt: skip
    "file upload two files": (
        Hostile("POST", "/v2/txn", _upload("file", "a", {"a": 1, "b": 1})),
        (BAD,),
    ),  # fmt: skip
    "upload kind unknown": (Hostile("POST", "/v2/txn", _upload("dir", "a", {"a": 1})), (BAD,)),
    "upload a list": (Hostile("POST", "/v2/txn", b"[1, 2]"), (BAD,)),
    "upload not json": (Hostile("POST", "/v2/txn", b"{kind: unit"), (BAD,)),
    "upload 100 levels deep": (
        Hostile("POST", "/v2/txn", b'{"a":' * 100 + b"1" + b"}" * 100),
        (BAD,),
    ),  # fmt: skip
    "upload larger than the disk": (
        Hostile(
            "POST",
            "/v2/txn",
            _upload("file", "big", {}).replace(
                b'"files": {}',
                b'"files": {"big": {"size": 1099511627776000, "block": 268435456, "blocks": []}}',
            ),
        ),
        (BAD, 507),
    ),  # fmt: skip
    # set aside, links and transactions
    "aside to another name": (Hostile("POST", "/v2/aside/ckpt-00000004?as=notes.txt"), (BAD,)),
    "aside climbing": (
        Hostile("POST", "/v2/aside/ckpt-00000004?as=../ckpt-00000004.bad"),
        (BAD,),
    ),  # fmt: skip
    "aside of a loose file": (
        Hostile("POST", "/v2/aside/notes.txt?as=notes.txt.bad"),
        (BAD, NOT_FOUND),
    ),  # fmt: skip
    "link absolute": (Hostile("PUT", "/v2/link/up", b'{"target": "/etc"}'), (BAD,)),
    "link climbing": (Hostile("PUT", "/v2/link/a/up", b'{"target": "../../x"}'), (BAD,)),
    "link dot": (Hostile("PUT", "/v2/link/here", b'{"target": "."}'), (BAD,)),
    "link nul": (Hostile("PUT", "/v2/link/n", b'{"target": "a\\u0000b"}'), (BAD,)),
    "link target a number": (Hostile("PUT", "/v2/link/n", b'{"target": 5}'), (BAD,)),
    "commit of an unknown upload": (
        Hostile("POST", "/v2/txn/" + "0" * 32 + "/commit"),
        (NOT_FOUND,),
    ),  # fmt: skip
    "block of an unknown upload": (
        Hostile("PUT", "/v2/txn/" + "0" * 32 + "/0/0", b"x"),
        (BAD, NOT_FOUND),
    ),  # fmt: skip
    "block numbers negative": (Hostile("PUT", "/v2/txn/abc/-1/0", b"x"), (BAD, NOT_FOUND)),
    "abort of another's upload": (Hostile("DELETE", "/v2/txn/" + "f" * 32), (NOT_FOUND,)),
}


@pytest.fixture(scope="module")
def keeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keeper]:
    tmp = tmp_path_factory.mktemp("hostile-keeper")
    secret = write_secret(tmp / "secret")
    with keeper_up(tmp / "claim", tmp, secret) as served:
        client = served.client()
        pod = tmp / "pod"
        checkpoint(pod, 4)
        files = scan(pod).units["ckpt-00000004"]
        client.upload(unit_upload(pod, "ckpt-00000004", files, 3), {r: pod / r for r in files})
        (served.root / "notes.txt").write_text("notes\n")
        yield served


def _claim(root: Path) -> dict[str, bytes]:
    found = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder, name)
            rel = str(path.relative_to(root))
            if not rel.startswith(".kubeddp-keeper/"):
                found[rel] = path.read_bytes() if not path.is_symlink() else b"link"
    return found


@pytest.mark.parametrize("row", ROWS)
def test_a_hostile_request_leaves_the_claim_as_it_was(keeper: Keeper, row: str) -> None:
    hostile, wanted = ROWS[row]
    secret = keeper.secret()
    assert secret is not None
    before = _claim(keeper.root)
    headers: dict[str, str] = {}
    SECRETS["keeper"] = secret
    if hostile.sign:
        epoch = epoch_of(keeper.port, secret) if hostile.epoch is None else hostile.epoch
        digest = hashlib.sha256(hostile.body).hexdigest()
        headers = keeper_auth.request_headers(secret, hostile.method, hostile.target, digest, epoch)
        if hostile.tamper is not None:
            headers = hostile.tamper(headers, epoch)
    headers = {**headers, **hostile.extra, "Content-Length": str(len(hostile.body)),
               "Connection": "close"}  # fmt: skip
    if hostile.method in ("GET", "DELETE") and not hostile.body:
        headers.pop("Content-Length")
    reply = raw_exchange(
        keeper.port, request_bytes(hostile.method, hostile.target, headers, hostile.body)
    )
    status = int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1 ") else -1
    assert status in wanted, (row, reply[:400])
    assert _claim(keeper.root) == before, "the claim changed"
    assert keeper.proc.poll() is None, "the keeper died"
