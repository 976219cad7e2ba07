"""Failure containment and gRPC's transport limits, end to end through a real qvi-server.

- An answer that never reached the client is not counted as OK: the metrics and the access log
  must agree with what the clients saw, also when the model finished the work after the client's
  deadline had passed.
- The transport limits set by flags are in force on the wire: the HTTP/2 SETTINGS the server
  announces (--max-concurrent-streams), the GOAWAY an idle connection gets
  (--max-connection-idle-seconds), and the GOAWAY a client that pings too often gets
  (--min-client-ping-interval-seconds). These speak HTTP/2 over a plain socket, frame by frame,
  because a gRPC client library hides exactly what is checked here.
- A stderr that nobody reads does not stop serving under --access-log: access lines queue, and the
  oldest are dropped and counted once the queue is full.
"""
import json
import os
import shutil
import socket
import struct
import tempfile
import threading
import time

import grpc
import pytest

from qvi_testing import STORE, ServerProcess, wait_until

LONG_TEXT = " ".join(f"word{i}" for i in range(120))
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS, PING, GOAWAY = 0x4, 0x6, 0x7
ACK = 0x1
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
ENHANCE_YOUR_CALM = 0xB


def frame(kind, flags=0, stream=0, payload=b""):
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags, stream) + payload


class Http2:
    """A bare HTTP/2 client connection: sends the preface and empty SETTINGS, reads frames."""

    def __init__(self, address):
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.sock.sendall(PREFACE + frame(SETTINGS))

    def read_exact(self, n):
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("the server closed the connection")
            data += chunk
        return data

    def next_frame(self):
        head = self.read_exact(9)
        length = struct.unpack(">I", b"\0" + head[:3])[0]
        kind, flags, stream = struct.unpack(">BBI", head[3:])
        return kind, flags, stream & 0x7FFFFFFF, self.read_exact(length)

    def wait_for(self, kind, within_s):
        """Frames until one of `kind` (acknowledging the server's SETTINGS on the way)."""
        self.sock.settimeout(within_s)
        while True:
            k, flags, _, payload = self.next_frame()
            if k == SETTINGS and not flags & ACK:
                self.sock.sendall(frame(SETTINGS, ACK))
            if k == kind:
                return flags, payload

    def close(self):
        self.sock.close()


def goaway_error(payload):
    _last_stream, code = struct.unpack(">II", payload[:8])
    return code, payload[8:].decode(errors="replace")


@pytest.fixture(scope="module")
def transport():
    work = tempfile.mkdtemp(prefix="qvi_transport_py_")
    proc = ServerProcess(STORE, work, "--max-concurrent-streams", "7", "--max-connection-idle-seconds", "1",
                         "--min-client-ping-interval-seconds", "30")
    yield proc
    proc.stop()
    shutil.rmtree(work, ignore_errors=True)


def test_max_concurrent_streams_is_announced(transport):
    conn = Http2(transport.address)
    try:
        _, payload = conn.wait_for(SETTINGS, 10)
        settings = dict(struct.unpack(">HI", payload[i:i + 6]) for i in range(0, len(payload), 6))
        assert settings.get(SETTINGS_MAX_CONCURRENT_STREAMS) == 7, settings
    finally:
        conn.close()


def test_an_idle_connection_is_sent_goaway(transport):
    conn = Http2(transport.address)
    try:
        start = time.monotonic()
        _, payload = conn.wait_for(GOAWAY, 30)
        code, debug = goaway_error(payload)
        assert "idle" in debug, (code, debug)  # gRPC says "enter idle"
        assert time.monotonic() - start >= 0.9, "GOAWAY came before the idle time had passed"
    finally:
        conn.close()


def test_a_client_that_pings_too_often_is_sent_goaway(transport):
    conn = Http2(transport.address)
    try:
        for i in range(5):
            conn.sock.sendall(frame(PING, payload=struct.pack(">Q", i)))
        _, payload = conn.wait_for(GOAWAY, 30)
        code, debug = goaway_error(payload)
        assert code == ENHANCE_YOUR_CALM, (code, debug)
        assert "too_many_pings" in debug, debug
    finally:
        conn.close()


# --- answers that do not reach the client ---------------------------------------------------------

@pytest.fixture(scope="module")
def one_big_batch():
    """qvi-server whose sentiment model takes a whole 256-text request as one batch (so the model
    runs once per request and takes a while), with the access log on."""
    work = tempfile.mkdtemp(prefix="qvi_undelivered_py_")
    store = os.path.join(work, "store")
    shutil.copytree(os.path.join(STORE, "sentiment"), os.path.join(store, "sentiment"))
    with open(os.path.join(store, "sentiment", "serving.json"), "w") as f:
        json.dump({"max_batch_size": 256, "max_batch_tokens": 1 << 20, "max_queue_delay_ms": 0}, f)
    proc = ServerProcess(store, work, "--access-log")
    yield proc
    proc.stop()
    shutil.rmtree(work, ignore_errors=True)


def counted(proc, code):
    return sum(v for k, v in proc.metrics().items()
               if k.startswith("qvi_requests_total{") and 'method="Classify"' in k and f'code="{code}"' in k)


def batches(proc):
    return sum(v for k, v in proc.metrics().items() if k.startswith("qvi_batch_size_count"))


def test_an_answer_cut_by_the_deadline_is_not_counted_ok(one_big_batch, api):
    proc = one_big_batch
    pb, pb_grpc = api
    stub = pb_grpc.InferenceStub(proc.channel)
    request = pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=[LONG_TEXT] * 256)
    # How long the model takes on this machine: the fastest of three calls (the first also warms it up),
    # so that one slow call (a busy CI machine) does not set a deadline the others beat.
    warm_up = 3
    took = float("inf")
    for _ in range(warm_up):
        start = time.monotonic()
        stub.Classify(request, timeout=120)
        took = min(took, time.monotonic() - start)
    # The server counts a call when gRPC is done with it (OnDone), which can come a moment after the
    # client has its answer: wait for the warm-up calls to be counted before taking the baseline.
    wait_until(lambda: counted(proc, "OK") == warm_up, "the server to count the warm-up calls")
    ok_before, late_before, batches_before = counted(proc, "OK"), counted(proc, "DEADLINE_EXCEEDED"), batches(proc)

    # A deadline of a third of the fastest call falls well inside the model's run; calls are made until
    # one is cut (at most five, so that a machine that suddenly runs three times faster ends the test).
    seen = {"OK": 0, "DEADLINE_EXCEEDED": 0}
    while seen["DEADLINE_EXCEEDED"] == 0 and seen["OK"] < 5:
        try:
            stub.Classify(request, timeout=took / 3)
            seen["OK"] += 1
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.DEADLINE_EXCEEDED, e.details()
            seen["DEADLINE_EXCEEDED"] += 1
    assert seen["DEADLINE_EXCEEDED"] > 0, f"every call beat a deadline of {took / 3:.3f} s"
    cut_calls = seen["OK"] + seen["DEADLINE_EXCEEDED"]
    # Let the server finish the work it was doing for the cut calls.
    wait_until(lambda: counted(proc, "OK") + counted(proc, "DEADLINE_EXCEEDED") >= ok_before + late_before + cut_calls,
               "the server to count the calls made with a short deadline")
    assert batches(proc) > batches_before, "the model never ran: the deadline passed before it did"
    assert counted(proc, "OK") - ok_before == seen["OK"]
    assert counted(proc, "DEADLINE_EXCEEDED") - late_before == seen["DEADLINE_EXCEEDED"]
    # Each call is logged just after it is counted: wait for a line per call (warm-up and short deadline).
    def access_lines():
        return [line for line in proc.log().splitlines() if "method=Classify" in line]
    wait_until(lambda: len(access_lines()) >= warm_up + cut_calls, "a Classify line per call in the access log")
    access = access_lines()
    assert len(access) == warm_up + cut_calls, access
    assert sum("code=DEADLINE_EXCEEDED" in line for line in access) == seen["DEADLINE_EXCEEDED"], access
    assert sum("code=OK" in line for line in access) == warm_up + seen["OK"], access


# --- a blocked stderr ----------------------------------------------------------------------------

def test_a_blocked_stderr_does_not_stop_serving(api):
    """The server's stderr is a pipe nobody reads: once its 64 KiB are full, a synchronous access
    log would hold every gRPC thread in write(). The calls must all be answered, promptly, and every
    access line either reach stderr later or be counted as dropped."""
    pb, pb_grpc = api
    work = tempfile.mkdtemp(prefix="qvi_blocked_stderr_py_")
    calls = 1500  # ~350 KB of access lines: well over the pipe (64 KiB) and the queue (64 lines)
    proc = ServerProcess(STORE, work, "--access-log", "--access-log-queue", "64", log_pipe=True)
    drained = []
    try:
        stub = pb_grpc.InferenceStub(proc.channel)
        request = pb.ClassifyRequest(model=pb.ModelSpec(name="sentiment"), texts=["fine"])
        start = time.monotonic()
        pending = []
        for i in range(calls):
            pending.append(stub.Classify.future(request, timeout=60))
            if len(pending) == 16:
                for f in pending:
                    f.result()  # raises on anything but OK
                pending.clear()
        for f in pending:
            f.result()
        took = time.monotonic() - start
        assert took < 60, f"{calls} calls took {took:.1f} s with stderr blocked"
        # A call's line is queued when its gRPC call is done (OnDone), which may come after the client
        # has its answer; the server counts a call in qvi_requests_total only after queuing its line.
        # Once all are counted, every line is in the pipe, in the queue, or dropped.
        wait_until(lambda: counted(proc, "OK") == calls, "every call to be counted (and its line queued)")
        wait_until(lambda: proc.metrics().get("qvi_access_log_dropped_lines_total", 0) > 0,
                   "access lines to be dropped while stderr is blocked")
        dropped = proc.metrics()["qvi_access_log_dropped_lines_total"]
        reader = threading.Thread(target=lambda: drained.append(proc.proc.stdout.read()))
        reader.start()
        proc.stop()
        reader.join(timeout=60)
    finally:
        if proc.proc.poll() is None:
            proc.proc.kill()
        shutil.rmtree(work, ignore_errors=True)
    lines = [line for line in drained[0].decode(errors="replace").splitlines() if "method=Classify" in line]
    assert len(lines) + dropped == calls, (len(lines), dropped)
    assert len(lines) >= 64, "the queued lines were not written out after stderr unblocked"
