"""gRPC's own xDS client (C-core, through grpcio) as a test peer for tonic-balancer's xDS tests:
a channel to an `xds:///` target, whose listeners, routes, clusters and endpoints come from the
control plane that the bootstrap names (the Go peer in ../xds), calling the test fleet's
`fleet.v1.Fleet/Unary` (fleet-proto/proto/fleet.proto). It shows what gRPC itself does with the
resources a test serves, beside what tonic-balancer's client does with the same ones.

    python -u xds_client.py --target xds:///svc

The bootstrap comes from the environment, as C-core reads it: GRPC_XDS_BOOTSTRAP_CONFIG (the JSON
text) or GRPC_XDS_BOOTSTRAP (a file). The Rust harness (fleet-service/src/xds.rs) sets the first.

It prints "READY" once its channel exists, then reads commands on stdin, one a line, and answers
each with one line on stdout:

    calls N [deadline_ms=D]  N sequential unary calls (deadline D ms each, default 5000), answered
                             "COUNTS <instance>=<n> ... failed=<k>": the instances that answered,
                             by name (each Reply's field 1), and the calls that failed. Instance
                             names are percent-escaped (%, space, = and all but printable ASCII);
                             failed=<k> is always the last pair.
    state                    "STATE <connectivity>" of the channel (IDLE, CONNECTING, READY, ...).
    until NAME [limit_ms=L]  sequential unary calls (deadline 1 s each) until one is answered by
                             instance NAME, for at most L ms (default 30000): "STARTED" once the
                             first call has ended, then "FIRST <ns> calls=<n> failed=<k>" with
                             the wall clock (time.time_ns) when NAME's answer came, or
                             "NONE calls=<n> failed=<k>" at the limit. For the time from a
                             control plane's push to the first call on a new endpoint.

A malformed command is answered "ERR <message>". Each failed call's status goes to stderr. It
exits when stdin closes: the test that started it holds the other end.

No generated code: Req and Reply are a few bytes of protobuf, written and read by hand.
"""

import argparse
import sys
import time
import urllib.parse

import grpc

METHOD = "/fleet.v1.Fleet/Unary"


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def read_varint(buf, i):
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def request(call_id):
    """fleet.v1.Req{id}: field 1, varint."""
    return b"\x08" + varint(call_id)


def instance_of(reply):
    """fleet.v1.Reply's field 1 (`string instance`), walking the other fields by wire type."""
    i = 0
    while i < len(reply):
        key, i = read_varint(reply, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, i = read_varint(reply, i)
        elif wire == 2:
            n, i = read_varint(reply, i)
            if field == 1:
                return reply[i : i + n].decode("utf-8", "replace")
            i += n
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"wire type {wire} in a Reply")
    return ""


def escape(name):
    """An instance name as one token of the COUNTS line."""
    return urllib.parse.quote(name, safe="!\"#$&'()*+,-./:;<>?@[\\]^_`{|}~")


def seconds_option(opts, key, default):
    """The value of `key=<ms>` among a command's options, in seconds; any other option is an
    error."""
    seconds = default
    for opt in opts:
        name, _, value = opt.partition("=")
        if name != key:
            raise ValueError(f"unknown option {opt!r}")
        seconds = int(value) / 1000.0
    return seconds


class State:
    def __init__(self, channel):
        self.state = None
        channel.subscribe(self.changed, try_to_connect=False)

    def changed(self, state):
        self.state = state


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True, help="the channel's target, e.g. xds:///svc")
    args = ap.parse_args()

    channel = grpc.insecure_channel(args.target)
    state = State(channel)
    unary = channel.unary_unary(METHOD)  # bytes in, bytes out
    next_id = 0
    print("READY", flush=True)

    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        try:
            if words[0] == "calls" and len(words) >= 2:
                n = int(words[1])
                deadline = seconds_option(words[2:], "deadline_ms", 5.0)
                counts, failed = {}, 0
                for _ in range(n):
                    next_id += 1
                    try:
                        reply = unary(request(next_id), timeout=deadline)
                    except grpc.RpcError as e:
                        failed += 1
                        print(f"call {next_id}: {e.code()} {e.details()}", file=sys.stderr, flush=True)
                        continue
                    name = instance_of(reply)
                    counts[name] = counts.get(name, 0) + 1
                tokens = [f"{escape(k)}={v}" for k, v in sorted(counts.items())]
                tokens.append(f"failed={failed}")  # always the last
                print("COUNTS " + " ".join(tokens), flush=True)
            elif words[0] == "until" and len(words) >= 2:
                want = words[1]
                limit = seconds_option(words[2:], "limit_ms", 30.0)
                calls = failed = 0
                start = time.monotonic()
                first = None
                while first is None and time.monotonic() - start < limit:
                    next_id += 1
                    calls += 1
                    try:
                        reply = unary(request(next_id), timeout=1.0)
                        if instance_of(reply) == want:
                            first = time.time_ns()
                    except grpc.RpcError as e:
                        failed += 1
                        print(f"call {next_id}: {e.code()} {e.details()}", file=sys.stderr, flush=True)
                    if calls == 1:
                        print("STARTED", flush=True)
                if first is None:
                    print(f"NONE calls={calls} failed={failed}", flush=True)
                else:
                    print(f"FIRST {first} calls={calls} failed={failed}", flush=True)
            elif words[0] == "state" and len(words) == 1:
                s = state.state
                print(f"STATE {s.name if s else 'UNKNOWN'}", flush=True)
            else:
                raise ValueError(f"unknown command {line.strip()!r}")
        except ValueError as e:
            print(f"ERR {e}", flush=True)
    channel.close()


if __name__ == "__main__":
    main()
