#!/usr/bin/env python3
# A ring-worker stand-in for ringd_worker_lines_test.sh: speaks ringd's control protocol
# (common/contract/control.h) without training, and sends what a real worker could not easily
# produce: wrongly typed lines (each must be dropped by ringd, not end it) and, for every step,
# "loss_sum": null, which is how a NaN loss reaches ringd (JSON has no NaN).
# Bucket count: $RING_FAKE_BUCKETS (the model's layers + 2). The model size is learnt from
# ringd's refusal of a first hello with n = 1. The control protocol version it says is
# $RING_FAKE_PROTO (default: this build's, 1): another one must be refused by ringd.
import json
import os
import re
import socket
import sys

args = sys.argv[1:]


def arg(name):
    return args[args.index(name) + 1]


sock_path = arg("--ringd")
rank = int(arg("--rank"))
local = int(arg("--local-rank"))
buckets = int(os.environ["RING_FAKE_BUCKETS"])


def connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sock_path)
    return s, s.makefile("rb")


def send(s, msg):
    line = msg if isinstance(msg, bytes) else json.dumps(msg).encode()
    s.sendall(line + b"\n")


def recv(f):
    line = f.readline()
    if not line:
        print("fake worker: ringd closed the socket", file=sys.stderr)
        sys.exit(3)
    return json.loads(line)


proto = int(os.environ.get("RING_FAKE_PROTO", "1"))
hello = {"t": "hello", "rank": rank, "local": local, "pid": os.getpid(), "n": 1, "proto": proto}
s, f = connect()
send(s, hello)
refusal = recv(f)
m = re.search(r"ringd's has (\d+)", refusal.get("reason", ""))
if not m:
    print("fake worker: unexpected reply " + json.dumps(refusal), file=sys.stderr)
    sys.exit(4)
s.close()
hello["n"] = int(m.group(1))
s, f = connect()
send(s, hello)
welcome = recv(f)
assert welcome["t"] == "welcome", welcome
send(s, {"t": "mapped"})
if welcome["need_init"]:
    send(s, {"t": "init"})
# Wrongly typed fields (tests/fuzz/corpus/worker_control/): ringd used to throw type_error out of
# its handler on these and end with "ringd: fatal".
# $RING_FAKE_HOSTILE=0 leaves them out (only the NaN loss).
hostile = [b'{"t":"bucket","step":1,"b":"0"}', b'{"t":"done","step":"1"}',
           b'{"t":"done","step":3,"loss_sum":"x"}', b'{"t":7}', b'[1,2]',
           b'{"t":"hello","local":"0"}', b'{"t":"hb","x":1e999}', b'not json']
for line in hostile if os.environ.get("RING_FAKE_HOSTILE", "1") == "1" else []:
    send(s, line)
while True:
    cmd = recv(f)
    if cmd["t"] == "stop":
        break
    step = cmd["step"]
    for b in range(buckets):
        send(s, {"t": "bucket", "step": step, "b": b})
    send(s, {"t": "done", "step": step, "loss_sum": None, "valid": 10, "tokens": 16,
             "step_ms": 1.0, "ring_wait_ms": 0.0, "bytes_sent": 0, "cursor": None})
