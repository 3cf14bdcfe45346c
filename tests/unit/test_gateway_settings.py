"""Auth and rate-limit settings the gateway cannot use stop the server with a line naming them, before it starts.

A helper round found tracebacks for bad values (RATE_LIMIT=lots, a missing JWKS file, a garbage PEM that then made
every token a 401), auth silently off for API_KEYS=" , ", and a tenant leak: with a JWT secret and a JWKS both
trusted, whoever held either could sign as the other's issuer and own its callers' jobs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from hyocr.api.app import check_gateway_settings
from hyocr.api.security import AuthPolicy
from hyocr.config import SettingsError, load_settings


@pytest.fixture(scope="module")
def rsa_pem() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()


@pytest.fixture
def jwks_file(tmp_path, rsa_pem):
    import jwt

    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(serialization.load_pem_public_key(rsa_pem.encode())))
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [jwk]}))
    return path


@pytest.mark.parametrize(("settings", "named"), [
    ({"rate_limit": "lots"}, "rate_limit (HYOCR_RATE_LIMIT)"),
    ({"api_keys": "k", "auth_failure_limit": "sometimes"}, "auth_failure_limit (HYOCR_AUTH_FAILURE_LIMIT)"),
    ({"rate_limit": "1/second", "rate_limit_storage": "bogus://x"}, "rate_limit_storage"),
    ({"allowed_ips": "10.0.0.300/8"}, "allowed_ips (HYOCR_ALLOWED_IPS)"),
    ({"trusted_proxies": "nope"}, "trusted_proxies (HYOCR_TRUSTED_PROXIES)"),
    ({"jwt_jwks_file": "/nonexistent/jwks.json"}, "jwt_jwks_file (HYOCR_JWT_JWKS_FILE): cannot be used"),
    ({"jwt_public_key": "/nonexistent.pem"}, "jwt_public_key (HYOCR_JWT_PUBLIC_KEY): cannot be used"),
    ({"jwt_public_key": "-----BEGIN PUBLIC KEY-----\ngarbage\n-----END PUBLIC KEY-----"}, "jwt_public_key"),
    ({"api_keys": " , "}, "api_keys (HYOCR_API_KEYS): set but holds no key"),
    ({"api_keys": "k", "metrics_api_keys": ","}, "metrics_api_keys (HYOCR_METRICS_API_KEYS): set but holds no key"),
])
def test_settings_the_gateway_cannot_use_are_named(settings, named):
    with pytest.raises(SettingsError) as refused:
        check_gateway_settings(load_settings(engine="fake", **settings))
    assert str(refused.value).startswith("invalid settings:") and named in str(refused.value)


def test_a_jwks_that_is_not_a_key_set_is_named(tmp_path):
    for text in ("not json", json.dumps({"keys": []}), json.dumps([1]), json.dumps({"keys": [{"kty": "nope"}]})):
        path = tmp_path / "jwks.json"
        path.write_text(text)
        with pytest.raises(SettingsError, match=r"jwt_jwks_file \(HYOCR_JWT_JWKS_FILE\): cannot be used"):
            AuthPolicy.from_settings(load_settings(engine="fake", jwt_jwks_file=str(path)))


def test_one_jwt_trust_root_at_a_time(jwks_file, rsa_pem):
    for roots in ({"jwt_secret": "s" * 32, "jwt_jwks_file": str(jwks_file)},
                  {"jwt_secret": "s" * 32, "jwt_public_key": rsa_pem},
                  {"jwt_public_key": rsa_pem, "jwt_jwks_file": str(jwks_file)}):
        with pytest.raises(SettingsError, match="set one of them"):
            AuthPolicy.from_settings(load_settings(engine="fake", **roots))
    for root in ({"jwt_secret": "s" * 32}, {"jwt_public_key": rsa_pem}, {"jwt_jwks_file": str(jwks_file)}):
        assert AuthPolicy.from_settings(load_settings(engine="fake", **root)).jwt_keys


def test_a_short_hs256_secret_is_warned_about(caplog):
    AuthPolicy.from_settings(load_settings(engine="fake", jwt_secret="x", jwt_audience="hyocr"))
    assert "JWT_SECRET is shorter than 32 bytes" in caplog.text


def test_hyocr_serve_refuses_them_with_a_message_not_a_traceback(tmp_path):
    env = {**os.environ, "HYOCR_RATE_LIMIT": "lots", "HYOCR_ALLOWED_IPS": "nope", "HYOCR_DATA_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "hyocr", "serve", "--port", "1"], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "allowed_ips (HYOCR_ALLOWED_IPS)" in done.stderr
