// The live view that `mcqemu view` serves, opened in headless Chromium (Debian's, through
// playwright-core) the way the browser tests watch it: console errors, requests to anything
// but the view's own origin and the page's frame calls are recorded in `out`.
import { chromium } from "playwright-core";

// Opens `url` in a page of `viewport` and waits for its first frame; from then on the caller
// closes `browser` (in a finally).
export async function openView(url, viewport) {
  const origin = new URL(url).origin;
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox"],
  });
  const out = { console_errors: [], elsewhere: [], frames: 0, changed_frames: [], inputs: [],
    steps: {} };
  const page = await browser.newPage({ viewport });
  page.on("console", (m) => { if (m.type() === "error") out.console_errors.push(m.text()); });
  page.on("pageerror", (e) => out.console_errors.push(String(e)));
  page.on("request", (r) => {
    if (!r.url().startsWith(origin) && !r.url().startsWith("data:")) out.elsewhere.push(r.url());
    if (r.url().endsWith("/call") && (r.postData() || "").includes("vm_view_frame")) out.frames++;
  });
  // Each frame the server sent (changed: true) with its time, and each input batch with the
  // server's answer: what the tests count and check.
  page.on("response", async (r) => {
    if (!r.url().endsWith("/call")) return;
    const sent = JSON.parse(r.request().postData() || "{}");
    let got = null;
    try { got = await r.json(); } catch (e) { return; }
    const sc = (got && got.structuredContent) || {};
    if (sent.name === "vm_view_frame" && sc.changed) out.changed_frames.push(Date.now());
    if (sent.name === "vm_view_input") {
      out.inputs.push({ events: sent.arguments.events, error: !!got.isError, done: sc });
    }
  });
  const t0 = Date.now();
  try {
    await page.goto(url);
    await page.waitForFunction(() => (document.getElementById("screen").src || "").startsWith("data:image/png"),
      null, { timeout: 60000 });
  } catch (e) {
    await browser.close();
    throw e;
  }
  out.steps.first_frame_ms = Date.now() - t0;
  return { browser, page, out };
}

// Sends keydowns to the view's screen in one go (one text batch), as a browser does for keys
// no test keyboard has (Playwright types such characters without a keydown).
export async function keydowns(page, keys) {
  await page.evaluate((ks) => {
    const el = document.getElementById("screen");
    for (const key of ks) el.dispatchEvent(new KeyboardEvent("keydown", { key, bubbles: true }));
  }, keys);
}

// Takes over (the person's hold) and waits until the page offers the hand-back.
export async function takeOver(page) {
  await page.click("#take");
  await page.waitForSelector("#back", { state: "visible", timeout: 30000 });
}

// Hands back and waits until the page offers to take over again; the page's status after.
export async function handBack(page) {
  await page.click("#back");
  await page.waitForSelector("#take", { state: "visible", timeout: 30000 });
  return page.textContent("#status");
}
