"""A grpcio server for tonic-balancer's tests: the same service as the Go peer (../go/main.go),
with no generated code (generic handlers over the well-known wrapper messages), so that no
protoc is needed.

    peer.Peer/Unary         BytesValue -> BytesValue     echoes the payload
    peer.Peer/ServerStream  BytesValue -> stream         sends N messages (N = payload as a decimal, default 3)
    peer.Peer/ClientStream  stream -> BytesValue         answers the number of messages read
    peer.Peer/Bidi          stream -> stream             echoes each message
    peer.Control/Set        StringValue -> StringValue   a command (see Peer.control)
    grpc.health.v1.Health                                grpcio-health-checking's servicer

The test's messages (fleet-proto/proto/peer.proto) are wire-compatible with the wrappers: field
1 is `bytes payload` / `string command`.

Started by the Rust harness (fleet-service/src/peers.rs) on 127.0.0.1; it prints exactly one
line "LISTENING <port>" to stdout once it serves, and exits when its stdin closes (the test
process is gone, however it died), so that no peer outlives its test.

The channel options are C-core's (https://grpc.github.io/grpc/core/group__grpc__arg__keys.html).
"""

import argparse
import collections
import os
import sys
import threading
import time
from concurrent import futures

import grpc
from google.protobuf import wrappers_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc


class Mode:
    """What the service does with each call; a control command sets it."""

    def __init__(self, text):
        f = text.split()
        if not f:
            raise ValueError("empty mode")
        self.name, self.delay, self.code, self.msg = f[0], 0.0, None, ""
        if self.name == "ok":
            for a in f[1:]:
                if not a.startswith("delay="):
                    raise ValueError(f"ok: unknown option {a!r}")
                self.delay = parse_duration(a[len("delay="):])
        elif self.name == "status":
            if len(f) < 2:
                raise ValueError("status needs a code")
            self.code = parse_code(f[1])
            self.msg = " ".join(f[2:]) or f"peer: status {self.code.name}"
        elif self.name not in ("exception", "hang"):
            raise ValueError(f"unknown mode {self.name!r}")


def parse_duration(s):
    """Go's spelling of the durations the commands take: 5ms, 1.5s, 100us, 2m."""
    for unit, scale in (("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9), ("s", 1.0), ("m", 60.0)):
        if s.endswith(unit):
            return float(s[: -len(unit)]) * scale
    raise ValueError(f"bad duration {s!r}")


def parse_code(s):
    """A gRPC code by name (UNAVAILABLE) or number."""
    for code in grpc.StatusCode:
        if s.upper() == code.name or s == str(code.value[0]):
            return code
    raise ValueError(f"unknown code {s!r}")


class Peer:
    def __init__(self, mode, health_servicer):
        self.lock = threading.Condition()
        self.mode = mode
        self.counts = collections.Counter()
        self.inflight = 0
        self.peak = 0
        # Bumped by `release`: a hanging call that sees it move answers OK.
        self.releases = 0
        self.health = health_servicer
        self.server = None
        self.stopped = threading.Event()

    def begin(self, payload):
        """Counts a call in flight; its mode: the payload's own when it starts with "!" (a
        one-call override, e.g. "!status INTERNAL"), else the current one."""
        with self.lock:
            mode = self.mode
            if payload.startswith(b"!"):
                mode = Mode(payload[1:].decode())
            self.inflight += 1
            self.peak = max(self.peak, self.inflight)
            self.counts[mode.name] += 1
            return mode

    def end(self):
        with self.lock:
            self.inflight -= 1

    def apply(self, mode, context):
        """Does what the mode says before the answer; returns to answer normally."""
        if mode.name == "ok":
            if mode.delay > 0:
                time.sleep(mode.delay)
        elif mode.name == "status":
            if mode.code != grpc.StatusCode.OK:
                # abort() raises: grpcio sends this status (trailers only).
                context.abort(mode.code, mode.msg)
        elif mode.name == "exception":
            # grpcio catches it and answers UNKNOWN "Exception calling application: <message>"
            # at once (grpc/_server.py, _call_behavior).
            raise RuntimeError("peer: mode exception")
        elif mode.name == "hang":
            # Until the client cancels (or its deadline passes), or `release`.
            with self.lock:
                seen = self.releases
                context.add_callback(self.wake)
                while context.is_active() and self.releases == seen:
                    self.lock.wait(1.0)
                if not context.is_active():
                    context.abort(grpc.StatusCode.CANCELLED, "peer: hang ended by the client")

    def wake(self):
        with self.lock:
            self.lock.notify_all()

    def call(self, payload, context, body):
        mode = self.begin(payload)
        try:
            self.apply(mode, context)
            return body()
        finally:
            self.end()

    # The methods of peer.Peer.

    def unary(self, request, context):
        return self.call(request.value, context, lambda: request)

    def server_stream(self, request, context):
        mode = self.begin(b"")
        try:
            self.apply(mode, context)
            n = int(request.value or b"3")
            for i in range(n):
                yield wrappers_pb2.BytesValue(value=str(i).encode())
        finally:
            self.end()

    def client_stream(self, request_iterator, context):
        # The whole request stream is read before the mode applies.
        mode = self.begin(b"")
        try:
            n = sum(1 for _ in request_iterator)
            self.apply(mode, context)
            return wrappers_pb2.BytesValue(value=str(n).encode())
        finally:
            self.end()

    def bidi(self, request_iterator, context):
        mode = self.begin(b"")
        try:
            self.apply(mode, context)
            for request in request_iterator:
                yield request
        finally:
            self.end()

    def control(self, request, context):
        """One command, answered with a line of text:

        ok [delay=D] | status CODE [msg] | exception | hang   set the mode
        health SERVING|NOT_SERVING [service]   the health service's answer ("" = the server)
        count      "total=N ok=N status=N ..." calls to peer.Peer by the mode that served them
        inflight   "inflight=N peak=N"
        release    hanging calls answer OK
        (no `conns`, which the Go peer has: grpcio's servers offer no hook on connections)
        graceful-stop [drain=D]   server.stop(grace): new calls refused, the ones in flight
                   go on; after D (default 100ms) hanging calls are released; exits when done
        """
        f = request.value.split()
        answer = "ok"
        try:
            if not f:
                raise ValueError("empty command")
            if f[0] == "health":
                status = health_pb2.HealthCheckResponse.ServingStatus.Value(f[1])
                self.health.set(f[2] if len(f) > 2 else "", status)
            elif f[0] == "count":
                with self.lock:
                    parts = [f"total={sum(self.counts.values())}"]
                    parts += [f"{k}={v}" for k, v in sorted(self.counts.items())]
                answer = " ".join(parts)
            elif f[0] == "inflight":
                with self.lock:
                    answer = f"inflight={self.inflight} peak={self.peak}"
            elif f[0] == "release":
                self.release()
            elif f[0] == "graceful-stop":
                drain = 0.1
                for a in f[1:]:
                    if not a.startswith("drain="):
                        raise ValueError(f"graceful-stop: bad option {a!r}")
                    drain = parse_duration(a[len("drain="):])
                with self.lock:
                    answer = f"stopping inflight={self.inflight}"
                threading.Timer(drain, self.release).start()
                threading.Thread(target=self.graceful_stop, daemon=True).start()
            else:
                mode = Mode(request.value)
                with self.lock:
                    self.mode = mode
        except (ValueError, IndexError) as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        return wrappers_pb2.StringValue(value=answer)

    def release(self):
        with self.lock:
            self.releases += 1
            self.lock.notify_all()

    def graceful_stop(self):
        # https://grpc.github.io/grpc/python/grpc.html#grpc.Server.stop: new calls are refused
        # at once, the ones in flight have `grace` seconds.
        self.server.stop(grace=30).wait()
        self.stopped.set()


def bytes_handler(kind, fn):
    return kind(
        fn,
        request_deserializer=wrappers_pb2.BytesValue.FromString,
        response_serializer=wrappers_pb2.BytesValue.SerializeToString,
    )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--mode", default="ok")
    p.add_argument("--max-concurrent-streams", type=int, default=0)
    p.add_argument("--max-connection-age-ms", type=int, default=0)
    p.add_argument("--max-connection-age-grace-ms", type=int, default=0)
    p.add_argument("--min-ping-interval-ms", type=int, default=0,
                   help="grpc.http2.min_ping_interval_without_data_ms (C-core's default: 5 min)")
    p.add_argument("--max-ping-strikes", type=int, default=-1,
                   help="grpc.http2.max_ping_strikes (C-core's default: 2; 0 = unlimited)")
    p.add_argument("--workers", type=int, default=128)
    args = p.parse_args()

    # One port per process: without this, C-core sets SO_REUSEPORT and a peer restarted on a
    # port could share it with a process still there.
    options = [("grpc.so_reuseport", 0)]
    if args.max_concurrent_streams:
        # Advertised in SETTINGS_MAX_CONCURRENT_STREAMS. C-core resets a stream past it with
        # RST_STREAM ENHANCE_YOUR_CALM when the client opened it before reading the SETTINGS
        # (a burst on a new connection), and with REFUSED_STREAM later, when its count of a
        # connection's streams (each until closed on both sides) lags behind the client's.
        options.append(("grpc.max_concurrent_streams", args.max_concurrent_streams))
    if args.max_connection_age_ms:
        # GOAWAY NO_ERROR "max_age" after this long, +/-10% jitter, sent twice (last stream id
        # 2^31-1 and a ping, then the real one), as grpc-go does; max_connection_age_grace_ms
        # later the calls still open get UNAVAILABLE "max connection age" and the connection
        # closes. (server.stop() sends the same pair with "Server shutdown".)
        options.append(("grpc.max_connection_age_ms", args.max_connection_age_ms))
    if args.max_connection_age_grace_ms:
        options.append(("grpc.max_connection_age_grace_ms", args.max_connection_age_grace_ms))
    if args.min_ping_interval_ms:
        # Keepalive enforcement: a ping sooner than this after the previous one, with no data
        # sent between, is a strike; past max_ping_strikes the server sends GOAWAY
        # ENHANCE_YOUR_CALM "too_many_pings" (https://github.com/grpc/grpc/blob/master/doc/keepalive.md),
        # answers the calls open UNAVAILABLE "Too many pings" and closes the connection at once.
        # The defaults (5 min, 2 strikes) already do this to a client pinging every few ms.
        options.append(("grpc.http2.min_ping_interval_without_data_ms", args.min_ping_interval_ms))
    if args.max_ping_strikes >= 0:
        options.append(("grpc.http2.max_ping_strikes", args.max_ping_strikes))

    health_servicer = health.HealthServicer()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    peer = Peer(Mode(args.mode), health_servicer)
    # Each call in flight holds a worker thread (hang holds it until the client goes): enough
    # for the tests' 50+ concurrent calls.
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=args.workers), options=options)
    peer.server = server
    server.add_generic_rpc_handlers((
        grpc.method_handlers_generic_handler("peer.Peer", {
            "Unary": bytes_handler(grpc.unary_unary_rpc_method_handler, peer.unary),
            "ServerStream": bytes_handler(grpc.unary_stream_rpc_method_handler, peer.server_stream),
            "ClientStream": bytes_handler(grpc.stream_unary_rpc_method_handler, peer.client_stream),
            "Bidi": bytes_handler(grpc.stream_stream_rpc_method_handler, peer.bidi),
        }),
        grpc.method_handlers_generic_handler("peer.Control", {
            "Set": grpc.unary_unary_rpc_method_handler(
                peer.control,
                request_deserializer=wrappers_pb2.StringValue.FromString,
                response_serializer=wrappers_pb2.StringValue.SerializeToString,
            ),
        }),
    ))
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port(f"127.0.0.1:{args.port}")
    if port == 0:
        sys.exit(f"cannot bind 127.0.0.1:{args.port}")
    server.start()

    def watch_stdin():
        # The parent's end of stdin closes when the test process exits, whatever killed it.
        while os.read(0, 4096):
            pass
        os._exit(0)

    threading.Thread(target=watch_stdin, daemon=True).start()
    print(f"LISTENING {port}", flush=True)
    peer.stopped.wait()


if __name__ == "__main__":
    main()
