"""Who owns what, over real HTTP: a JWT caller is its whole issuer and subject (long Kubernetes service
account names, non-ASCII, case), a token without a subject owns nothing, and rate limits count per owner."""

from __future__ import annotations

import base64
import json
import time

import jwt
import pytest
import requests
from imaging import Line, render, to_bytes

SECRET = "tenancy-secret-of-at-least-32-bytes!"
# Ordinary service accounts: the same namespace and a 40-character name, told apart only past 64 characters.
STEM = "system:serviceaccount:tenant-a:" + "ocr-pipeline-worker-0123456789-abcdefghij"
SVC_A, SVC_B = STEM + ":svc-A", STEM + ":svc-B"


def _token(sub: str | None, **claims) -> dict[str, str]:
    payload = {"exp": int(time.time()) + 600, **claims}
    if sub is not None:
        payload["sub"] = sub
    return {"Authorization": "Bearer " + jwt.encode(payload, SECRET, algorithm="HS256")}


def _image() -> str:
    data = to_bytes(render([Line("TENANT DATA 7731", (20, 20), 30)], size=(360, 96)).image)
    return base64.b64encode(data).decode()


def _finished(url: str, job_id: str, headers: dict) -> dict:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        job = requests.get(f"{url}/v1/jobs/{job_id}", headers=headers, timeout=10).json()
        if job["status"] not in ("queued", "running"):
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not finish")


@pytest.fixture
def jwt_server(fake_server_factory):
    return fake_server_factory(ui=False, jwt_secret=SECRET)


def test_subjects_that_differ_past_64_characters_are_two_owners(jwt_server):
    assert SVC_A[:64] == SVC_B[:64] and len(SVC_A) > 64
    url, alice, bob = jwt_server.url, _token(SVC_A), _token(SVC_B)
    job = requests.post(f"{url}/v1/jobs", json={"image": _image(), "task": "text"}, headers=alice, timeout=30)
    assert job.status_code == 202, job.text
    job_id = job.json()["id"]
    assert _finished(url, job_id, alice)["status"] == "succeeded"
    assert requests.get(f"{url}/v1/jobs/{job_id}/result", headers=alice, timeout=10).status_code == 200
    for path in ("", "/result", "/pages"):
        r = requests.get(f"{url}/v1/jobs/{job_id}{path}", headers=bob, timeout=10)
        assert r.status_code == 404 and r.json()["error"]["code"] == "job_not_found", (path, r.text)
    assert job_id not in [j["id"] for j in requests.get(f"{url}/v1/jobs", headers=bob, timeout=10).json()["data"]]
    # nor may Bob cancel or delete it
    assert requests.delete(f"{url}/v1/jobs/{job_id}", headers=bob, timeout=10).status_code == 404
    assert requests.get(f"{url}/v1/jobs/{job_id}", headers=alice, timeout=10).status_code == 200


@pytest.mark.parametrize("other", [
    {"sub": SVC_A.upper()},  # subjects are case-sensitive (RFC 7519 StringOrURI)
    {"sub": SVC_A, "iss": "https://another-issuer.test"},  # the same subject of another issuer
    {"sub": SVC_A + " "},
])
def test_an_identity_is_never_folded_into_another(jwt_server, other):
    url = jwt_server.url
    owner = _token(SVC_A)
    job_id = requests.post(f"{url}/v1/jobs", json={"image": _image(), "task": "text"}, headers=owner,
                           timeout=30).json()["id"]
    sub = other.pop("sub")
    r = requests.get(f"{url}/v1/jobs/{job_id}", headers=_token(sub, **other), timeout=10)
    assert r.status_code == 404, r.text


def test_non_ascii_and_very_long_subjects_own_their_jobs(jwt_server):
    url = jwt_server.url
    for sub in ("用户:张三@例子.中国", "x" * 5000, "svc:\u0000:nul", "lone \ud800 surrogate"):
        headers = _token(sub)
        r = requests.post(f"{url}/v1/jobs", json={"image": _image(), "task": "text"}, headers=headers, timeout=30)
        assert r.status_code == 202, (sub[:20], r.text)
        assert requests.get(f"{url}/v1/jobs/{r.json()['id']}", headers=headers, timeout=10).status_code == 200


@pytest.mark.parametrize("sub", [None, ""])
def test_a_token_without_a_subject_is_refused_everywhere(jwt_server, sub):
    headers = _token(sub)
    for method, path, body in (("post", "/v1/jobs", {"image": _image(), "task": "text"}),
                               ("get", "/v1/jobs", None),
                               ("post", "/v1/ocr", {"image": _image(), "task": "text"})):
        r = requests.request(method, f"{jwt_server.url}{path}", json=body, headers=headers, timeout=30)
        assert r.status_code == 401, (path, r.text)
        assert r.json()["error"]["code"] == "token_without_subject" and "sub" in r.json()["error"]["message"]


def test_a_subject_that_is_not_a_string_is_an_invalid_token(jwt_server):
    headers = {"Authorization": "Bearer " + jwt.encode({"exp": int(time.time()) + 60, "sub": "x"}, SECRET,
                                                       algorithm="HS256")}
    assert requests.get(f"{jwt_server.url}/v1/jobs", headers=headers, timeout=10).status_code == 200
    token = jwt.api_jws.encode(b'{"exp": %d, "sub": 12345}' % (int(time.time()) + 60), SECRET, algorithm="HS256")
    r = requests.get(f"{jwt_server.url}/v1/jobs", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_rate_limits_count_each_whole_identity(fake_server_factory):
    server = fake_server_factory(ui=False, jwt_secret=SECRET, rate_limit="2/minute")
    alice, bob = _token(SVC_A), _token(SVC_B)
    for _ in range(2):
        assert requests.get(f"{server.url}/v1/jobs", headers=alice, timeout=10).status_code == 200
    limited = requests.get(f"{server.url}/v1/jobs", headers=alice, timeout=10)
    assert limited.status_code == 429 and limited.headers["retry-after"].isdigit()
    assert requests.get(f"{server.url}/v1/jobs", headers=bob, timeout=10).status_code == 200  # Bob's own window


# ---------------------------------------------------------------- one tenant posing as another


def test_a_webhook_verifies_only_with_its_own_callers_secret(fake_server_factory):
    """Bob points his job's callback at Alice's receiver, with the header it expects: the server signs it with
    Bob's secret, so Alice's receiver, verifying with hers, rejects it, and accepts her own job's event."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from standardwebhooks import Webhook

    seen: list[tuple[dict, bytes]] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self):
            seen.append((dict(self.headers), self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    receiver = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    try:
        server = fake_server_factory(ui=False, api_keys="alice-key-0123456789,bob-key-0123456789",
                                     media_fetch_allow_private=True)
        alice, bob = ({"Authorization": f"Bearer {who}-key-0123456789"} for who in ("alice", "bob"))
        secrets = [requests.get(f"{server.url}/v1/webhooks/secret", headers=h, timeout=10).json()["secret"]
                   for h in (alice, bob)]
        assert secrets[0] != secrets[1]
        hook = {"callback_url": f"http://127.0.0.1:{receiver.server_address[1]}/hook",
                "callback_headers": {"X-Receiver-Token": "alices-receiver"}}
        ids = {}
        for name, headers in (("bob", bob), ("alice", alice)):
            job = requests.post(f"{server.url}/v1/jobs", json={"image": _image(), "task": "text", **hook},
                                headers=headers, timeout=30).json()
            ids[job["id"]] = name
        deadline = time.monotonic() + 60
        while len(seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        receiver.shutdown()
    assert len(seen) == 2, seen
    verdicts = {}
    for headers, body in seen:
        job_id = json.loads(body)["data"]["id"]
        try:
            Webhook(secrets[0]).verify(body, {k.lower(): v for k, v in headers.items()})
            verdicts[ids[job_id]] = True
        except Exception:
            verdicts[ids[job_id]] = False
    assert verdicts == {"alice": True, "bob": False}


def test_issuer_and_subject_pairs_that_join_alike_are_two_owners(jwt_server):
    """jwt_id separates issuer and subject with a NUL: ("a\0b", "c") and ("a", "b\0c") are two callers (NULs
    inside are escaped), and an issuer that is not a string (5 against "5") is refused."""
    url = jwt_server.url
    one, other = _token("c", iss="a\0b"), _token("b\0c", iss="a")
    job = requests.post(f"{url}/v1/jobs", json={"image": _image(), "task": "text"}, headers=one, timeout=30).json()
    assert requests.get(f"{url}/v1/jobs/{job['id']}", headers=one, timeout=10).status_code == 200
    assert requests.get(f"{url}/v1/jobs/{job['id']}", headers=other, timeout=10).status_code == 404
    for iss in (5, ["x"]):  # PyJWT will not write these; a signer of another library may
        claims = json.dumps({"exp": int(time.time()) + 60, "sub": "c", "iss": iss}).encode()
        token = jwt.api_jws.encode(claims, SECRET, algorithm="HS256")
        r = requests.get(f"{url}/v1/jobs", headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_token_claims", (iss, r.text)


def test_times_written_as_strings_are_refused(jwt_server):
    """PyJWT reads an exp of "9999999999" as a number; RFC 7519's NumericDate is a JSON number."""
    later = int(time.time()) + 600
    for claims in ({"exp": str(later)}, {"exp": later, "nbf": "0"}, {"exp": later, "iat": True}):
        token = jwt.api_jws.encode(json.dumps({"sub": "c", **claims}).encode(), SECRET, algorithm="HS256")
        r = requests.get(f"{jwt_server.url}/v1/jobs", headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_token_claims", (claims, r.text)
    token = jwt.api_jws.encode(json.dumps({"sub": "c", "exp": later + 0.5, "iat": 1.5}).encode(), SECRET,
                               algorithm="HS256")
    assert requests.get(f"{jwt_server.url}/v1/jobs", headers={"Authorization": f"Bearer {token}"},
                        timeout=10).status_code == 200  # fractions are NumericDates too


def test_a_credential_header_sent_twice_with_different_values_is_refused(fake_server_factory):
    import httpx

    server = fake_server_factory(ui=False, api_keys="alice-key-0123456789,bob-key-0123456789")
    a, b = "alice-key-0123456789", "bob-key-0123456789"
    for headers in ([("Authorization", "Bearer wrong"), ("Authorization", f"Bearer {a}")],
                    [("X-API-Key", a), ("X-API-Key", b)], [("X-API-Key", "wrong"), ("X-API-Key", a)]):
        r = httpx.get(f"{server.url}/v1/jobs", headers=headers, timeout=10)
        assert r.status_code == 401 and r.json()["error"]["code"] == "conflicting_credentials", (headers, r.text)
    same = httpx.get(f"{server.url}/v1/jobs", headers=[("X-API-Key", a), ("X-API-Key", a)], timeout=10)
    assert same.status_code == 200  # a proxy that repeats a header is not a conflict


def test_the_jobs_database_is_readable_by_the_servers_user_only(fake_server_factory, tmp_path):
    data = tmp_path / "fresh" / "data"
    server = fake_server_factory(ui=False, data_dir=str(data))
    job = requests.post(f"{server.url}/v1/jobs", json={"image": _image(), "task": "text"}, timeout=30).json()
    assert _finished(server.url, job["id"], {})["status"] == "succeeded"
    assert data.stat().st_mode & 0o777 == 0o700
    files = [p for p in data.iterdir() if p.name.startswith("jobs.db")]
    assert files and all(p.stat().st_mode & 0o077 == 0 for p in files), [(p.name, oct(p.stat().st_mode)) for p in files]


def test_callers_take_turns_in_the_admission_queue(fake_server_factory):
    """One engine slot; Alice's burst fills most of the queue; Bob's one request, sent after all of Alice's,
    is the next served, and Alice cannot take the queue's last places."""
    from concurrent.futures import ThreadPoolExecutor

    from hyocr.engines.fake import FakeEngine, FakeScript

    server = fake_server_factory(FakeEngine(FakeScript(latency=0.4)), ui=False, api_keys="alice-key,bob-key",
                                 max_concurrency=1, max_queue=6, queue_timeout=60)
    finished: list[str] = []

    def ocr(who: str) -> requests.Response:
        r = requests.post(f"{server.url}/v1/ocr", json={"image": _image(), "task": "text"}, timeout=60,
                          headers={"Authorization": f"Bearer {who}-key"})
        finished.append(who)
        return r

    def queue_length() -> float:
        for line in requests.get(f"{server.url}/metrics", headers={"Authorization": "Bearer alice-key"},
                                 timeout=10).text.splitlines():
            if line.startswith("hyocr_queue_length "):
                return float(line.split()[1])
        return 0.0

    with ThreadPoolExecutor(8) as pool:
        alice = [pool.submit(ocr, "alice") for _ in range(5)]  # one in the engine, four waiting
        deadline = time.monotonic() + 30
        while queue_length() < 4:
            assert time.monotonic() < deadline, "alice's requests were not queued"
            time.sleep(0.02)
        refused = ocr("alice")  # a caller holds at most three quarters of the queue's six places (four)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "overloaded", refused.text
        finished.remove("alice")
        bob = pool.submit(ocr, "bob")
        assert bob.result().status_code == 200
        assert all(f.result().status_code == 200 for f in alice)
    # Bob's request waited for the slot in use and for Alice's next one, not for her whole burst.
    assert finished.index("bob") <= 2, finished
