// Drives the live view of the desktop guest that `mcqemu view` serves, in headless Chromium
// (Debian's, through playwright-core), the way a person taking over would: waits for the first
// frame, takes over, clicks each screen point asked for at its place on the scaled image, types
// a text, presses ctrl+a, hands back. Prints one JSON line: when each click and key was made
// (epoch ms, to compare with the guest program's record) and what the page saw.
//
//   node view_desktop.mjs URL SPEC_JSON
//   SPEC_JSON: {"screen": [W, H], "clicks": [[x, y], ...], "gap_ms": N, "text": "..."}
import { chromium } from "playwright-core";

const [url, specJson] = process.argv.slice(2);
const spec = JSON.parse(specJson);
const origin = new URL(url).origin;
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox"],
});
const out = { console_errors: [], elsewhere: [], frames: 0, clicks: [], steps: {} };
try {
  // Narrower than the screen: the page draws the frame scaled, as in a chat's side panel.
  const page = await browser.newPage({ viewport: { width: 800, height: 760 } });
  page.on("console", (m) => { if (m.type() === "error") out.console_errors.push(m.text()); });
  page.on("pageerror", (e) => out.console_errors.push(String(e)));
  page.on("request", (r) => {
    if (!r.url().startsWith(origin) && !r.url().startsWith("data:")) out.elsewhere.push(r.url());
    if (r.url().endsWith("/call") && (r.postData() || "").includes("vm_view_frame")) out.frames++;
  });
  await page.goto(url);
  await page.waitForFunction(() => (document.getElementById("screen").src || "").startsWith("data:image/png"),
    null, { timeout: 60000 });
  await page.click("#take");
  await page.waitForSelector("#back", { state: "visible", timeout: 30000 });
  const box = await page.locator("#screen").boundingBox();
  out.steps.drawn = [box.width, box.height];
  const [w, h] = spec.screen;
  for (const [x, y] of spec.clicks) {
    // The centre of the screen pixel (x, y) as the page draws it.
    const px = box.x + (x + 0.5) * box.width / w;
    const py = box.y + (y + 0.5) * box.height / h;
    const t = Date.now();
    await page.mouse.click(px, py);
    out.clicks.push({ x, y, t });
    await page.waitForTimeout(spec.gap_ms || 600);
  }
  await page.focus("#screen");
  out.steps.typed_at = Date.now();
  await page.keyboard.type(spec.text, { delay: 20 });
  await page.waitForTimeout(800);
  out.steps.chord_at = Date.now();
  await page.keyboard.press("Control+a");
  await page.waitForTimeout(1000);
  out.steps.status = await page.textContent("#status");
  await page.click("#back");
  await page.waitForSelector("#take", { state: "visible", timeout: 30000 });
  out.steps.handed_back = await page.textContent("#status");
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
