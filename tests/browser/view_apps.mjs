// The live view as an MCP App in headless Chromium, hosted by the official host bridge:
// the real mcqemu over stdio through the official TypeScript SDK client, the page read from
// resources/read, a sandboxed iframe. Takes over, types a line, hands back (the model is
// told through ui/update-model-context), takes over again and tears the view down (the hold
// must go with it). Prints one JSON line.
//
//   node view_apps.mjs MCQEMU VM TEXT   (environment: the server's MCQEMU_* variables)
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { chromium } from "playwright-core";
import * as esbuild from "esbuild";
import { fileURLToPath } from "node:url";
import path from "node:path";

const [bin, vm, text] = process.argv.slice(2);
const here = path.dirname(fileURLToPath(import.meta.url));
const out = { console_errors: [], elsewhere: [], calls: {}, steps: {} };
const callTimes = [];

const client = new Client({ name: "mcqemu-apps-test", version: "1.0.0" });
await client.connect(new StdioClientTransport({ command: bin, env: process.env, stderr: "inherit" }));
const read = await client.readResource({ uri: "ui://mcqemu/view" });
const html = read.contents[0].text;
out.steps.mime = read.contents[0].mimeType;
const bundle = await esbuild.build({
  entryPoints: [path.join(here, "apps_host.js")], bundle: true, format: "iife", write: false,
  platform: "browser", logLevel: "silent",
});
const hostJs = bundle.outputFiles[0].text;

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium", args: ["--no-sandbox"],
});
try {
  const page = await browser.newPage({ viewport: { width: 960, height: 800 } });
  page.on("console", (m) => { if (m.type() === "error") out.console_errors.push(m.text()); });
  page.on("pageerror", (e) => out.console_errors.push(String(e)));
  page.on("request", (r) => {
    const u = r.url();
    if (!u.startsWith("data:") && !u.startsWith("about:")) out.elsewhere.push(u);
  });
  // Only the host page may call tools (bindings are installed in every frame).
  await page.exposeBinding("hostCallTool", async (source, params) => {
    if (source.frame !== page.mainFrame()) throw new Error("not the host frame");
    const p = JSON.parse(params);
    out.calls[p.name] = (out.calls[p.name] || 0) + 1;
    callTimes.push({ name: p.name, t: Date.now() });
    try {
      return JSON.stringify(await client.callTool(p));
    } catch (e) {
      return JSON.stringify({ isError: true, content: [{ type: "text", text: String(e) }] });
    }
  });
  await page.setContent(`<!doctype html><html><head><link rel="icon" href="data:,"></head>` +
    `<body><script>${hostJs}</script></body></html>`);
  await page.evaluate((h) => window.startHost(h), html);
  await page.waitForFunction(() => window.__initialized === true, null, { timeout: 30000 });
  await page.evaluate((name) => window.sendTool(name), vm);
  const view = page.frameLocator("iframe");
  const t0 = Date.now();
  await view.locator("#screen[src^='data:image/png']").waitFor({ timeout: 60000 });
  out.steps.first_frame_ms = Date.now() - t0;
  await view.locator("#take").click();
  await view.locator("#back").waitFor({ state: "visible", timeout: 30000 });
  await view.locator("#screen").focus();
  await page.keyboard.type(text, { delay: 20 });
  await page.keyboard.press("Enter");
  await page.waitForTimeout(1500);
  await view.locator("#screen").click();
  await page.waitForTimeout(500);
  await view.locator("#back").click();
  await view.locator("#take").waitFor({ state: "visible", timeout: 30000 });
  await page.waitForFunction(() => window.__context.length > 0, null, { timeout: 10000 });
  out.steps.context = await page.evaluate(() => window.__context);
  // Take over again, then tear the view down: the hold goes with it.
  await view.locator("#take").click();
  await view.locator("#back").waitFor({ state: "visible", timeout: 30000 });
  const during = await client.callTool({ name: "vm_info", arguments: { name: vm } });
  out.steps.held_before_teardown = !!during.structuredContent.held;
  await page.evaluate(() => window.teardown());
  const answered = Date.now();
  const after = await client.callTool({ name: "vm_info", arguments: { name: vm } });
  out.steps.held_after_teardown = !!after.structuredContent.held;
  // Nothing of the view's may call a tool once it answered the teardown.
  await page.waitForTimeout(2500);
  out.steps.calls_after_teardown = callTimes.filter((c) => c.t > answered);
} finally {
  await browser.close();
  await client.close();
}
console.log(JSON.stringify(out));
