// Drive mcqemu with the official TypeScript MCP SDK over stdio (its default
// handshake, protocol 2025-11-25).
//
//     node ts_client.mjs BINARY [resources]
//
// Without `resources`: tools, output-schema validation, progress. With
// `resources`: a VM's serial console log and screen as MCP resources (list,
// templates, read), notifications/resources/list_changed as VMs come and go,
// and a VM that is gone as a clear error (-32002). That journey boots the test
// guest named by MCQEMU_TEST_KERNEL, MCQEMU_TEST_INITRD and MCQEMU_TEST_APPEND,
// in MCQEMU_STATE_DIR and MCQEMU_RUNTIME_DIR when set, with MCQEMU_ROOTS passed
// on (the guest's folder must be inside the roots).
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
const {
  McpError,
  ResourceListChangedNotificationSchema,
  ResourceUpdatedNotificationSchema,
} = require('@modelcontextprotocol/sdk/types.js');
const SDK_VERSION = JSON.parse(
  fs.readFileSync(path.join(NODE_DIR, 'node_modules/@modelcontextprotocol/sdk/package.json'), 'utf8'),
).version;

class Failure extends Error {}
// The VMs' resources listed (the live view, ui://mcqemu/view, is always there too).
function vmResources(r) {
  return r.resources.filter((x) => !x.uri.startsWith('ui://'));
}

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
    const url = `http://127.0.0.1:${web.address().port}/slow?size=${size}&chunk=${16 << 10}&delay=80`; // ~2.6 s: four notifications 600 ms apart
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
    check(seen.length >= 3, `expected several progress notifications over ~2.6 s, got ${JSON.stringify(seen)}`);
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
  // A final update inside the server's 600 ms rate gap is dropped, never waited for.
  check(last?.progress > 0 && last.progress <= 512 << 10, `the server's progress is missing or past the full size: ${JSON.stringify(last)}`);
  validateTranscript(transcript);
}

function validateTranscript(transcript) {
  const v = spawnSync(PYTHON, [path.join(HERE, 'validate_transcript.py'), transcript, ERA], {
    encoding: 'utf8',
    timeout: 60_000,
  });
  process.stdout.write((v.stdout || '') + (v.stderr || ''));
  const how = v.error || `status ${v.status}`;
  check(v.status === 0, `validate_transcript.py found the transcript invalid for ${ERA} (${how})`);
}

async function waitUntil(cond, ms, what) {
  const deadline = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > deadline) throw new Failure(`timed out after ${ms / 1000} s waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

const VM = 'tsbox';
const READY = 'mcqemu-test-guest: ready';

// The resources journey on one test guest.
async function runResources(binary, tmp, transcript) {
  const env = {};
  for (const key of ['MCQEMU_STATE_DIR', 'MCQEMU_RUNTIME_DIR']) {
    env[key] = process.env[key] || path.join(tmp, key.toLowerCase());
    fs.mkdirSync(env[key], { recursive: true });
  }
  if (process.env.MCQEMU_ROOTS) env.MCQEMU_ROOTS = process.env.MCQEMU_ROOTS;
  const guest = {
    kernel: process.env.MCQEMU_TEST_KERNEL,
    initrd: process.env.MCQEMU_TEST_INITRD,
    append: process.env.MCQEMU_TEST_APPEND,
  };
  check(guest.kernel && guest.initrd && guest.append, 'set MCQEMU_TEST_KERNEL, _INITRD and _APPEND (the test guest)');
  const transport = new StdioClientTransport({
    command: PYTHON,
    args: [path.join(HERE, 'record.py'), transcript, '--', binary],
    env,
    stderr: 'inherit',
  });
  const client = new Client({ name: 'mcqemu-sdk-test', version: '0.0.0' });
  const changes = [];
  client.setNotificationHandler(ResourceListChangedNotificationSchema, (n) => changes.push(n));
  const serial = `mcqemu://vm/${VM}/serial`;
  const screen = `mcqemu://vm/${VM}/screen`;
  const metrics = `mcqemu://vm/${VM}/metrics`;
  const updates = [];
  client.setNotificationHandler(ResourceUpdatedNotificationSchema, (n) => updates.push(n));
  const opts = { timeout: REQUEST_MS };
  let launched = false;
  try {
    await client.connect(transport, opts);
    const caps = client.getServerCapabilities();
    check(caps?.resources?.listChanged === true, `resources capability: ${JSON.stringify(caps)}`);
    const t = await client.listResourceTemplates(undefined, opts);
    const templates = t.resourceTemplates.map((x) => x.uriTemplate);
    check(
      JSON.stringify(templates) ===
        JSON.stringify(['mcqemu://vm/{name}/serial', 'mcqemu://vm/{name}/screen', 'mcqemu://vm/{name}/metrics']),
      `resource templates: ${JSON.stringify(templates)}`,
    );
    let r = await client.listResources(undefined, opts);
    check(vmResources(r).length === 0, `a fresh state folder lists no VM resource: ${JSON.stringify(r)}`);

    let seen = changes.length;
    let c = await client.callTool(
      { name: 'launch_vm', arguments: { name: VM, ...guest, memory_mb: 128, cpus: 1, no_net: true } },
      undefined,
      { timeout: 120_000 },
    );
    launched = !c.isError;
    check(!c.isError, `launch_vm failed: ${JSON.stringify(c.content)}`);
    await waitUntil(() => changes.length > seen, REQUEST_MS, 'list_changed after launch_vm');
    r = await client.listResources(undefined, opts);
    const listed = vmResources(r).map((x) => [x.uri, x.mimeType]);
    check(
      JSON.stringify(listed) ===
        JSON.stringify([[serial, 'text/plain'], [screen, 'image/png'], [metrics, 'application/json']]),
      `resources/list after the launch: ${JSON.stringify(listed)}`,
    );
    // The metrics, read and followed: resources/subscribe, then its updates.
    const m = JSON.parse((await client.readResource({ uri: metrics }, opts)).contents[0].text);
    check(m.status === 'running' && m.metrics.rss_bytes > 0, `metrics: ${JSON.stringify(m)}`);
    check(caps?.resources?.subscribe === true, `no subscribe capability: ${JSON.stringify(caps)}`);
    await client.subscribeResource({ uri: metrics }, opts);
    await waitUntil(() => updates.some((u) => u.params.uri === metrics), REQUEST_MS, 'resources/updated for the metrics');
    await client.unsubscribeResource({ uri: metrics }, opts);
    console.log(`resources: metrics followed (${updates.length} update(s))`);

    let text = '';
    const deadline = Date.now() + 60_000;
    while (!text.includes(READY)) {
      check(Date.now() < deadline, `the guest never said ${READY} on its console: ${JSON.stringify(text)}`);
      const got = await client.readResource({ uri: serial }, opts);
      check(got.contents.length === 1 && got.contents[0].uri === serial, `serial contents: ${JSON.stringify(got)}`);
      check(got.contents[0].mimeType === 'text/plain', `serial mime type: ${got.contents[0].mimeType}`);
      text = got.contents[0].text;
      if (!text.includes(READY)) await new Promise((res) => setTimeout(res, 500));
    }
    const shot = await client.readResource({ uri: screen }, opts);
    check(shot.contents.length === 1 && shot.contents[0].mimeType === 'image/png', `screen: ${JSON.stringify(shot).slice(0, 300)}`);
    const png = Buffer.from(shot.contents[0].blob, 'base64');
    check(png.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])), 'the screen is not a PNG');
    const [w, h] = [png.readUInt32BE(16), png.readUInt32BE(20)];
    check(w > 0 && h > 0, `screen of ${w}x${h}`);
    console.log(`resources: console ${text.length} characters, screen ${w}x${h} PNG of ${png.length} bytes`);

    c = await client.callTool({ name: 'stop_vm', arguments: { name: VM, force: true } }, undefined, opts);
    check(!c.isError, `stop_vm failed: ${JSON.stringify(c.content)}`);
    seen = changes.length;
    c = await client.callTool({ name: 'forget_vm', arguments: { name: VM } }, undefined, opts);
    check(!c.isError, `forget_vm failed: ${JSON.stringify(c.content)}`);
    launched = false;
    await waitUntil(() => changes.length > seen, REQUEST_MS, 'list_changed after forget_vm');
    r = await client.listResources(undefined, opts);
    check(vmResources(r).length === 0, `resources/list after forget_vm: ${JSON.stringify(r)}`);
    for (const uri of [serial, screen]) {
      let got;
      try {
        got = await client.readResource({ uri }, opts);
      } catch (e) {
        check(e instanceof McpError, `reading ${uri} of a forgotten VM threw ${e}`);
        check(e.code === -32002, `reading ${uri} of a forgotten VM: code ${e.code}, expected -32002 (${e.message})`);
        check(e.message.includes(`"${VM}"`) && e.message.includes('list_vms'), `the error does not say what to do: ${e.message}`);
        continue;
      }
      throw new Failure(`reading ${uri} of a forgotten VM returned ${JSON.stringify(got)}`);
    }
    check(changes.length === 2, `expected 2 list_changed notifications, got ${JSON.stringify(changes)}`);
    console.log('resources: a forgotten VM\'s resources are gone (error -32002)');
  } finally {
    if (launched) {
      await client.callTool({ name: 'stop_vm', arguments: { name: VM, force: true } }, undefined, opts).catch(() => {});
    }
    await client.close();
  }
  const lines = fs.readFileSync(transcript, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
  const wire = lines.filter((e) => e.dir === 's2c' && e.msg?.method === 'notifications/resources/list_changed');
  check(wire.length === 2, `expected 2 list_changed notifications on the wire, got ${wire.length}`);
  validateTranscript(transcript);
}

async function main() {
  const args = process.argv.slice(2);
  if (!(args.length === 1 || (args.length === 2 && args[1] === 'resources'))) {
    console.error('usage: node ts_client.mjs BINARY [resources]');
    return 2;
  }
  const journey = args[1] === 'resources' ? runResources : run;
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'mcqemu-ts-'));
  const transcript = path.join(tmp, 'transcript.jsonl');
  let timer;
  const deadline = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Failure(`the run took over ${WHOLE_RUN_MS / 1000} s`)), WHOLE_RUN_MS);
  });
  try {
    await Promise.race([journey(args[0], tmp, transcript), deadline]);
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
  console.log(`ts_client${args[1] ? ' ' + args[1] : ''}: all checks passed`);
  return 0;
}

process.exit(await main());
