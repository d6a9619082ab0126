// For the bench: opens the live view that `mcqemu view` serves in headless Chromium and prints
// `draw EPOCH_MS` each time the page draws a new frame (its image changes), and `ready` after
// the first. Runs until stdin closes.
//
//   node view_bench.mjs URL
import { chromium } from "playwright-core";

const [url] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium", args: ["--no-sandbox"],
});
const page = await browser.newPage({ viewport: { width: 1100, height: 900 } });
await page.exposeFunction("drawn", (ms) => console.log(`draw ${Math.round(ms)}`));
await page.addInitScript(() => {
  new MutationObserver(() => {}).observe(document, { childList: true });
  window.addEventListener("DOMContentLoaded", () => {
    const img = document.getElementById("screen");
    img.addEventListener("load", () => window.drawn(performance.timeOrigin + performance.now()));
  });
});
await page.goto(url);
await page.waitForFunction(() => (document.getElementById("screen").src || "").startsWith("data:"),
  null, { timeout: 60000 });
console.log("ready");
process.stdin.resume();
process.stdin.on("end", async () => { await browser.close(); process.exit(0); });
