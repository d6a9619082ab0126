// Drives the live view that `mcqemu view` serves in headless Chromium (Debian's, through
// playwright-core): waits for the first frame, takes over, types a line, clicks the image,
// hands back. Prints one JSON line: what the page did and saw.
//
//   node view_http.mjs URL TEXT SHOT.png
import { openView, takeOver, handBack, keydowns } from "./view_page.mjs";

const [url, text, shot] = process.argv.slice(2);
const { browser, page, out } = await openView(url, { width: 900, height: 800 });
try {
  out.first_frame = await page.getAttribute("#screen", "src");
  await page.screenshot({ path: shot });
  await takeOver(page);
  out.steps.held = await page.isVisible("#hold");
  await page.focus("#screen");
  await page.keyboard.type(text, { delay: 20 });
  await page.waitForTimeout(300);
  // x, é, y in one batch: é has no key on the guest's US layout; x and y must still arrive,
  // and the page must say what was left out.
  await keydowns(page, ["x", "é", "y"]);
  await page.waitForTimeout(300);
  await page.keyboard.press("Enter");
  // Let the batched text and the Enter go out before handing back.
  await page.waitForTimeout(1500);
  out.steps.status_after_typing = await page.textContent("#status");
  // Chords as pressed: shift kept, punctuation by its key.
  await page.keyboard.press("Control+Shift+KeyA");
  await page.keyboard.press("Control+Shift+Digit1");
  await page.waitForTimeout(1000);
  const box = await page.locator("#screen").boundingBox();
  await page.mouse.click(box.x + box.width / 2, box.y + box.height / 2);
  await page.waitForTimeout(500);
  out.steps.status = await page.textContent("#status");
  out.steps.handed_back = await handBack(page);
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
