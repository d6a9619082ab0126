//! A 1920x1080 desktop on the test guest's screen, shared by `tests/screenshots.rs` and the
//! bench (`benches/mcp_latency/guest.rs`, through `#[path]`).
//!
//! The test guest has no graphics driver: its console is VGA text mode (720x400). QEMU's
//! standard VGA (`-vga std`, the default) has Bochs VBE registers in its MMIO BAR at 0x500, so
//! the guest sets a 1920x1080x32 mode with busybox `devmem`, as bochs-drm would, and writes a
//! picture into video memory through the legacy 64 KiB window at 0xA0000, one bank at a time
//! (`/dev/mem` writes into the linear framebuffer BAR fail with EFAULT; the window below 1 MiB
//! is always allowed). QEMU then shows exactly that picture, which `vm_screenshot` captures.
//!
//! The picture is made here, deterministically, to look like a desktop: a gradient wallpaper
//! with a little noise, windows with title bars and anti-aliased "text", a terminal, a chart
//! of one-pixel lines, icons, a taskbar, and one pure red square (the marker) that nothing
//! else on the screen comes near (no other pixel's red exceeds its green and blue by 100), for
//! clicking.

use serde_json::{json, Value};

/// The desktop's size.
pub const W: usize = 1920;
/// The desktop's height.
pub const H: usize = 1080;
/// The marker: a pure red square, `MARKER_SIZE` pixels from (`MARKER_X`, `MARKER_Y`), on the
/// terminal's dark background.
pub const MARKER_X: usize = 1401;
/// See [`MARKER_X`].
pub const MARKER_Y: usize = 803;
/// See [`MARKER_X`].
pub const MARKER_SIZE: usize = 12;
/// The marker's colour.
pub const MARKER_RGB: [u8; 3] = [255, 0, 0];

/// Where the picture is put in the guest before it is copied into video memory.
const GUEST_FILE: &str = "/tmp/mcq-desktop.bgrx";

fn hash(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

struct Canvas(Vec<u8>);

impl Canvas {
    fn set(&mut self, x: usize, y: usize, c: [u8; 3]) {
        if x < W && y < H {
            let i = (y * W + x) * 3;
            self.0[i..i + 3].copy_from_slice(&c);
        }
    }

    fn rect(&mut self, x0: usize, y0: usize, w: usize, h: usize, c: [u8; 3]) {
        for y in y0..y0 + h {
            for x in x0..x0 + w {
                self.set(x, y, c);
            }
        }
    }

    /// A vertical gradient from `top` to `bottom`.
    fn gradient(&mut self, x0: usize, y0: usize, w: usize, h: usize, top: [u8; 3], bot: [u8; 3]) {
        for y in 0..h {
            let t = y as i32 * 256 / h.max(1) as i32;
            let c = [0, 1, 2].map(|k| {
                (i32::from(top[k]) + (i32::from(bot[k]) - i32::from(top[k])) * t / 256) as u8
            });
            for x in x0..x0 + w {
                self.set(x, y0 + y, c);
            }
        }
    }

    /// Lines of "text": glyph-like strokes in 8x16 cells, with anti-aliased edges, in `fg` on
    /// `bg`; `seed` picks the words.
    fn text(&mut self, area: (usize, usize, usize, usize), fg: [u8; 3], bg: [u8; 3], seed: u64) {
        let mix = |a: f32| {
            [0, 1, 2].map(|k| (f32::from(bg[k]) + (f32::from(fg[k]) - f32::from(bg[k])) * a) as u8)
        };
        let (x0, y0, w, h) = area;
        let (cols, rows) = (w / 8, h / 16);
        for row in 0..rows {
            let len = (hash(seed ^ (row as u64 * 7919)) % cols as u64) as usize;
            for col in 0..len.min(cols) {
                let r = hash(seed.wrapping_mul(31) ^ ((row * 1000 + col) as u64));
                if r.is_multiple_of(6) {
                    continue; // a space
                }
                let (cx, cy) = (x0 + col * 8, y0 + row * 16 + 3);
                // Up to four strokes of a 5x9 glyph: two verticals, a top and a middle bar.
                if r & 2 != 0 {
                    for y in 0..9 {
                        self.set(cx + 1, cy + y, mix(1.0));
                        self.set(cx + 2, cy + y, mix(0.35));
                    }
                }
                if r & 4 != 0 {
                    for y in 2..9 {
                        self.set(cx + 5, cy + y, mix(1.0));
                        self.set(cx + 4, cy + y, mix(0.3));
                    }
                }
                if r & 8 != 0 {
                    for x in 1..6 {
                        self.set(cx + x, cy + 2, mix(0.9));
                    }
                }
                if r & 16 != 0 {
                    for x in 1..6 {
                        self.set(cx + x, cy + 5 + (r as usize >> 5) % 3, mix(0.8));
                        self.set(cx + x, cy + 6 + (r as usize >> 5) % 3, mix(0.25));
                    }
                }
            }
        }
    }

    /// A window: shadow, border, title bar and its title.
    fn window(&mut self, x0: usize, y0: usize, w: usize, h: usize, body: [u8; 3]) {
        for k in 1..8usize {
            let shade = (8 - k) as u8 * 4;
            for x in x0 + k..x0 + w + k {
                let i = ((y0 + h + k).min(H - 1) * W + x.min(W - 1)) * 3;
                for c in 0..3 {
                    self.0[i + c] = self.0[i + c].saturating_sub(shade);
                }
            }
        }
        self.rect(x0, y0, w, h, [136, 136, 136]);
        self.gradient(x0 + 1, y0 + 1, w - 2, 29, [238, 238, 238], [204, 204, 204]);
        self.rect(x0 + 1, y0 + 30, w - 2, 1, [170, 170, 170]);
        self.rect(x0 + 1, y0 + 31, w - 2, h - 32, body);
        self.text(
            (x0 + 10, y0 + 7, w / 3, 16),
            [40, 40, 40],
            [225, 225, 225],
            w as u64,
        );
    }
}

/// The desktop, as RGB bytes (`W * H * 3`).
pub fn picture() -> Vec<u8> {
    let mut c = Canvas(vec![0; W * H * 3]);
    // Wallpaper: a diagonal teal-to-blue gradient with soft bands and a little noise.
    for y in 0..H {
        for x in 0..W {
            let band = ((x as i32 * 3 + y as i32 * 5) / 37 % 24 - 12).abs();
            let n = (hash((y * W + x) as u64) % 5) as i32 - 2;
            let r = 10 + x as i32 * 25 / W as i32 + band + n;
            let g = 70 + y as i32 * 50 / H as i32 + band * 2 + n;
            let b = 95 + (x + y) as i32 * 60 / (W + H) as i32 + band + n;
            c.set(x, y, [r as u8, g as u8, b as u8]);
        }
    }
    // Icons.
    for (i, (top, bot)) in [
        ([74, 170, 136], [39, 119, 68]),
        ([68, 136, 204], [34, 51, 102]),
        ([204, 136, 68], [102, 51, 34]),
    ]
    .into_iter()
    .enumerate()
    {
        c.gradient(30, 30 + i * 100, 64, 64, top, bot);
        c.text(
            (22, 98 + i * 100, 80, 16),
            [250, 250, 250],
            [40, 90, 110],
            i as u64,
        );
    }
    // An editor, a chart, a terminal.
    c.window(140, 60, 900, 700, [255, 255, 255]);
    c.text((146, 96, 880, 656), [34, 34, 34], [255, 255, 255], 1);
    c.window(620, 140, 640, 420, [250, 250, 250]);
    for k in 0..12 {
        c.rect(640, 190 + k * 30, 600, 1, [200, 200, 200]);
        c.rect(640 + k * 50, 190, 1, 330, [220, 220, 220]);
    }
    for x in 0..600usize {
        let y = 350.0 + 120.0 * ((x as f32) / 47.0).sin() * (1.0 - x as f32 / 900.0);
        c.set(640 + x, y as usize, [110, 40, 200]);
        c.set(640 + x, (y as usize) + 1, [190, 160, 230]);
        let y2 = 420.0 - 0.25 * x as f32 + 20.0 * ((x as f32) / 13.0).cos();
        c.set(640 + x, y2 as usize, [40, 90, 200]);
    }
    c.window(1000, 300, 860, 640, [30, 30, 30]);
    c.text((1006, 336, 840, 596), [208, 208, 208], [30, 30, 30], 2);
    // Clear ground for the marker, then the marker.
    c.rect(
        MARKER_X - 20,
        MARKER_Y - 20,
        MARKER_SIZE + 40,
        MARKER_SIZE + 40,
        [30, 30, 30],
    );
    c.rect(MARKER_X, MARKER_Y, MARKER_SIZE, MARKER_SIZE, MARKER_RGB);
    // Taskbar.
    c.rect(0, H - 36, W, 36, [20, 20, 30]);
    c.text((12, H - 26, 400, 16), [255, 255, 255], [20, 20, 30], 3);
    c.text((W - 120, H - 26, 100, 16), [255, 255, 255], [20, 20, 30], 4);
    c.0
}

/// RGB to the guest's 32-bit pixels (B, G, R, unused).
pub fn bgrx(rgb: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(rgb.len() / 3 * 4);
    for p in rgb.chunks_exact(3) {
        out.extend_from_slice(&[p[2], p[1], p[0], 0]);
    }
    out
}

/// Standard base64 with padding.
pub fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for k in 0..4 {
            if k <= c.len() {
                s.push(A[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

/// Shell helpers for the guest: `$vbe` is the Bochs VBE register block of the standard VGA
/// (found by its PCI id, 1234:1111), `reg N VALUE` writes register N.
const VBE: &str = r#"dev=""
for d in /sys/bus/pci/devices/*; do
  [ "$(cat $d/vendor):$(cat $d/device)" = "0x1234:0x1111" ] && dev=$d
done
[ -n "$dev" ] || { echo "no standard VGA (1234:1111) in the guest" >&2; exit 3; }
vbe=$(( $(sed -n 3p $dev/resource | cut -d' ' -f1) + 0x500 ))
reg() { devmem $(( vbe + $1 * 2 )) 16 $2; }
"#;

/// A guest script that sets a `w` x `h` 32-bit mode (registers 1-3 and 6-9: size, depth,
/// virtual size, offsets; 4: enable with the linear framebuffer, which clears the screen) and
/// prints the mode read back.
pub fn set_mode_script(w: usize, h: usize) -> String {
    format!(
        "{VBE}reg 4 0; reg 1 {w}; reg 2 {h}; reg 3 32; reg 6 {w}; reg 7 {h}; reg 8 0; reg 9 0; \
         reg 4 0x41\necho $(devmem $((vbe + 2)) 16) $(devmem $((vbe + 4)) 16) $(devmem $((vbe + 6)) 16)"
    )
}

/// A guest script that copies [`GUEST_FILE`] into video memory, one 64 KiB bank (register 5)
/// at a time through the window at 0xA0000 (`seek=10` blocks of 64 KiB).
fn blit_script() -> String {
    format!(
        "{VBE}n=$(( ($(stat -c %s {GUEST_FILE}) + 65535) / 65536 )); b=0\n\
         while [ $b -lt $n ]; do\n  reg 5 $b\n  \
         dd if={GUEST_FILE} of=/dev/mem bs=65536 skip=$b seek=10 count=1 2>/dev/null || exit 4\n  \
         b=$((b + 1))\ndone\nreg 5 0; rm -f {GUEST_FILE}; echo $n"
    )
}

/// Puts `rgb` (a `W` x `H` picture) on VM `name`'s screen at `W` x `H`, through `call` (a
/// tool call returning its structured result, or the failure): guest_exec sets the mode,
/// guest_file_write uploads the pixels, guest_exec copies them into video memory.
pub fn show(
    name: &str,
    rgb: &[u8],
    mut call: impl FnMut(&str, Value) -> Result<Value, String>,
) -> Result<(), String> {
    let exec = |call: &mut dyn FnMut(&str, Value) -> Result<Value, String>,
                script: String,
                timeout: u64|
     -> Result<String, String> {
        let sc = call(
            "guest_exec",
            json!({"name": name, "command": "sh", "args": ["-c", script], "timeout": timeout}),
        )?;
        if sc["exitcode"] != json!(0) {
            return Err(format!("guest script failed: {sc}"));
        }
        Ok(sc["stdout"].as_str().unwrap_or("").trim().to_string())
    };
    let mode = exec(&mut call, set_mode_script(W, H), 30)?;
    if mode != format!("0x{W:04X} 0x{H:04X} 0x0020") {
        return Err(format!("the guest's VBE mode reads back as {mode:?}"));
    }
    let px = bgrx(rgb);
    let chunk = 3 << 20;
    for (i, part) in px.chunks(chunk).enumerate() {
        let sc = call(
            "guest_file_write",
            json!({"name": name, "path": GUEST_FILE, "content": base64(part),
                   "encoding": "base64", "append": i > 0}),
        )?;
        if sc["bytes_written"] != json!(part.len()) {
            return Err(format!("guest_file_write wrote {sc}"));
        }
    }
    let banks = exec(&mut call, blit_script(), 120)?;
    if banks != (px.len().div_ceil(65536)).to_string() {
        return Err(format!("the guest copied {banks:?} banks"));
    }
    Ok(())
}
