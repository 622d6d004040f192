"""trainer/worker/checkpoint/s3.py against a real S3-compatible server on 127.0.0.1: the same
layout and guarantees as on a disk (marker last, keep-N, `.bad` set-aside, incomplete
checkpoints ignored and swept), and one-line errors for bad URLs, credentials and endpoints."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from kubeddp.trainer.checkpoint_digest import read_marker
from kubeddp.trainer.worker import checkpoint as ckpt
from kubeddp.trainer.worker.checkpoint.s3 import S3Storage
from tests.helpers import s3_faults, s3server
from tests.helpers.ports import free_port

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[s3server.S3Server]:
    with s3server.started(tmp_path_factory.mktemp("s3")) as running:
        yield running


@pytest.fixture
def s3env(server: s3server.S3Server, monkeypatch: pytest.MonkeyPatch) -> s3server.S3Server:
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    return server


def _state(step: int) -> dict:
    return {
        "model": {"w": torch.full((3,), float(step))},
        "optimizer": {"state": {}, "param_groups": []},
        "scheduler": {},
        "scaler": {},
        "step": step,
        "epoch": 0,
        "consumed": 0,
    }


def _write(url: str, step: int, keep: int = 3) -> str:
    return str(ckpt.write_checkpoint(url, step, _state(step), "config: {}\n", keep))


def test_layout_marker_keep_n_and_reading_back(s3env: s3server.S3Server) -> None:
    url = f"s3://{s3server.BUCKET}/layout/run"
    for step in (5, 10, 15, 20):
        _write(url, step, keep=2)
    assert [r.step for r in ckpt.list_checkpoints(url)] == [20, 15]
    assert s3env.keys("layout/run/ckpt-00000020/") == [
        f"layout/run/ckpt-00000020/{name}" for name in ("COMPLETE", "config.yaml", "state.pt")
    ]
    assert not s3env.keys("layout/run/ckpt-00000005/"), "pruned"
    found = ckpt.load_newest_valid(url, log=lambda _m: None)
    assert found is not None and found[1]["step"] == 20
    assert torch.equal(found[1]["model"]["w"], torch.full((3,), 20.0))
    one = ckpt.list_checkpoints(f"{url}/ckpt-00000015")  # a URL naming one checkpoint
    assert [r.step for r in one] == [15] and ckpt.load_state(one[0])["step"] == 15


def test_without_its_marker_a_checkpoint_is_ignored_then_swept(s3env: s3server.S3Server) -> None:
    url = f"s3://{s3server.BUCKET}/partial"
    _write(url, 5)
    client = s3env.client()
    # As if killed before the marker: state.pt uploaded, COMPLETE not.
    client.put_object(Bucket=s3server.BUCKET, Key="partial/ckpt-00000010/state.pt", Body=b"x")
    assert [r.step for r in ckpt.list_checkpoints(url)] == [5]
    _write(url, 15)
    assert not s3env.keys("partial/ckpt-00000010/"), "the next save sweeps it"


def test_corrupt_newest_is_set_aside_and_the_previous_loaded(s3env: s3server.S3Server) -> None:
    url = f"s3://{s3server.BUCKET}/corrupt"
    _write(url, 5)
    newest = _write(url, 10)
    key = "corrupt/ckpt-00000010/state.pt"
    client = s3env.client()
    data = client.get_object(Bucket=s3server.BUCKET, Key=key)["Body"].read()
    client.put_object(Bucket=s3server.BUCKET, Key=key, Body=data[: len(data) // 2])
    messages: list[str] = []
    found = ckpt.load_newest_valid(url, log=messages.append, on_bad=ckpt.set_aside)
    assert found is not None and found[0].step == 5
    assert f"checkpoint {newest} is unreadable" in messages[0]
    assert s3env.keys("corrupt/ckpt-00000010.bad/") == [
        f"corrupt/ckpt-00000010.bad/{name}" for name in ("COMPLETE", "config.yaml", "state.pt")
    ]
    assert not s3env.keys("corrupt/ckpt-00000010/")
    _write(url, 10, keep=1)  # pruning leaves the set-aside one alone
    assert s3env.keys("corrupt/ckpt-00000010.bad/")


def test_prepare_proves_the_bucket_writable(s3env: s3server.S3Server) -> None:
    storage = S3Storage.from_url(f"s3://{s3server.BUCKET}/prepared")
    assert storage.prepare() is None
    assert s3env.keys("prepared/") == ["prepared/.kubeddp-checkpoints"], "the probe is removed"
    missing = S3Storage.from_url("s3://no-such-bucket-kubeddp/x")
    with pytest.raises(ckpt.CheckpointError, match="404.*create the bucket"):
        missing.prepare()


@pytest.mark.parametrize(
    "url", ["s3://", "s3://Upper_Case/x", "s3://ab", "s3://bucket//x", "s3:/bucket/x"]
)
def test_bad_urls_are_one_line(url: str, s3env: s3server.S3Server) -> None:
    with pytest.raises(ckpt.CheckpointError, match="is not a valid S3 URL") as err:
        ckpt.storage_for(url)
    assert "\n" not in str(err.value)


def test_missing_credentials(s3env: s3server.S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(ckpt.CheckpointError, match="no S3 credentials; set AWS_ACCESS_KEY_ID"):
        ckpt.storage_for(f"s3://{s3server.BUCKET}/x")


def test_unreachable_endpoint_is_retryable(
    s3env: s3server.S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")  # botocore's own setting: one back-off, not 9
    storage = ckpt.storage_for(f"s3://{s3server.BUCKET}/x")
    with pytest.raises(ckpt.StorageUnreachable, match="cannot be reached"):
        storage.prepare()


def test_without_boto3_the_error_says_what_to_install(
    s3env: s3server.S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # as if not installed: import fails
    with pytest.raises(ckpt.CheckpointError, match=r"pip install 'kubeddp\[s3\]'"):
        ckpt.storage_for(f"s3://{s3server.BUCKET}/x")


def test_local_paths_still_mean_a_directory(tmp_path: Path) -> None:
    assert ckpt.storage_for(tmp_path).location == str(tmp_path)
    with pytest.raises(ckpt.CheckpointError, match="checkpoint.dir is empty"):
        ckpt.storage_for("")


def test_an_endpoint_that_answers_with_a_web_page_is_refused_in_one_line(
    s3env: s3server.S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A console's port answers 200 to everything: without reading back what it wrote, every
    save would "succeed" and the run end 0 with no checkpoint anywhere."""
    with s3_faults.started(tmp_path, "html") as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        storage = ckpt.storage_for(f"s3://{s3server.BUCKET}/x")
        with pytest.raises(
            ckpt.CheckpointError, match="200 and an HTML page: it is not an S3"
        ) as err:
            storage.prepare()
        assert "\n" not in str(err.value) and not isinstance(err.value, ckpt.StorageUnreachable)


def test_throttling_is_retried_with_back_off_then_retryable(
    s3env: s3server.S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url = f"s3://{s3server.BUCKET}/throttled"
    with s3_faults.started(tmp_path, "throttle", "2", s3env.endpoint) as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        storage = ckpt.storage_for(url)
        assert storage.prepare() is None  # 2 x 503 SlowDown, then through
        assert [r.step for r in storage.list()] == []
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "3")
    with s3_faults.started(tmp_path, "throttle", "-1", s3env.endpoint) as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        storage = ckpt.storage_for(url)
        with pytest.raises(
            ckpt.StorageUnreachable, match=r"throttled or unavailable \(503\) 3 times with back-off"
        ):
            storage.prepare()
        with pytest.raises(ckpt.StorageUnreachable, match="cannot write checkpoint"):
            storage.write(5, {"state.pt": lambda f: f.write(b"x")})


@pytest.mark.parametrize(("mode", "args", "says"), [
    ("json", (), "PutObject with 200 and application/json"),
    ("redirect", ("301",), "answered 301 with a redirect to http://"),
    ("redirect", ("307",), "answered 307 with a redirect to http://"),
    ("redirect", ("302",), "answered 302 with a redirect to http://"),
    ("redirect", ("308",), "answered 308 with a redirect to http://"),
    ("text", (), "PutObject with 200 and text/plain"),
])  # fmt: skip
def test_an_endpoint_that_is_not_s3_is_refused_at_once_not_retried(
    mode: str, args: tuple[str, ...], says: str, s3env, monkeypatch, tmp_path: Path
) -> None:
    """JSON 200 was taken for a server error and retried for minutes; a redirect ended in
    botocore's RecursionError. Both are one line, fatal (the address is wrong), at once."""
    with s3_faults.started(tmp_path, mode, *args) as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        storage = ckpt.storage_for(f"s3://{s3server.BUCKET}/x")
        with pytest.raises(ckpt.CheckpointError, match=says) as err:
            storage.prepare()
        with pytest.raises(ckpt.CheckpointError, match="not an S3 API|with a redirect to") as save:
            storage.write(5, {"state.pt": lambda f: f.write(b"x")})
        assert not isinstance(save.value, ckpt.StorageUnreachable), "fatal, not retried"
    assert "\n" not in str(err.value) and not isinstance(err.value, ckpt.StorageUnreachable)
    assert "AWS_ENDPOINT_URL must be the S3 API" in str(err.value)


@pytest.mark.parametrize("mode", ["short", "flip"])
def test_an_upload_stored_short_or_changed_is_never_a_checkpoint(
    mode: str, s3env, monkeypatch, tmp_path: Path
) -> None:
    """The endpoint stores part of an upload (or other bytes) and answers 200: the save fails
    (retryable), no COMPLETE is written, and the checkpoint before it stays the newest."""
    url = f"s3://{s3server.BUCKET}/lying-{mode}"
    _write(url, 5)
    monkeypatch.setenv("AWS_REQUEST_CHECKSUM_CALCULATION", "when_required")  # plain bodies
    with s3_faults.started(tmp_path, mode, s3env.endpoint) as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        with pytest.raises(ckpt.StorageUnreachable, match="cannot write checkpoint") as err:
            _write(url, 10)
    said = "stored .* of the .* bytes" if mode == "short" else "read back is not what was written"
    assert re.search(said, str(err.value)), err.value
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3env.endpoint)
    assert [r.step for r in ckpt.list_checkpoints(url)] == [5]
    assert not s3env.keys(f"lying-{mode}/ckpt-00000010/"), "what was stored is removed"


def test_the_marker_records_sizes_and_digests_and_reading_checks_them(s3env) -> None:
    """An object changed after its checkpoint was complete (bit rot, a lying read) is read
    once more, then refused: the previous checkpoint is used, and nothing is lost."""
    url = f"s3://{s3server.BUCKET}/digests"
    _write(url, 5)
    _write(url, 10)
    client = s3env.client()
    marker = client.get_object(Bucket=s3server.BUCKET, Key="digests/ckpt-00000010/COMPLETE")
    recorded = read_marker(marker["Body"].read().decode())
    assert recorded is not None and set(recorded) == {"state.pt", "config.yaml"}
    key = "digests/ckpt-00000010/state.pt"
    data = bytearray(client.get_object(Bucket=s3server.BUCKET, Key=key)["Body"].read())
    assert recorded["state.pt"].size == len(data)
    data[len(data) // 2] ^= 0xFF  # same size, one byte changed: only the digests see it
    client.put_object(Bucket=s3server.BUCKET, Key=key, Body=bytes(data))
    messages: list[str] = []
    found = ckpt.load_newest_valid(url, log=messages.append)
    assert found is not None and found[0].step == 5
    assert "differs from what was written" in messages[0], messages


def test_an_answer_that_never_finishes_ends_at_the_requests_deadline(
    s3env, monkeypatch, tmp_path: Path
) -> None:
    """A checkpoint's object served a byte every 0.2 s: every read is within the 120 s read
    timeout; the request's whole deadline (300 s, here 2 s) ends it, retryable."""
    from kubeddp.trainer.worker.checkpoint import s3

    url = f"s3://{s3server.BUCKET}/dripping"
    _write(url, 5)
    monkeypatch.setattr(s3, "REQUEST_SECONDS", 2.0)
    with s3_faults.started(tmp_path, "drip", s3env.endpoint) as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        with pytest.raises(ckpt.StorageUnreachable, match="did not end within 2 s"):
            ckpt.load_newest_valid(url, log=lambda _m: None)


def test_a_config_copy_alone_is_told_from_a_users_config_in_a_bucket_too(s3env) -> None:
    from kubeddp.trainer.worker.checkpoint import safety
    from kubeddp.trainer.worker.checkpoint.storage import CONFIG_NOTE_HEADER

    client = s3env.client()
    for prefix, text, ours in (("ours", CONFIG_NOTE_HEADER + "train: {}\n", True),
                               ("users", "train: {lr: 0.1}\n", False)):  # fmt: skip
        client.put_object(Bucket=s3server.BUCKET, Key=f"{prefix}/config.yaml", Body=text.encode())
        storage = S3Storage.from_url(f"s3://{s3server.BUCKET}/{prefix}")
        if ours:
            safety.claim(storage, "train: {}\n", lambda _m: None)
        else:
            with pytest.raises(ckpt.CheckpointError, match="did not write"):
                safety.claim(storage, "train: {}\n", lambda _m: None)
