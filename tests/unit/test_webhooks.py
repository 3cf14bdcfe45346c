"""hyocr.jobs.webhooks, the parts without a network: signatures, the secret file, backoff, payloads and
the callback URL rules (IP literals only, so nothing is resolved)."""

from __future__ import annotations

import json
import logging
import stat
import time
from datetime import datetime

import pytest
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from hyocr.errors import InvalidRequest
from hyocr.jobs.webhooks import (
    BACKOFF_CAP,
    WebhookSigner,
    backoff,
    check_callback_url,
    event_body,
    load_secret,
)
from hyocr.pipeline.fetch import FetchPolicy

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # the Standard Webhooks spec's example secret


def test_signature_verifies_with_the_reference_library() -> None:
    body = event_body("job.succeeded", {"id": "job_1", "status": "succeeded"}, time.time())
    signer = WebhookSigner(SECRET)
    headers = signer.headers("msg_1", body, time.time(), "key-alice")
    assert set(headers) == {"webhook-id", "webhook-timestamp", "webhook-signature"}
    assert headers["webhook-id"] == "msg_1" and headers["webhook-timestamp"].isdigit()
    assert headers["webhook-signature"].startswith("v1,")
    assert Webhook(signer.owner_secret("key-alice")).verify(body, headers)["data"]["id"] == "job_1"


def test_each_owner_signs_with_its_own_secret() -> None:
    """One caller cannot have the server sign an event that another caller's receiver accepts: each
    verifies with its own secret, which is neither the server's nor derivable from another's."""
    signer = WebhookSigner(SECRET)
    alice, bob = signer.owner_secret("key-alice"), signer.owner_secret("key-bob")
    assert len({alice, bob, SECRET}) == 3 and len(Webhook(alice)._whsecret) == 32
    assert WebhookSigner(SECRET).owner_secret("key-alice") == alice  # the same on every replica
    body = event_body("job.succeeded", {"id": "job_of_bob"}, time.time())
    from_bob = signer.headers("msg_2", body, time.time(), "key-bob")
    assert Webhook(bob).verify(body, from_bob)
    for wrong in (alice, SECRET):
        with pytest.raises(WebhookVerificationError):
            Webhook(wrong).verify(body, from_bob)


def test_tampered_body_or_other_secret_fails(tmp_path) -> None:
    body = event_body("job.failed", {"id": "job_1"}, time.time())
    signer = WebhookSigner(SECRET)
    headers = signer.headers("msg_1", body, time.time(), "anonymous")
    with pytest.raises(WebhookVerificationError):
        Webhook(signer.owner_secret("anonymous")).verify(body.replace(b"job_1", b"job_2"), headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(WebhookSigner(load_secret(None, tmp_path)).owner_secret("anonymous")).verify(body, headers)


def test_signer_repr_hides_the_secret() -> None:
    assert SECRET[6:] not in repr(WebhookSigner(SECRET))


def test_load_secret_generates_once_with_mode_0600(tmp_path, caplog) -> None:
    data_dir = tmp_path / "a" / "b"  # parents are created
    with caplog.at_level(logging.INFO, logger="hyocr.jobs"):
        secret = load_secret(None, data_dir)
    path = data_dir / "webhook-secret"
    assert secret.startswith("whsec_") and len(Webhook(secret)._whsecret) == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().strip() == secret
    assert str(path) in caplog.text and secret[6:] not in caplog.text  # where, never what
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hyocr.jobs"):
        assert load_secret(None, data_dir) == secret
    assert "generated" not in caplog.text
    assert list(data_dir.iterdir()) == [path]  # no temporary file left behind


def test_configured_secret_wins_and_is_validated(tmp_path) -> None:
    assert load_secret(SECRET, tmp_path) == SECRET
    assert not (tmp_path / "webhook-secret").exists()
    for bad in ("whsec_", "whsec_%%%not base64", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_a"):
        with pytest.raises(ValueError, match="webhook secret"):
            load_secret(bad, tmp_path)
        with pytest.raises(ValueError):
            WebhookSigner(bad)


def test_corrupt_secret_file_is_an_error_not_a_new_secret(tmp_path) -> None:
    (tmp_path / "webhook-secret").write_text("garbage\n")
    with pytest.raises(ValueError, match="webhook-secret"):
        load_secret(None, tmp_path)
    assert (tmp_path / "webhook-secret").read_text() == "garbage\n"


def test_backoff_grows_and_is_capped() -> None:
    for attempt in range(1, 12):
        nominal = min(BACKOFF_CAP, 2.0 * 2 ** (attempt - 1))
        for _ in range(20):
            assert nominal / 2 <= backoff(attempt) <= nominal  # jittered within its upper half
    assert backoff(1, base=0.01) <= 0.01
    assert BACKOFF_CAP / 2 <= backoff(40) <= BACKOFF_CAP
    assert backoff(10**6) <= BACKOFF_CAP  # no overflow however many attempts


def test_event_body_is_compact_standard_webhooks_json() -> None:
    body = event_body("job.cancelled", {"id": "job_1", "note": "é"}, 1_700_000_000.25)
    assert b" " not in body
    payload = json.loads(body)
    assert payload == {"type": "job.cancelled", "timestamp": "2023-11-14T22:13:20.250Z",
                       "data": {"id": "job_1", "note": "é"}}
    assert datetime.fromisoformat(payload["timestamp"]).utcoffset().total_seconds() == 0
    with pytest.raises(ValueError):
        event_body("job.exploded", {}, 0)


@pytest.mark.parametrize(
    "url, policy, words",
    [
        ("http://127.0.0.1/", FetchPolicy(), "not allowed"),
        ("http://[::1]:8080/hook", FetchPolicy(), "not allowed"),
        ("http://169.254.169.254/latest/meta-data", FetchPolicy(), "not allowed"),
        ("http://169.254.169.254/", FetchPolicy(allow_private=True), "not allowed"),  # never, whatever
        ("http://10.0.0.5/", FetchPolicy(), "not allowed"),
        ("http://user:pw@example.com/", FetchPolicy(), "credentials"),
        ("ftp://x", FetchPolicy(), "only http and https"),
        ("http://2130706433/", FetchPolicy(), "four decimal numbers"),
        ("https://93.184.215.14/hook", FetchPolicy(("hooks.example.com",)), "not allowed"),
        ("https://evil.example.org/hook", FetchPolicy(("*.example.com",)), "not allowed"),  # before DNS
    ],
)
async def test_check_callback_url_refuses(url: str, policy: FetchPolicy, words: str) -> None:
    with pytest.raises(InvalidRequest, match=words) as info:
        await check_callback_url(url, policy)
    assert info.value.param == "callback_url"
    assert "image" not in info.value.message


@pytest.mark.parametrize(
    "url, policy",
    [
        ("https://93.184.215.14/hook", FetchPolicy()),  # empty allowlist: image URLs off, webhooks on
        ("https://93.184.215.14/hook", FetchPolicy(("93.184.215.14",))),
        ("http://[2606:2800:21f:cb07:6820:80da:af6b:8b2c]:8443/h?x=1", FetchPolicy(("*",))),
        ("http://127.0.0.1:9000/hook", FetchPolicy(allow_private=True)),
        ("http://10.1.2.3/hook", FetchPolicy(allow_private=True)),
    ],
)
async def test_check_callback_url_allows(url: str, policy: FetchPolicy) -> None:
    assert not FetchPolicy().enabled
    await check_callback_url(url, policy)
