// Drives the live view that `mcqemu view` serves in headless Chromium (Debian's, through
// playwright-core): waits for the first frame, takes over, types a line, clicks the image,
// hands back. Prints one JSON line: what the page did and saw.
//
//   node view_http.mjs URL TEXT SHOT.png
import { chromium } from "playwright-core";

const [url, text, shot] = process.argv.slice(2);
const origin = new URL(url).origin;
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox"],
});
const out = { console_errors: [], elsewhere: [], frames: 0, steps: {} };
try {
  const page = await browser.newPage({ viewport: { width: 900, height: 800 } });
  page.on("console", (m) => { if (m.type() === "error") out.console_errors.push(m.text()); });
  page.on("pageerror", (e) => out.console_errors.push(String(e)));
  page.on("request", (r) => {
    if (!r.url().startsWith(origin) && !r.url().startsWith("data:")) out.elsewhere.push(r.url());
    if (r.url().endsWith("/call") && (r.postData() || "").includes("vm_view_frame")) out.frames++;
  });
  const t0 = Date.now();
  await page.goto(url);
  await page.waitForFunction(() => (document.getElementById("screen").src || "").startsWith("data:image/png"),
    null, { timeout: 60000 });
  out.steps.first_frame_ms = Date.now() - t0;
  out.first_frame = await page.getAttribute("#screen", "src");
  await page.screenshot({ path: shot });
  await page.click("#take");
  await page.waitForSelector("#back", { state: "visible", timeout: 30000 });
  out.steps.held = await page.isVisible("#hold");
  await page.focus("#screen");
  await page.keyboard.type(text, { delay: 20 });
  await page.keyboard.press("Enter");
  // Let the batched text and the Enter go out before handing back.
  await page.waitForTimeout(1500);
  const box = await page.locator("#screen").boundingBox();
  await page.mouse.click(box.x + box.width / 2, box.y + box.height / 2);
  await page.waitForTimeout(500);
  out.steps.status = await page.textContent("#status");
  await page.click("#back");
  await page.waitForSelector("#take", { state: "visible", timeout: 30000 });
  out.steps.handed_back = await page.textContent("#status");
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
