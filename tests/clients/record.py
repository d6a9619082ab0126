#!/usr/bin/env python3
"""A recording stdio proxy for MCP servers.

    record.py TRANSCRIPT_PATH -- CMD [ARGS...]

Spawns CMD, relays our stdin to its stdin and its stdout to our stdout, one
line at a time, and appends every line to TRANSCRIPT_PATH as JSON lines:

    {"dir": "c2s" | "s2c", "msg": {...}}

A line that is not JSON is recorded as {"dir": ..., "msg": null, "raw": "..."}
so a validator can flag it. The child's stderr is inherited (passes through).
We exit with the child's status once its stdout ends; when our stdin closes we
close the child's stdin. SIGTERM/SIGINT are forwarded to the child.
"""

import json
import signal
import subprocess
import sys
import threading


def main() -> int:
    args = sys.argv[1:]
    if len(args) < 3 or args[1] != "--":
        print("usage: record.py TRANSCRIPT_PATH -- CMD [ARGS...]", file=sys.stderr)
        return 2
    transcript_path, cmd = args[0], args[2:]

    transcript = open(transcript_path, "a", encoding="utf-8")
    lock = threading.Lock()

    def record(direction: str, line: bytes) -> None:
        text = line.decode("utf-8", errors="replace").rstrip("\r\n")
        if not text.strip():
            return
        try:
            entry = {"dir": direction, "msg": json.loads(text)}
        except ValueError:
            entry = {"dir": direction, "msg": None, "raw": text}
        with lock:
            transcript.write(json.dumps(entry) + "\n")
            transcript.flush()

    child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def forward(signum, _frame):
        if child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)

    def pump_stdin() -> None:
        assert child.stdin is not None
        try:
            for line in iter(sys.stdin.buffer.readline, b""):
                record("c2s", line)
                child.stdin.write(line)
                child.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the child went away; its stdout EOF ends the main loop
        finally:
            try:
                child.stdin.close()
            except OSError:
                pass

    threading.Thread(target=pump_stdin, daemon=True).start()

    assert child.stdout is not None
    try:
        for line in iter(child.stdout.readline, b""):
            record("s2c", line)
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()
    except BrokenPipeError:
        child.terminate()  # our client went away; nobody is left to read the server
    status = child.wait()
    transcript.close()
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main())
