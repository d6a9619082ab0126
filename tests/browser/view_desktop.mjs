// Drives the live view of the desktop guest that `mcqemu view` serves, in headless Chromium
// (Debian's, through playwright-core), the way a person taking over would: waits for the first
// frame, takes over, clicks each screen point asked for at its place on the scaled image, types
// a text and a batch with a character the layout lacks, presses ctrl+a, ctrl+shift+a and
// ctrl+shift+1, hands back. Prints one JSON line: when each click and key was made
// (epoch ms, to compare with the guest program's record) and what the page saw.
//
//   node view_desktop.mjs URL SPEC_JSON
//   SPEC_JSON: {"screen": [W, H], "clicks": [[x, y], ...], "gap_ms": N, "text": "..."}
import { openView, takeOver, handBack, keydowns } from "./view_page.mjs";

const [url, specJson] = process.argv.slice(2);
const spec = JSON.parse(specJson);
// Narrower than the screen: the page draws the frame scaled, as in a chat's side panel.
const { browser, page, out } = await openView(url, { width: 800, height: 760 });
out.clicks = [];
try {
  await takeOver(page);
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
  await page.waitForTimeout(300);
  // One batch with a character the guest's US layout has no key for: the rest arrives.
  await keydowns(page, ["x", "é", "y"]);
  await page.waitForTimeout(800);
  out.steps.status_after_typing = await page.textContent("#status");
  out.steps.chord_at = Date.now();
  await page.keyboard.press("Control+a");
  // Chords as pressed: shift kept, punctuation by its key.
  await page.keyboard.press("Control+Shift+KeyA");
  await page.keyboard.press("Control+Shift+Digit1");
  await page.waitForTimeout(1000);
  out.steps.status = await page.textContent("#status");
  out.steps.handed_back = await handBack(page);
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
