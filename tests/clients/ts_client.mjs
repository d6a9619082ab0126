// Drive mcqemu with the official TypeScript MCP SDK over stdio (its default
// handshake, protocol 2025-11-25).
//
//     node ts_client.mjs BINARY
//
// Environment: MCQEMU_SDK_NODE_DIR (holds node_modules/@modelcontextprotocol/sdk)
// and MCQEMU_SDK_PYTHON (a python with mcp_types, for record.py and
// validate_transcript.py); both default to the copies under target/sdk-clients.
// Exits 0 when every check passed, 1 with a clear message otherwise.

import { execFileSync, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const SDK_ROOT = path.resolve(HERE, '../../target/sdk-clients');
const NODE_DIR = process.env.MCQEMU_SDK_NODE_DIR || path.join(SDK_ROOT, 'node');
const PYTHON = process.env.MCQEMU_SDK_PYTHON || path.join(SDK_ROOT, 'venv/bin/python');
const ERA = '2025-11-25';
const WHOLE_RUN_MS = 100_000;
const REQUEST_MS = 30_000;

// Resolve the SDK from NODE_DIR (ESM imports ignore NODE_PATH), through its exports map.
const require = createRequire(path.join(NODE_DIR, 'package.json'));
const { Client } = require('@modelcontextprotocol/sdk/client/index.js');
const { StdioClientTransport } = require('@modelcontextprotocol/sdk/client/stdio.js');
const SDK_VERSION = JSON.parse(
  fs.readFileSync(path.join(NODE_DIR, 'node_modules/@modelcontextprotocol/sdk/package.json'), 'utf8'),
).version;

class Failure extends Error {}
function check(cond, what) {
  if (!cond) throw new Failure(what);
}

function payload(size) {
  const b = Buffer.alloc(size);
  for (let i = 0; i < size; i++) b[i] = i % 251;
  return b;
}

// An HTTP server that trickles SIZE bytes in CHUNK pieces every DELAY ms.
function trickleServer() {
  const server = http.createServer((req, res) => {
    const q = new URL(req.url, 'http://x').searchParams;
    const size = Number(q.get('size'));
    const chunk = Number(q.get('chunk'));
    const delay = Number(q.get('delay'));
    const body = payload(size);
    res.writeHead(200, { 'Content-Type': 'application/octet-stream', 'Content-Length': size });
    let off = 0;
    const timer = setInterval(() => {
      if (off >= size || res.destroyed) {
        clearInterval(timer);
        res.end();
        return;
      }
      res.write(body.subarray(off, off + chunk));
      off += chunk;
    }, delay);
    res.on('close', () => clearInterval(timer));
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}

function dumpTranscript(file, width = 600) {
  if (!fs.existsSync(file)) return;
  console.log(`--- transcript ${file} (lines cut at ${width} chars) ---`);
  for (const line of fs.readFileSync(file, 'utf8').split('\n')) {
    if (line) console.log(line.length <= width ? line : line.slice(0, width) + ' ...');
  }
}

async function run(binary, tmp, transcript) {
  for (const d of ['state', 'run']) fs.mkdirSync(path.join(tmp, d));
  const transport = new StdioClientTransport({
    command: PYTHON,
    args: [path.join(HERE, 'record.py'), transcript, '--', binary],
    env: { MCQEMU_STATE_DIR: path.join(tmp, 'state'), MCQEMU_RUNTIME_DIR: path.join(tmp, 'run') },
    stderr: 'inherit',
  });
  const client = new Client({ name: 'mcqemu-sdk-test', version: '0.0.0' });
  const web = await trickleServer();
  try {
    await client.connect(transport, { timeout: REQUEST_MS });
    const info = client.getServerVersion();
    check(info && info.name === 'mcqemu', `initialize serverInfo: ${JSON.stringify(info)}`);
    console.log(`connected (TS SDK ${SDK_VERSION}): server ${info.name} ${info.version}`);

    // tools, following pagination; listTools() caches only the last page's
    // output validators, so install them for the whole listing.
    const tools = [];
    let cursor;
    for (let page = 0; ; page++) {
      check(page < 50, 'tools/list still had a nextCursor after 50 pages');
      const r = await client.listTools(cursor ? { cursor } : undefined, { timeout: REQUEST_MS });
      tools.push(...r.tools);
      cursor = r.nextCursor;
      if (!cursor) break;
    }
    client.cacheToolMetadata(tools);
    const names = new Set(tools.map((t) => t.name));
    for (const want of ['list_vms', 'image_info', 'image_download']) {
      check(names.has(want), `tools/list lacks ${want}: ${[...names].join(', ')}`);
    }
    console.log(`tools/list: ${tools.length} tools`);

    // callTool validates structuredContent against the outputSchema only when it
    // holds a validator for the tool: make sure it does, and that it bites.
    for (const name of ['list_vms', 'image_info', 'image_download']) {
      const validate = client.getToolOutputValidator(name);
      check(typeof validate === 'function', `the TS client holds no output validator for ${name}`);
      check(!validate({ bogus: true }).valid, `the ${name} output validator accepts anything`);
    }

    let r = await client.callTool({ name: 'list_vms', arguments: {} }, undefined, { timeout: REQUEST_MS });
    check(!r.isError, `list_vms failed: ${JSON.stringify(r.content)}`);
    check(Array.isArray(r.structuredContent?.vms), `list_vms structuredContent: ${JSON.stringify(r)}`);

    const img = path.join(tmp, 'x.qcow2');
    execFileSync('qemu-img', ['create', '-f', 'qcow2', img, '16M'], { timeout: 30_000, stdio: 'pipe' });
    r = await client.callTool({ name: 'image_info', arguments: { path: img } }, undefined, { timeout: REQUEST_MS });
    check(!r.isError, `image_info failed: ${JSON.stringify(r.content)}`);
    const sc = r.structuredContent ?? {};
    check(sc.format === 'qcow2' && sc.virtual_size === 16 << 20, `image_info: ${JSON.stringify(sc)}`);

    // progress on a slow download
    const size = 512 << 10;
    const url = `http://127.0.0.1:${web.address().port}/slow?size=${size}&chunk=${16 << 10}&delay=50`;
    const dest = path.join(tmp, 'slow.img');
    const seen = [];
    r = await client.callTool({ name: 'image_download', arguments: { url, path: dest } }, undefined, {
      timeout: REQUEST_MS,
      onprogress: (p) => seen.push(p),
    });
    check(!r.isError, `image_download failed: ${JSON.stringify(r.content)}`);
    const sha = createHash('sha256').update(payload(size)).digest('hex');
    const got = r.structuredContent ?? {};
    check(got.bytes === size && got.sha256 === sha, `image_download result: ${JSON.stringify(got)}`);
    check(fs.statSync(dest).size === size, `${dest} does not hold the ${size} served bytes`);
    check(seen.length >= 3, `expected several progress notifications over ~1.6 s, got ${JSON.stringify(seen)}`);
    const values = seen.map((p) => p.progress);
    check(values.every((v, i) => i === 0 || v > values[i - 1]), `progress not increasing: ${values}`);
    check(seen.every((p) => p.total === size), `progress total is not ${size}: ${JSON.stringify(seen)}`);
    // (the SDK hands notifications to a microtask but settles a response at once,
    // so the server's final "done" progress may reach onprogress too late; the
    // transcript check below looks at what the server sent)
    console.log(`progress: ${seen.length} notifications, last ${JSON.stringify(seen.at(-1))}`);
  } finally {
    await client.close();
    web.close();
  }

  const lines = fs.readFileSync(transcript, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
  const init = lines.find((e) => e.dir === 's2c' && e.msg?.result?.protocolVersion);
  check(init?.msg.result.protocolVersion === ERA, `negotiated ${init?.msg.result.protocolVersion}, expected ${ERA}`);
  const progress = lines.filter((e) => e.dir === 's2c' && e.msg?.method === 'notifications/progress');
  const last = progress.at(-1)?.msg.params;
  check(last?.progress === 512 << 10, `the server's last progress is not the full size: ${JSON.stringify(last)}`);
  const v = spawnSync(PYTHON, [path.join(HERE, 'validate_transcript.py'), transcript, ERA], {
    encoding: 'utf8',
    timeout: 60_000,
  });
  process.stdout.write((v.stdout || '') + (v.stderr || ''));
  const how = v.error || `status ${v.status}`;
  check(v.status === 0, `validate_transcript.py found the transcript invalid for ${ERA} (${how})`);
}

async function main() {
  if (process.argv.length !== 3) {
    console.error('usage: node ts_client.mjs BINARY');
    return 2;
  }
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'mcqemu-ts-'));
  const transcript = path.join(tmp, 'transcript.jsonl');
  let timer;
  const deadline = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Failure(`the run took over ${WHOLE_RUN_MS / 1000} s`)), WHOLE_RUN_MS);
  });
  try {
    await Promise.race([run(process.argv[2], tmp, transcript), deadline]);
  } catch (e) {
    dumpTranscript(transcript);
    console.log(`ts_client FAILED${e instanceof Failure ? '' : ` with ${e?.name}`}: ${e?.message ?? e}`);
    if (!(e instanceof Failure)) console.log(e?.stack);
    console.log(`(files kept in ${tmp})`);
    return 1;
  } finally {
    clearTimeout(timer);
  }
  fs.rmSync(tmp, { recursive: true, force: true });
  console.log('ts_client: all checks passed');
  return 0;
}

process.exit(await main());
