"""The test proxy in front of moto's S3 server (s3proxy.py): counts, delay, injected errors,
bandwidth cap, run-time settings, the control paths of its process mode, and a prompt stop."""

import http.client
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

boto3 = pytest.importorskip("boto3", reason="boto3/moto not installed: proxy tests skipped")
pytest.importorskip("moto.server", reason="moto[server] not installed: proxy tests skipped")

from botocore.config import Config  # noqa: E402
from botocore.exceptions import BotoCoreError, ClientError  # noqa: E402
from s3proxy import Proxy, RemoteProxy, start_moto  # noqa: E402

DATA = bytes(range(256)) * 4096  # 1 MiB


@pytest.fixture(scope="module")
def moto_port():
    proc, port = start_moto()
    try:
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def client(endpoint, **cfg):
    """A boto3 S3 client that never retries (an injected 503 reaches the test)."""
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                        region_name="us-east-1", config=Config(retries={"total_max_attempts": 1}, **cfg))


def test_counts_delay_and_injected_errors(moto_port):
    with Proxy(moto_port) as proxy:
        s3 = client(proxy.endpoint)
        s3.create_bucket(Bucket="pxa")
        s3.put_object(Bucket="pxa", Key="a/obj.bin", Body=DATA)
        # An upload with boto3's transfer manager (Expect: 100-continue, maybe chunked).
        s3.upload_fileobj(__import__("io").BytesIO(DATA[:1000]), "pxa", "a/small.bin")
        proxy.reset_counts()
        assert s3.get_object(Bucket="pxa", Key="a/obj.bin", Range="bytes=10-1033")["Body"].read() == DATA[10:1034]
        assert s3.get_object(Bucket="pxa", Key="a/obj.bin")["Body"].read() == DATA
        assert s3.head_object(Bucket="pxa", Key="a/small.bin")["ContentLength"] == 1000
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket="pxa", Prefix="a/")["Contents"]]
        assert keys == ["a/obj.bin", "a/small.bin"]
        c = proxy.counts()
        assert c["requests"] == 4 and c["gets"] == 3 and c["ranged_gets"] == 1 and c["heads"] == 1
        assert c["lists"] == 1 and c["errors_injected"] == 0
        assert c["body_bytes"] > 1024 + len(DATA) and c["bytes_down"] > c["body_bytes"]
        log = proxy.log()
        assert [(m, r, s) for m, _, r, s, _ in log] == [("GET", "bytes=10-1033", 206), ("GET", None, 200),
                                                        ("HEAD", None, 200), ("GET", None, 200)]
        assert log[0][1] == "/pxa/a/obj.bin" and log[0][4] == 1024 and log[1][4] == len(DATA)
        assert log[3][1].startswith("/pxa?list-type=2")
        assert sum(e[4] for e in log if e[0] == "GET") == c["body_bytes"]

        clients = [client(proxy.endpoint) for _ in range(4)]
        for c4 in clients:  # connected before the delay, so that the timing below is the requests'
            c4.head_bucket(Bucket="pxa")
        # Every request waits at least the delay (no upper bound: the machine may be loaded).
        proxy.set(delay_ms=150)
        t = time.monotonic()
        s3.get_object(Bucket="pxa", Key="a/obj.bin", Range="bytes=0-9")["Body"].read()
        assert time.monotonic() - t >= 0.15
        # ... concurrently across connections: 4 requests on 4 connections, all delayed.
        proxy.set(delay_ms=300)
        done = []
        t = time.monotonic()
        threads = [threading.Thread(target=lambda c4=c4: done.append(c4.get_object(
            Bucket="pxa", Key="a/small.bin")["Body"].read())) for c4 in clients]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert len(done) == 4 and time.monotonic() - t >= 0.3

        # Injected 503 Slow Down on GETs, never on HEAD; the connection stays usable.
        proxy.set(delay_ms=0, error_rate=1.0)
        proxy.reset_counts()
        with pytest.raises(ClientError) as e:
            s3.get_object(Bucket="pxa", Key="a/obj.bin")
        assert e.value.response["Error"]["Code"] == "SlowDown"
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
        assert s3.head_object(Bucket="pxa", Key="a/obj.bin")["ContentLength"] == len(DATA)
        c = proxy.counts()
        assert c["errors_injected"] == 1 and c["gets"] == 1 and c["heads"] == 1 and c["body_bytes"] == 0
        assert proxy.log()[0][:4] == ("GET", "/pxa/a/obj.bin", None, 503)
        proxy.set(error_rate=0.0)
        assert s3.get_object(Bucket="pxa", Key="a/small.bin")["Body"].read() == DATA[:1000]


def test_chunked_upload_and_a_client_that_leaves_mid_body(moto_port):
    with Proxy(moto_port) as proxy:
        s3 = client(proxy.endpoint)
        s3.create_bucket(Bucket="pxc")
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
        conn.request("PUT", "/pxc/chunked", body=iter([b"hello ", b"chunked ", b"world"]), encode_chunked=True)
        assert conn.getresponse().read() is not None
        s3.put_object(Bucket="pxc", Key="big", Body=DATA, ACL="public-read")
        assert s3.get_object(Bucket="pxc", Key="chunked")["Body"].read() == b"hello chunked world"
        # A client that reads a few bytes of a 1 MiB body and hangs up: others are still served.
        with socket.create_connection(("127.0.0.1", proxy.port)) as raw:
            raw.sendall(b"GET /pxc/big HTTP/1.1\r\nHost: x\r\n\r\n")
            assert raw.recv(100).startswith(b"HTTP/1.1 200")
        conn.request("GET", "/pxc/big")
        assert conn.getresponse().read() == DATA
        assert [e[0] for e in proxy.log()].count("GET") == 3


def test_bandwidth_cap_and_prompt_stop(moto_port):
    with Proxy(moto_port) as direct:
        s3 = client(direct.endpoint)
        s3.create_bucket(Bucket="pbw")
        s3.put_object(Bucket="pbw", Key="obj", Body=DATA)
    proxy = Proxy(moto_port, bandwidth=4 << 20).start()  # 4 MiB/s: 1 MiB takes >= 0.25 s
    s3 = client(proxy.endpoint)
    t = time.monotonic()
    assert s3.get_object(Bucket="pbw", Key="obj")["Body"].read() == DATA
    assert time.monotonic() - t >= 0.24
    # A request stuck in a long delay, and an idle kept-alive connection: stop() returns promptly.
    proxy.set(delay_ms=60_000, bandwidth=None)
    outcome = []

    def get():
        try:
            s3.get_object(Bucket="pbw", Key="obj")
            outcome.append("answered")
        except (BotoCoreError, ClientError) as e:
            outcome.append(e)

    stuck = threading.Thread(target=get)
    stuck.start()
    time.sleep(0.2)
    t = time.monotonic()
    proxy.stop()
    assert time.monotonic() - t < 5  # a generous bound: the proxy itself aims at < 1 s
    stuck.join(10)
    assert not stuck.is_alive() and isinstance(outcome[0], BotoCoreError)


def test_process_mode_and_control_paths(moto_port):
    script = Path(__file__).with_name("s3proxy.py")
    proc = subprocess.Popen([sys.executable, str(script), "--upstream", f"http://127.0.0.1:{moto_port}",
                             "--delay-ms", "20"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening http://127.0.0.1:")
        endpoint = line.split()[1]
        remote = RemoteProxy(endpoint)
        s3 = client(endpoint)
        s3.create_bucket(Bucket="ppm")
        s3.put_object(Bucket="ppm", Key="k", Body=b"hello")
        remote.reset_counts()
        assert s3.get_object(Bucket="ppm", Key="k", Range="bytes=1-3")["Body"].read() == b"ell"
        c = remote.counts()
        assert c["gets"] == c["ranged_gets"] == c["requests"] == 1 and c["body_bytes"] == 3
        assert remote.set(delay_ms=0)["delay_ms"] == 0
        assert remote.log() == [("GET", "/ppm/k", "bytes=1-3", 206, 3)]
    finally:
        proc.terminate()
        proc.wait(10)
