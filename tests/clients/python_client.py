#!/usr/bin/env python3
"""Drive mcqemu with the official Python MCP SDK (mcp 2.x) over stdio.

    python_client.py BINARY MODE [resources]   (MODE: auto -> 2026-07-28, legacy -> 2025-11-25)

Without `resources`: tools, a tool error, a cancelled download, progress. With
`resources`: a VM's serial console log and screen as MCP resources (list,
templates, read), the list following the VMs (auto: a `subscriptions/listen`
stream; legacy: notifications/resources/list_changed), and a VM that is gone as
a clear error. That journey boots the test guest named by MCQEMU_TEST_KERNEL,
MCQEMU_TEST_INITRD and MCQEMU_TEST_APPEND, in MCQEMU_STATE_DIR and
MCQEMU_RUNTIME_DIR when set (the Rust test sets them, and kills what is left),
with MCQEMU_ROOTS passed on (the guest's folder must be inside the roots).

The server runs under record.py, and the recorded transcript is checked with
validate_transcript.py at the end. Exits 0 when every check passed, 1 with a
clear message otherwise.
"""

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, ResourceListChangedNotification

HERE = Path(__file__).resolve().parent
EXPECTED_VERSION = {"auto": "2026-07-28", "legacy": "2025-11-25"}
EXPECTED_TOOLS = {"list_vms", "image_create", "image_info", "image_download", "launch_vm", "stop_vm"}
WHOLE_RUN_S = 100  # everything, connect to close
REQUEST_S = 30  # any single request


class Failure(Exception):
    pass


def vm_resources(r) -> list:
    """The VMs' resources listed (the live view, ui://mcqemu/view, is always there too)."""
    return [x for x in r.resources if not str(x.uri).startswith("ui://")]


def check(cond: object, what: str) -> None:
    if not cond:
        raise Failure(what)


def payload(size: int) -> bytes:
    return bytes(i % 251 for i in range(size))


class Trickle:
    """An HTTP server whose /NAME?size=&chunk=&delay= responses trickle bytes slowly.

    Per NAME it records whether the body started flowing and whether the peer
    hung up before the end (the server stopped downloading)."""

    def __init__(self) -> None:
        self.state: dict[str, dict] = {}
        trickle = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlparse(self.path)
                q = {k: v[0] for k, v in parse_qs(url.query).items()}
                size, chunk, delay = int(q["size"]), int(q["chunk"]), float(q["delay"])
                st = trickle.state.setdefault(
                    url.path, {"started": threading.Event(), "ended": threading.Event(), "aborted": False}
                )
                body = payload(size)
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/octet-stream")
                    self.send_header("Content-Length", str(size))
                    self.end_headers()
                    for off in range(0, size, chunk):
                        self.wfile.write(body[off : off + chunk])
                        self.wfile.flush()
                        st["started"].set()
                        time.sleep(delay)
                except (BrokenPipeError, ConnectionResetError):
                    st["aborted"] = True
                finally:
                    st["ended"].set()

            def log_message(self, *_args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, name: str, size: int, chunk: int, delay: float) -> str:
        port = self.httpd.server_address[1]
        return f"http://127.0.0.1:{port}/{name}?size={size}&chunk={chunk}&delay={delay}"

    def get(self, name: str) -> dict | None:
        return self.state.get("/" + name)


async def wait_until(cond, timeout: float, what: str) -> None:
    with anyio.move_on_after(timeout):
        while not cond():
            await anyio.sleep(0.05)
        return
    raise Failure(f"timed out after {timeout:g}s waiting for {what}")


async def run(binary: str, mode: str, tmp: Path, transcript: Path) -> dict:
    """Run every step; returns facts the transcript checks need afterwards."""
    facts: dict = {}
    (tmp / "state").mkdir()
    (tmp / "run").mkdir()
    server = StdioServerParameters(
        command=sys.executable,
        args=[str(HERE / "record.py"), str(transcript), "--", binary],
        env={"MCQEMU_STATE_DIR": str(tmp / "state"), "MCQEMU_RUNTIME_DIR": str(tmp / "run")},
    )
    web = Trickle()

    async with Client(server, mode=mode, read_timeout_seconds=REQUEST_S) as client:
        # 1. negotiated era and server identity
        want = EXPECTED_VERSION[mode]
        check(client.protocol_version == want, f"mode={mode} negotiated {client.protocol_version!r}, expected {want!r}")
        info = client.server_info
        check(info is not None, "the SDK saw no server info (initialize serverInfo / _meta serverInfo stamp)")
        check(info.name == "mcqemu", f"server info names {info.name!r}, expected 'mcqemu'")
        print(f"connected: {client.protocol_version}, server {info.name} {info.version}")

        # 2. tools, following pagination
        tools, cursor = [], None
        for _ in range(50):
            page = await client.list_tools(cursor=cursor)
            tools += page.tools
            cursor = page.next_cursor
            if cursor is None:
                break
        else:
            raise Failure("tools/list still had a nextCursor after 50 pages")
        names = {t.name for t in tools}
        check(len(names) == len(tools), f"duplicate tool names in tools/list: {sorted(t.name for t in tools)}")
        check(EXPECTED_TOOLS <= names, f"tools/list lacks {sorted(EXPECTED_TOOLS - names)}; got {sorted(names)}")
        for t in tools:
            check(t.input_schema.get("type") == "object", f"tool {t.name} inputSchema is not an object schema")
            if t.name in EXPECTED_TOOLS - {"stop_vm", "launch_vm"}:
                check(t.output_schema is not None, f"tool {t.name} has no outputSchema to validate results with")
        print(f"tools/list: {len(tools)} tools")

        # 3. list_vms: structured result (the SDK validates it against the outputSchema)
        r = await client.call_tool("list_vms", {})
        check(not r.is_error, f"list_vms failed: {r.content}")
        sc = r.structured_content
        check(isinstance(sc, dict), f"list_vms has no structuredContent: {r}")
        check(sc.get("vms") == [], f"list_vms in a fresh state dir should list no VM: {sc}")
        check(isinstance(sc.get("registry_warnings"), list), f"list_vms lacks registry_warnings: {sc}")
        check(r.content and r.content[0].type == "text", f"list_vms has no text content: {r.content}")

        # 4. image_create
        img = tmp / "a.qcow2"
        r = await client.call_tool("image_create", {"path": str(img), "size": "16M"})
        check(not r.is_error, f"image_create failed: {r.content}")
        sc = r.structured_content or {}
        check(sc.get("format") == "qcow2", f"image_create format: {sc}")
        check(sc.get("virtual_size") == 16 * 1024 * 1024, f"image_create virtual_size: {sc}")
        check(img.is_file(), f"image_create reported success but {img} does not exist")

        # 5. a failing tool: a tool error (isError), not a protocol error
        missing = tmp / "missing.qcow2"
        r = await client.call_tool("image_info", {"path": str(missing)})
        check(r.is_error is True, f"image_info on a missing file should be isError=true: {r}")
        check(r.content and r.content[0].type == "text" and r.content[0].text, f"tool error has no text: {r}")
        print(f"image_info on a missing file: isError, {r.content[0].text[:120]!r}")

        # 6. an unknown tool is a protocol error (JSON-RPC -32602), not a tool result
        try:
            r = await client.call_tool("no_such_tool", {})
        except MCPError as e:
            check(e.code == INVALID_PARAMS, f"unknown tool: error code {e.code} ({e}), expected {INVALID_PARAMS}")
        else:
            raise Failure(f"calling an unknown tool returned a result, not a JSON-RPC error: {r}")

        # 7. cancel a slow download through the SDK (anyio cancel scope)
        dl_dir = tmp / "cancelled"
        dl_dir.mkdir()
        dest = dl_dir / "big.img"
        url = web.url("cancel", size=8 << 20, chunk=16 << 10, delay=0.05)  # ~25 s if not cancelled
        facts["cancel_url"] = url
        outcome: list = []
        with anyio.move_on_after(20) as scope:
            async with anyio.create_task_group() as tg:

                async def cancel_once_streaming() -> None:
                    def started() -> bool:
                        st = web.get("cancel")
                        return st is not None and st["started"].is_set()

                    await wait_until(started, 15, "the download to start")
                    await anyio.sleep(0.5)
                    scope.cancel()

                tg.start_soon(cancel_once_streaming)
                outcome.append(await client.call_tool("image_download", {"url": url, "path": str(dest)}))
                tg.cancel_scope.cancel()
        check(not outcome, f"the slow download finished instead of being cancelled: {outcome}")
        check(scope.cancelled_caught, "the download call was not cancelled")
        r = await client.call_tool("list_vms", {})  # the server still answers after the cancel
        check(not r.is_error and r.structured_content is not None, f"list_vms after cancel: {r}")
        st = web.get("cancel")
        await wait_until(lambda: st["ended"].is_set(), 15, "the server to drop the cancelled download's connection")
        check(st["aborted"], "the server kept downloading to the end after the request was cancelled")
        with anyio.move_on_after(10):
            while any(dl_dir.iterdir()):
                await anyio.sleep(0.05)
        check(not dest.exists(), f"a partial file was left at {dest}")
        left = sorted(p.name for p in dl_dir.iterdir())
        check(not left, f"the cancelled download left files beside {dest.name} after 10 s: {left}")
        print("cancelled download: server stopped, no file left, server still answers")

        # 8. progress notifications on a slow download that completes
        size = 512 << 10
        dest = tmp / "small.img"
        seen: list[tuple[float, float | None, str | None]] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            seen.append((progress, total, message))

        sha = hashlib.sha256(payload(size)).hexdigest()
        url = web.url("progress", size=size, chunk=16 << 10, delay=0.08)  # ~2.6 s: four notifications 600 ms apart
        r = await client.call_tool(
            "image_download", {"url": url, "path": str(dest), "sha256": sha}, progress_callback=on_progress
        )
        check(not r.is_error, f"image_download failed: {r.content}")
        sc = r.structured_content or {}
        ok = sc.get("bytes") == size and sc.get("sha256") == sha and sc.get("verified") is True
        check(ok, f"image_download result: {sc}")
        check(dest.is_file() and hashlib.sha256(dest.read_bytes()).hexdigest() == sha, f"{dest} is not the served file")
        check(len(seen) >= 3, f"expected several progress notifications over ~2.6 s, got {seen}")
        values = [p for p, _, _ in seen]
        check(values == sorted(values) and len(set(values)) == len(values), f"progress not increasing: {values}")
        check(all(t == size for _, t, _ in seen), f"progress total is not {size}: {seen}")
        facts["progress_size"] = size
        print(f"progress: {len(seen)} notifications, last {seen[-1]}")
    return facts


VM = "sdkbox"
READY = "mcqemu-test-guest: ready"
RESOURCE_NOT_FOUND = {"auto": INVALID_PARAMS, "legacy": -32002}  # 2026-07-28 moved it to -32602


async def run_resources(binary: str, mode: str, tmp: Path, transcript: Path) -> dict:
    """The resources journey on one test guest; returns facts for the transcript checks."""
    env = {}
    for key in ("MCQEMU_STATE_DIR", "MCQEMU_RUNTIME_DIR"):
        env[key] = os.environ.get(key) or str(tmp / key.lower())
        Path(env[key]).mkdir(parents=True, exist_ok=True)
    if os.environ.get("MCQEMU_ROOTS"):  # the test guest's folder must be inside the roots
        env["MCQEMU_ROOTS"] = os.environ["MCQEMU_ROOTS"]
    guest = {k: os.environ.get(f"MCQEMU_TEST_{k.upper()}") for k in ("kernel", "initrd", "append")}
    check(all(guest.values()), f"set MCQEMU_TEST_KERNEL, _INITRD and _APPEND (the test guest): {guest}")
    server = StdioServerParameters(
        command=sys.executable, args=[str(HERE / "record.py"), str(transcript), "--", binary], env=env
    )
    serial, screen = f"mcqemu://vm/{VM}/serial", f"mcqemu://vm/{VM}/screen"
    metrics = f"mcqemu://vm/{VM}/metrics"
    changes: list = []  # legacy: notifications/resources/list_changed

    async def on_message(m) -> None:
        if isinstance(m, ResourceListChangedNotification):
            changes.append(m)

    async def next_change(sub, seen: int, what: str) -> None:
        """The change `what` made: the listen stream's next event (auto), or a notification
        beyond the `seen` ones (legacy; the server sends it before the call's answer)."""
        if sub is not None:
            with anyio.fail_after(REQUEST_S):
                event = await sub.__anext__()
            check(type(event).__name__ == "ResourcesListChanged", f"{what}: listen gave {event!r}")
        else:
            await wait_until(lambda: len(changes) > seen, REQUEST_S, f"list_changed after {what}")

    async with Client(server, mode=mode, read_timeout_seconds=REQUEST_S, message_handler=on_message) as client:
        want = EXPECTED_VERSION[mode]
        check(client.protocol_version == want, f"mode={mode} negotiated {client.protocol_version!r}, expected {want!r}")
        caps = client.server_capabilities.resources
        check(caps is not None and caps.list_changed is True, f"resources capability: {caps!r}")
        t = await client.list_resource_templates()
        got = [str(x.uri_template) for x in t.resource_templates]
        want_templates = [f"mcqemu://vm/{{name}}/{k}" for k in ("serial", "screen", "metrics")]
        check(got == want_templates, f"resource templates: {got}")
        r = await client.list_resources()
        check(vm_resources(r) == [], f"a fresh state folder lists no VM resource: {r.resources}")

        async def journey(sub) -> None:
            seen = len(changes)
            launched = await client.call_tool(
                "launch_vm",
                {"name": VM, **guest, "memory_mb": 128, "cpus": 1, "no_net": True},
            )
            check(not launched.is_error, f"launch_vm failed: {launched.content}")
            await next_change(sub, seen, "launch_vm")
            r = await client.list_resources()
            got = [(str(x.uri), x.mime_type) for x in vm_resources(r)]
            want = [(serial, "text/plain"), (screen, "image/png"), (metrics, "application/json")]
            check(got == want, f"resources/list after the launch: {got}")
            c = (await client.read_resource(metrics)).contents
            m = json.loads(c[0].text)
            check(m["status"] == "running" and m["metrics"]["rss_bytes"] > 0, f"metrics: {m}")
            # The console as the guest boots (ttlMs 0: each read reaches the server).
            text = ""
            with anyio.move_on_after(60):
                while READY not in text:
                    c = (await client.read_resource(serial)).contents
                    check(len(c) == 1 and str(c[0].uri) == serial, f"serial contents: {c}")
                    check(c[0].mime_type == "text/plain", f"serial mime type: {c[0].mime_type}")
                    text = c[0].text
                    if READY not in text:
                        await anyio.sleep(0.5)
            check(READY in text, f"the guest never said {READY!r} on its console: {text[-500:]!r}")
            c = (await client.read_resource(screen)).contents
            check(len(c) == 1 and c[0].mime_type == "image/png", f"screen contents: {c}")
            png = base64.b64decode(c[0].blob, validate=True)
            check(png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR", "the screen is not a PNG")
            w, h = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
            check(w > 0 and h > 0, f"screen of {w}x{h}")
            print(f"resources: console {len(text)} characters, screen {w}x{h} PNG of {len(png)} bytes")
            # Gone: stopped and forgotten.
            r = await client.call_tool("stop_vm", {"name": VM, "force": True})
            check(not r.is_error, f"stop_vm failed: {r.content}")
            seen = len(changes)
            r = await client.call_tool("forget_vm", {"name": VM})
            check(not r.is_error, f"forget_vm failed: {r.content}")
            await next_change(sub, seen, "forget_vm")
            r = await client.list_resources()
            check(vm_resources(r) == [], f"resources/list after forget_vm: {r.resources}")
            for uri in (serial, screen):
                try:
                    got = await client.read_resource(uri)
                except MCPError as e:
                    code = RESOURCE_NOT_FOUND[mode]
                    check(e.code == code, f"reading {uri} of a forgotten VM: code {e.code}, expected {code} ({e})")
                    check(f'"{VM}"' in str(e) and "list_vms" in str(e), f"the error does not say what to do: {e}")
                else:
                    raise Failure(f"reading {uri} of a forgotten VM returned {got}")
            print(f"resources: a forgotten VM's resources are gone (error {RESOURCE_NOT_FOUND[mode]})")

        if mode == "auto":
            async with client.listen(resources_list_changed=True, tools_list_changed=True) as sub:
                honored = sub.honored
                check(honored.resources_list_changed is True, f"listen honoured {honored!r}")
                check(not honored.tools_list_changed, f"tools never change, yet listen honoured {honored!r}")
                await journey(sub)
        else:
            await journey(None)
            check(len(changes) == 2, f"expected 2 list_changed notifications, got {changes}")
    return {"resources": True}


def check_transcript(transcript: Path, mode: str, facts: dict) -> None:
    if facts.get("resources"):
        entries = [json.loads(line) for line in transcript.read_text().splitlines() if line.strip()]
        s2c = [e["msg"] for e in entries if e["dir"] == "s2c" and isinstance(e["msg"], dict)]
        changed = [m for m in s2c if m.get("method") == "notifications/resources/list_changed"]
        check(len(changed) == 2, f"expected 2 list_changed notifications on the wire, got {changed}")
        if mode == "auto":
            acks = [m for m in s2c if m.get("method") == "notifications/subscriptions/acknowledged"]
            check(len(acks) == 1, f"expected one listen acknowledgment, got {acks}")
            sub_id = acks[0]["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"]
            for m in changed:
                got = m["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"]
                check(got == sub_id, f"a list_changed of another stream: {m}")
        era = EXPECTED_VERSION[mode]
        check(validate(transcript, era), f"validate_transcript.py found the transcript invalid for {era}")
        return
    entries = [json.loads(line) for line in transcript.read_text().splitlines() if line.strip()]
    c2s = [e["msg"] for e in entries if e["dir"] == "c2s" and isinstance(e["msg"], dict)]
    calls = [
        m["id"]
        for m in c2s
        if m.get("method") == "tools/call" and (m["params"].get("arguments") or {}).get("url") == facts["cancel_url"]
    ]
    check(len(calls) == 1, f"expected one recorded tools/call for the cancelled download, got {calls}")
    cancels = [m for m in c2s if m.get("method") == "notifications/cancelled"]
    check(
        any(m["params"].get("requestId") == calls[0] for m in cancels),
        f"the SDK sent no notifications/cancelled for request {calls[0]!r} (cancellations sent: {cancels})",
    )
    s2c = [e["msg"] for e in entries if e["dir"] == "s2c" and isinstance(e["msg"], dict)]
    progress = [m for m in s2c if m.get("method") == "notifications/progress"]
    # A final update inside the server's 600 ms rate gap is dropped, never waited for.
    check(
        progress and 0 < progress[-1]["params"]["progress"] <= facts["progress_size"],
        f"the server's progress is missing or past the full size: {progress[-1:]}",
    )
    era = EXPECTED_VERSION[mode]
    check(validate(transcript, era), f"validate_transcript.py found the transcript invalid for {era}")


def validate(transcript: Path, era: str) -> bool:
    proc = subprocess.run(
        [sys.executable, str(HERE / "validate_transcript.py"), str(transcript), era],
        capture_output=True,
        text=True,
        timeout=60,
    )
    sys.stdout.write(proc.stdout + proc.stderr)
    return proc.returncode == 0


def dump_transcript(transcript: Path, width: int = 600) -> None:
    if not transcript.exists():
        return
    print(f"--- transcript {transcript} (lines cut at {width} chars) ---")
    for line in transcript.read_text().splitlines():
        print(line if len(line) <= width else line[:width] + " ...")


def main() -> int:
    args = sys.argv[1:]
    if len(args) not in (2, 3) or args[1] not in EXPECTED_VERSION or args[2:] not in ([], ["resources"]):
        print("usage: python_client.py BINARY {auto,legacy} [resources]", file=sys.stderr)
        return 2
    binary, mode, journey = args[0], args[1], (run_resources if args[2:] else run)
    tmp = Path(tempfile.mkdtemp(prefix=f"mcqemu-py-{mode}-"))
    transcript = tmp / "transcript.jsonl"
    try:

        async def bounded() -> dict:
            with anyio.fail_after(WHOLE_RUN_S):
                return await journey(binary, mode, tmp, transcript)

        facts = anyio.run(bounded)
        check_transcript(transcript, mode, facts)
    except BaseException as e:  # noqa: BLE001 - report anything, including SDK errors and timeouts
        while isinstance(e, BaseExceptionGroup) and len(e.exceptions) == 1:
            e = e.exceptions[0]  # a failure inside a task group
        dump_transcript(transcript)
        if transcript.exists():
            print("--- what the validator says about the transcript so far ---")
            validate(transcript, EXPECTED_VERSION[mode])
        kind = "FAILED" if isinstance(e, Failure) else f"FAILED with {type(e).__name__}"
        print(f"python_client mode={mode} {kind}: {e}")
        if not isinstance(e, Failure):
            import traceback

            traceback.print_exc(file=sys.stdout)
        print(f"(files kept in {tmp})")
        return 1
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"python_client mode={mode}{' resources' if args[2:] else ''}: all checks passed")
    return 0


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)
    sys.exit(main())
