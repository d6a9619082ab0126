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
  const out = { console_errors: [], elsewhere: [], frames: 0, steps: {} };
  const page = await browser.newPage({ viewport });
  page.on("console", (m) => { if (m.type() === "error") out.console_errors.push(m.text()); });
  page.on("pageerror", (e) => out.console_errors.push(String(e)));
  page.on("request", (r) => {
    if (!r.url().startsWith(origin) && !r.url().startsWith("data:")) out.elsewhere.push(r.url());
    if (r.url().endsWith("/call") && (r.postData() || "").includes("vm_view_frame")) out.frames++;
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
