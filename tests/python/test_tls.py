"""TLS and mutual TLS on the gRPC port, with certificates made in the test (openssl): a TLS client
with the CA is served and a plaintext one is not; under mTLS a client without a certificate, or with
one from another CA, is refused; a renewed server certificate (from a new CA) takes effect for new
connections without a restart; qvi-client and qvi-perf connect with TLS. The HTTP port serves HTTPS
with the same files (curl with the CA, mutual TLS, the renewal), never plain text beside them."""
import json
import os
import shutil
import socket
import ssl
import subprocess
import time

import grpc
import pytest

from qvi_testing import REPO, STORE, ServerProcess, wait_until

CLIENT = os.path.join(REPO, "build", "qvi-client")
PERF = os.path.join(REPO, "build", "qvi-perf")
WAIT_S = 30


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(folder, name):
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
            "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.pem", cwd=folder)
    return os.path.join(folder, f"{name}.pem")


def make_cert(folder, ca, name, server):
    """A certificate for `name` signed by `ca`: for localhost and 127.0.0.1 when `server`."""
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", f"/CN={name}",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=folder)
    ext = os.path.join(folder, f"{name}.ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n" if server
                else "extendedKeyUsage=clientAuth\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
            "-days", "2", "-extfile", ext, "-out", f"{name}.pem", cwd=folder)
    return os.path.join(folder, f"{name}.pem"), os.path.join(folder, f"{name}.key")


def read(path):
    with open(path, "rb") as f:
        return f.read()


def classify(api, channel):
    pb, pb_grpc = api
    return pb_grpc.InferenceStub(channel).Classify(
        pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=["A fine film."]), timeout=10)


def tls_channel(address, ca, cert=None, key=None):
    creds = grpc.ssl_channel_credentials(read(ca), read(key) if key else None, read(cert) if cert else None)
    return grpc.secure_channel(address.replace("127.0.0.1", "localhost"), creds)


def https(proc, path, ca, cert=None, key=None, data=None, scheme="https"):
    """curl against the HTTP port (by name, as the certificate names it): (exit code, body)."""
    port = proc.http_address.rsplit(":", 1)[1]
    args = ["curl", "-s", "--max-time", "10", "--cacert", ca, f"{scheme}://localhost:{port}{path}"]
    if cert:
        args += ["--cert", cert, "--key", key]
    if data is not None:
        args += ["-X", "POST", "-d", data]
    out = subprocess.run(args, capture_output=True, text=True, timeout=30)
    return out.returncode, out.stdout


def refused(api, channel):
    with pytest.raises(grpc.RpcError) as e:
        classify(api, channel)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value
    channel.close()


@pytest.fixture
def pki(tmp_path):
    folder = str(tmp_path)
    ca = make_ca(folder, "ca")
    server_cert, server_key = make_cert(folder, "ca", "server", server=True)
    client_cert, client_key = make_cert(folder, "ca", "client", server=False)
    other_ca = make_ca(folder, "other")
    other_cert, other_key = make_cert(folder, "other", "intruder", server=False)
    return dict(folder=folder, ca=ca, server_cert=server_cert, server_key=server_key, client_cert=client_cert,
                client_key=client_key, other_ca=other_ca, other_cert=other_cert, other_key=other_key)


def start(work, *flags):
    """qvi-server with `flags`; ServerProcess's own plaintext readiness wait cannot be used on a TLS
    port, so this waits for the port file and then for a TLS call."""
    return ServerProcess(STORE, work, *flags, plaintext_ready=False)


def wait_ready(api, make_channel):
    def answer():
        channel = make_channel()
        try:
            return classify(api, channel)
        except grpc.RpcError:
            return None  # not listening yet
        finally:
            channel.close()
    return wait_until(answer, "a TLS answer", seconds=WAIT_S, interval=0.2)


def test_tls_serves_tls_clients_and_refuses_plain_text(api, pki, tmp_path):
    proc = start(str(tmp_path), "--tls-cert", pki["server_cert"], "--tls-key", pki["server_key"])
    try:
        assert wait_ready(api, lambda: tls_channel(proc.address, pki["ca"])).results
        refused(api, grpc.insecure_channel(proc.address))
        refused(api, tls_channel(proc.address, pki["other_ca"]))  # a server this client cannot verify
        out = subprocess.run([CLIENT, "--server", proc.address.replace("127.0.0.1", "localhost"), "--tls-ca", pki["ca"],
                              "--color", "never", "health"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and "SERVING" in out.stdout, out.stdout + out.stderr
        perf_json = os.path.join(str(tmp_path), "perf.json")
        out = subprocess.run([PERF, "--server", proc.address.replace("127.0.0.1", "localhost"), "--tls-ca", pki["ca"],
                              "--concurrency", "2", "--duration", "1", "--warmup", "0", "--json", perf_json],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        with open(perf_json) as f:
            step = json.load(f)["steps"][0]
        assert step["ok"] > 0 and not step["errors"], step
        assert "over TLS" in proc.log()
        # HTTPS on the HTTP port with the same certificate; plain HTTP there gets no answer.
        assert https(proc, "/v2/health/ready", pki["ca"]) == (0, '{"ready":true}')
        code, body = https(proc, "/v1/models/sentiment:classify", pki["ca"], data='{"texts": ["A fine film."]}')
        assert code == 0 and json.loads(body)["results"][0]["labels"], body
        assert https(proc, "/v2/health/ready", pki["ca"], scheme="http")[1] == ""
        assert https(proc, "/v2/health/ready", pki["other_ca"])[0] != 0  # a server this client cannot verify
        assert "serving HTTP/JSON" in proc.log() and "over TLS" in proc.log()
    finally:
        proc.stop()


def test_mutual_tls_requires_a_client_certificate_from_the_ca(api, pki, tmp_path):
    proc = start(str(tmp_path), "--tls-cert", pki["server_cert"], "--tls-key", pki["server_key"],
                 "--tls-client-ca", pki["ca"])
    try:
        assert wait_ready(api, lambda: tls_channel(proc.address, pki["ca"], pki["client_cert"], pki["client_key"]))
        refused(api, tls_channel(proc.address, pki["ca"]))  # no client certificate
        refused(api, tls_channel(proc.address, pki["ca"], pki["other_cert"], pki["other_key"]))  # another CA's
        refused(api, grpc.insecure_channel(proc.address))
        assert "over mutual TLS" in proc.log()
        assert https(proc, "/v2/health/ready", pki["ca"], pki["client_cert"], pki["client_key"]) == \
            (0, '{"ready":true}')
        assert https(proc, "/v2/health/ready", pki["ca"])[0] != 0  # no client certificate
        assert https(proc, "/v2/health/ready", pki["ca"], pki["other_cert"], pki["other_key"])[0] != 0
    finally:
        proc.stop()


def test_a_renewed_certificate_takes_effect_without_a_restart(api, pki, tmp_path):
    proc = start(str(tmp_path), "--tls-cert", pki["server_cert"], "--tls-key", pki["server_key"],
                 "--tls-reload-seconds", "1")
    try:
        assert wait_ready(api, lambda: tls_channel(proc.address, pki["ca"]))
        # Renew: a certificate from a new CA, written over the files the server reads.
        folder = pki["folder"]
        make_ca(folder, "ca2")
        cert, key = make_cert(folder, "ca2", "server2", server=True)
        os.replace(key, pki["server_key"])
        os.replace(cert, pki["server_cert"])
        new_ca = os.path.join(folder, "ca2.pem")
        assert wait_ready(api, lambda: tls_channel(proc.address, new_ca)).results
        refused(api, tls_channel(proc.address, pki["ca"]))
        # The HTTP port serves the renewed certificate too (from the next connection on).
        assert https(proc, "/v2/health/ready", new_ca) == (0, '{"ready":true}')
        assert https(proc, "/v2/health/ready", pki["ca"])[0] != 0
    finally:
        proc.stop()


def test_tls_flags_are_checked(tmp_path, pki):
    out = subprocess.run([os.path.join(REPO, "build", "qvi-server"), "--tls-cert", pki["server_cert"]],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "--tls-cert, --tls-key" in out.stderr, out.stderr
    out = subprocess.run([os.path.join(REPO, "build", "qvi-server"), "--tls-cert", "/nonexistent.pem",
                          "--tls-key", pki["server_key"]], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "/nonexistent.pem" in out.stderr, out.stderr


def test_handshake_failures_and_library_errors_are_counted_not_flooded_into_the_log(api, pki, tmp_path):
    """Plain-text clients knocking on a TLS port and malformed messages to a service protobuf parsed
    (reflection) used to write gRPC's and protobuf's own plain-text lines, several per attempt. Now
    every line of a JSON log is one JSON object, handshake failures are a metric, and malformed
    reflection requests are refused by the wire walk before protobuf sees them."""
    proc = start(str(tmp_path), "--tls-cert", pki["server_cert"], "--tls-key", pki["server_key"],
                 "--log-format", "json")
    try:
        assert wait_ready(api, lambda: tls_channel(proc.address, pki["ca"])).results
        refused(api, grpc.insecure_channel(proc.address))
        # A scanner: 30 connections that speak plain HTTP/2 to the TLS port, each its own handshake.
        host, port = proc.address.rsplit(":", 1)
        for _ in range(30):
            with socket.create_connection((host, int(port)), timeout=10) as s:
                s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
                try:
                    while s.recv(4096):
                        pass  # until the server closes the connection
                except OSError:
                    pass
        # ServerReflectionRequest.file_containing_symbol (field 4) holding bytes that are not UTF-8:
        # gRPC's reflection plugin had protobuf parse it, which logged a plain-text line per message.
        # The wire walk refuses it first, saying why, and logs nothing.
        channel = tls_channel(proc.address, pki["ca"])
        info = channel.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
        for _ in range(60):
            with pytest.raises(grpc.RpcError) as e:
                list(info(iter([b"\x22\x02\xff\xfe"]), timeout=10))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
            assert "file_containing_symbol: invalid UTF-8" in e.value.details(), e.value.details()
        channel.close()
        # Counted as gRPC reports each failure, which may come a moment after the client gave up.
        wait_until(lambda: proc.metrics()["qvi_tls_handshake_failures_total"] >= 30, "30 failed handshakes counted")
        log = proc.log().splitlines()
        for line in log:
            json.loads(line)  # one JSON object per line: nothing of the libraries' own format
        assert not [line for line in log if "Handshake failed" in line], "handshake failures are counted, not logged"
        assert not [line for line in log if '"protobuf: ' in line], "a request protobuf would not parse was walked first"
        # gRPC's own lines, rate-limited and counted, are pinned by logging_test (LibraryLogsTest).
    finally:
        proc.stop()


def served_certificate(address):
    """The DER certificate the server presents now (no verification: only which one it is)."""
    host, port = address.rsplit(":", 1)
    return ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate((host, int(port)), timeout=10))


def der(path):
    return ssl.PEM_cert_to_DER_cert(read(path).decode())


def test_a_set_that_cannot_serve_stops_the_server_at_start_naming_the_file(tmp_path, pki):
    garbage = os.path.join(str(tmp_path), "garbage.pem")
    with open(garbage, "w") as f:
        f.write("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
    server = os.path.join(REPO, "build", "qvi-server")
    cases = [
        (["--tls-cert", garbage, "--tls-key", pki["server_key"]], f"--tls-cert {garbage}: not a PEM certificate"),
        (["--tls-cert", pki["server_cert"], "--tls-key", garbage], f"--tls-key {garbage}: not an unencrypted PEM"),
        (["--tls-cert", pki["server_cert"], "--tls-key", pki["client_key"]],
         f"--tls-key {pki['client_key']} is not the key of the certificate in --tls-cert {pki['server_cert']}"),
        (["--tls-cert", pki["server_cert"], "--tls-key", pki["server_key"], "--tls-client-ca", garbage],
         f"--tls-client-ca {garbage}: not a PEM certificate"),
    ]
    for flags, message in cases:
        out = subprocess.run([server, "--model-store", STORE, *flags], capture_output=True, text=True, timeout=30)
        assert out.returncode == 2 and message in out.stderr, (flags, out.stderr)


def test_a_two_step_renewal_and_a_bad_write_never_lock_clients_out(api, pki, tmp_path):
    """The certificate written first and its key a moment later (a renewal in two steps), then garbage
    written over the certificate: each refused set is counted and logged once, the last good set keeps
    serving new connections, and the renewed one serves once both files match."""
    work = str(tmp_path)
    cert, key = os.path.join(work, "tls.crt"), os.path.join(work, "tls.key")
    shutil.copy(pki["server_cert"], cert)
    shutil.copy(pki["server_key"], key)
    new_cert, new_key = make_cert(pki["folder"], "ca", "renewed", server=True)
    proc = start(work, "--tls-cert", cert, "--tls-key", key, "--tls-reload-seconds", "1")

    def failures():
        return proc.metrics()["qvi_tls_reload_failures_total"]

    def replace(source, target):
        shutil.copy(source, target + ".tmp")
        os.replace(target + ".tmp", target)  # as a Secret's volume or an ACME client swaps files

    try:
        assert wait_ready(api, lambda: tls_channel(proc.address, pki["ca"])).results
        assert served_certificate(proc.address) == der(pki["server_cert"])
        assert failures() == 0
        expiry = proc.metrics()["qvi_tls_certificate_expiry_timestamp_seconds"]
        assert time.time() < expiry < time.time() + 3 * 86400, expiry

        replace(new_cert, cert)  # step one: the new certificate beside the old key
        wait_until(lambda: failures() == 1, "the half-renewed set to be refused")
        assert classify(api, tls_channel(proc.address, pki["ca"])).results, "the old set still serves"
        assert served_certificate(proc.address) == der(pki["server_cert"])

        replace(new_key, key)  # step two: the set matches again
        wait_until(lambda: served_certificate(proc.address) == der(new_cert), "the renewed certificate to serve")
        assert classify(api, tls_channel(proc.address, pki["ca"])).results

        with open(cert + ".tmp", "w") as f:
            f.write("garbage\n")
        os.replace(cert + ".tmp", cert)
        wait_until(lambda: failures() == 2, "the garbage certificate to be refused")
        assert classify(api, tls_channel(proc.address, pki["ca"])).results
        assert served_certificate(proc.address) == der(new_cert)
        log = proc.log()
        assert log.count("TLS files changed and were refused") == 2, log
        assert "is not the key of the certificate in --tls-cert" in log
        assert log.count("TLS files reloaded") == 1, log
    finally:
        proc.stop()
