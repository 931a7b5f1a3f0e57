"""A stand-in for ``celery worker`` that tests of the launcher run as a subprocess.

It imports nothing of toolexec, so the launcher's tests do not depend on the worker
code: it forks ``--children`` sleeping children, publishes a heartbeat in the shape of
``WorkerInfo`` under ``--key`` (unless ``--silent``), and sleeps until it is signalled.

Usage: ``python fake_worker.py URL KEY_PREFIX [--children N] [--silent]
[--ignore-term] [--exit CODE]``
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time

import redis


def main() -> None:
    """Parse the arguments and behave as told."""
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("key_prefix")
    parser.add_argument("--children", type=int, default=0)
    parser.add_argument("--silent", action="store_true")
    parser.add_argument("--ignore-term", action="store_true")
    parser.add_argument("--exit", type=int, default=None)
    args = parser.parse_args()

    if args.exit is not None:
        sys.stderr.write("fake worker: exiting as told\n")
        sys.exit(args.exit)
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for _ in range(args.children):
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            while True:
                time.sleep(60)
    if not args.silent:
        worker_id = f"fake-{os.getpid()}"
        info = {
            "worker_id": worker_id,
            "hostname": f"fake@{socket.gethostname()}",
            "pid": os.getpid(),
            "queues": ["default"],
            "tools": [],
            "pool": "prefork",
            "started_at": time.time(),
        }
        with redis.Redis.from_url(args.url) as client:
            client.set(args.key_prefix + worker_id, json.dumps(info), ex=60)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
