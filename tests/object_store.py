"""A real S3 protocol server on loopback for the object-storage tests: moto's server mode (what MinIO, R2 and
AWS speak), started by the test, with a boto3 client to arrange and inspect buckets."""

from __future__ import annotations

import json
import os
from contextlib import contextmanager

# Credentials and region the way deployments give them: the environment (the AWS SDK's chain reads them).
ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
       "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


class S3Server:
    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.url = f"http://{host}:{port}"
        # moto keeps its buckets in process-wide backends that outlive a server: start from none, so the
        # buckets another test module made (the same names) do not leak into this one
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(self.url + "/moto-api/reset", method="POST"), timeout=10)
        import boto3

        self.client = boto3.client("s3", endpoint_url=self.url, region_name="us-east-1",
                                   aws_access_key_id="testing", aws_secret_access_key="testing")

    def bucket(self, name: str) -> None:
        self.client.create_bucket(Bucket=name)

    def deny_writes(self, bucket: str) -> None:
        """A bucket policy that refuses every PutObject (moto enforces it: AccessDenied)."""
        self.client.put_bucket_policy(Bucket=bucket, Policy=json.dumps({"Version": "2012-10-17", "Statement": [
            {"Effect": "Deny", "Principal": "*", "Action": "s3:PutObject", "Resource": f"arn:aws:s3:::{bucket}/*"}]}))

    def put(self, bucket: str, key: str, data: bytes) -> str:
        self.client.put_object(Bucket=bucket, Key=key, Body=data)
        return f"s3://{bucket}/{key}"

    def get(self, bucket: str, key: str) -> bytes:
        return self.client.get_object(Bucket=bucket, Key=key)["Body"].read()

    def json(self, bucket: str, key: str) -> dict:
        return json.loads(self.get(bucket, key))

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        found = self.client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
        return sorted(item["Key"] for item in found)

    def presigned(self, bucket: str, key: str) -> str:
        return self.client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key},
                                                  ExpiresIn=600)

    def stop(self) -> None:
        self._server.stop()


@contextmanager
def s3_environment():
    """The AWS_* variables set for this process (an in-process server reads them) and restored after."""
    saved = {k: os.environ.get(k) for k in ENV}
    os.environ.update(ENV)
    try:
        yield ENV
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class GcsServer:
    """A real GCS JSON-API server on loopback (gcp-storage-emulator, in memory, started by the test), reached
    the way Google's client libraries reach an emulator: STORAGE_EMULATOR_HOST (gcs_environment)."""

    def __init__(self) -> None:
        from gcp_storage_emulator.server import create_server

        self._server = create_server("127.0.0.1", 0, in_memory=True)
        self._server.start()
        host, port = self._server._api._httpd.server_address[:2]  # port 0: the port the OS gave
        self.url = f"http://{host}:{port}"

    def _call(self, method: str, path: str, body: bytes | None = None, content_type: str = "application/json"):
        import urllib.request

        request = urllib.request.Request(self.url + path, data=body, method=method,
                                         headers={"Content-Type": content_type})
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.read()

    def bucket(self, name: str) -> None:
        self._call("POST", "/storage/v1/b?project=test", json.dumps({"name": name}).encode())

    def put(self, bucket: str, key: str, data: bytes) -> str:
        from urllib.parse import quote

        self._call("POST", f"/upload/storage/v1/b/{bucket}/o?uploadType=media&name={quote(key, safe='')}", data,
                   "application/octet-stream")
        return f"gs://{bucket}/{key}"

    def get(self, bucket: str, key: str) -> bytes:
        from urllib.parse import quote

        return self._call("GET", f"/storage/v1/b/{bucket}/o/{quote(key, safe='')}?alt=media")

    def json(self, bucket: str, key: str) -> dict:
        return json.loads(self.get(bucket, key))

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        from urllib.parse import quote

        found = json.loads(self._call("GET", f"/storage/v1/b/{bucket}/o?prefix={quote(prefix, safe='')}"))
        return sorted(item["name"] for item in found.get("items", []))

    def stop(self) -> None:
        self._server.stop()


@contextmanager
def gcs_environment(server: GcsServer):
    """STORAGE_EMULATOR_HOST set for this process (an in-process server reads it) and restored after."""
    saved = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = server.url
    try:
        yield {"STORAGE_EMULATOR_HOST": server.url}
    finally:
        if saved is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = saved
