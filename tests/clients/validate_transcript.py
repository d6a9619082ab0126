#!/usr/bin/env python3
"""Validate a record.py transcript against one MCP era's pydantic wire models.

    validate_transcript.py TRANSCRIPT ERA        (ERA: 2026-07-28 or 2025-11-25)

Every server->client message must parse as that era's model: a response is
matched to its request by id and checked with the per-method result model from
mcp_types.methods.SERVER_RESULTS (errors with the era's JSON-RPC error
response); notifications with SERVER_NOTIFICATIONS. Also checked: ids answer a
real request exactly once, every request not cancelled gets an answer,
progress notifications name a live request's progressToken, and (2026-07-28)
every result carries resultType and _meta["io.modelcontextprotocol/serverInfo"]
naming "mcqemu". Exit 0 when clean, 1 with every problem printed otherwise.
"""

import json
import sys

import mcp_types._v2025_11_25 as v2025
import mcp_types._v2026_07_28 as v2026
from mcp_types.methods import SERVER_NOTIFICATIONS, SERVER_REQUESTS, validate_server_result
from pydantic import ValidationError

ERAS = {"2025-11-25": v2025, "2026-07-28": v2026}
SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"
SERVER_NAME = "mcqemu"


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[2] not in ERAS:
        print(f"usage: validate_transcript.py TRANSCRIPT {{{','.join(ERAS)}}}", file=sys.stderr)
        return 2
    path, era = sys.argv[1], sys.argv[2]
    models = ERAS[era]
    modern = era == "2026-07-28"

    problems: list[str] = []

    def fail(what: str, msg: object, err: object = None) -> None:
        text = f"{what}\n    message: {json.dumps(msg)}"
        if err is not None:
            text += "\n    " + str(err).replace("\n", "\n    ")
        problems.append(text)

    with open(path, encoding="utf-8") as f:
        entries = [json.loads(line) for line in f if line.strip()]

    requests: dict[object, dict] = {}  # client request id -> request
    answered: set = set()
    cancelled: set = set()
    live_tokens: dict[object, object] = {}  # progressToken -> request id, while unanswered
    counts = {"results": 0, "errors": 0, "notifications": 0}

    for entry in entries:
        msg = entry.get("msg")
        if entry["dir"] == "c2s":
            if not isinstance(msg, dict):
                continue
            if "method" in msg and "id" in msg:
                requests[msg["id"]] = msg
                token = ((msg.get("params") or {}).get("_meta") or {}).get("progressToken")
                if token is not None:
                    live_tokens[token] = msg["id"]
            elif msg.get("method") == "notifications/cancelled":
                cancelled.add((msg.get("params") or {}).get("requestId"))
            continue

        if not isinstance(msg, dict):
            fail("server wrote a line that is not a JSON object", entry.get("raw", msg))
            continue

        if "method" in msg and "id" in msg:  # a server->client request
            model = SERVER_REQUESTS.get((msg["method"], era))
            if model is None:
                fail(f"server sent request {msg['method']!r}, which {era} does not allow", msg)
            else:
                try:
                    model.model_validate(msg, by_name=False)
                except ValidationError as e:
                    fail(f"server request {msg['method']!r} does not match {era}", msg, e)
            continue

        if "method" in msg:  # a notification
            counts["notifications"] += 1
            model = SERVER_NOTIFICATIONS.get((msg["method"], era))
            if model is None:
                fail(f"notification {msg['method']!r} is not a {era} server notification", msg)
                continue
            try:
                model.model_validate(msg, by_name=False)
            except ValidationError as e:
                fail(f"notification {msg['method']!r} does not match {era}", msg, e)
                continue
            if msg["method"] == "notifications/progress":
                token = msg["params"]["progressToken"]
                if token not in live_tokens:
                    fail("progress notification for a token of no in-flight request", msg)
            continue

        rid = msg.get("id")
        request = requests.get(rid)
        if request is None:
            fail(f"response id {rid!r} answers no request the client sent", msg)
            continue
        if rid in answered:
            fail(f"second response to request id {rid!r}", msg)
            continue
        answered.add(rid)
        for token, owner in list(live_tokens.items()):
            if owner == rid:
                del live_tokens[token]
        method = request["method"]

        if "error" in msg:
            counts["errors"] += 1
            try:
                models.JSONRPCErrorResponse.model_validate(msg, by_name=False)
            except ValidationError as e:
                fail(f"error response to {method!r} does not match {era}", msg, e)
            if "result" in msg:
                fail(f"response to {method!r} has both result and error", msg)
            continue

        counts["results"] += 1
        try:
            models.JSONRPCResultResponse.model_validate(msg, by_name=False)
            validate_server_result(method, era, msg["result"])
        except KeyError:
            fail(f"no {era} result model for method {method!r} (not allowed in this era?)", msg)
            continue
        except ValidationError as e:
            fail(f"result of {method!r} does not match {era}", msg, e)
            continue
        if modern:
            result = msg["result"]
            if "resultType" not in result:
                fail(f"result of {method!r} has no resultType", msg)
            info = (result.get("_meta") or {}).get(SERVER_INFO_KEY)
            if info is None:
                fail(f'result of {method!r} has no _meta["{SERVER_INFO_KEY}"]', msg)
            else:
                try:
                    impl = models.Implementation.model_validate(info, by_name=False)
                    if impl.name != SERVER_NAME:
                        fail(f"serverInfo names {impl.name!r}, not {SERVER_NAME!r}", msg)
                except ValidationError as e:
                    fail(f"_meta serverInfo of {method!r} is not an Implementation", msg, e)

    for rid, request in requests.items():
        if rid not in answered and rid not in cancelled:
            fail(f"request {request['method']!r} (id {rid!r}) was never answered", request)
    late = sorted(str(r) for r in cancelled & answered)
    if late:
        print(f"note: cancelled request ids {', '.join(late)} were answered anyway (allowed: SHOULD NOT)")

    summary = (
        f"{path}: {len(requests)} requests, {counts['results']} results, {counts['errors']} errors, "
        f"{counts['notifications']} notifications checked against {era}"
    )
    if not requests:
        problems.append("transcript holds no client request at all")
    if problems:
        print(f"TRANSCRIPT INVALID ({len(problems)} problem(s)) - {summary}")
        for p in problems:
            print(" - " + p)
        return 1
    print(f"transcript ok - {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
