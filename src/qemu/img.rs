//! qemu-img: every run bounded, JSON output where qemu-img offers it, stderr as the error text.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use super::qmp_calls::SnapshotInfo;
use crate::host::run::{run, RunError};

/// Bound for quick qemu-img operations (info, create, snapshot, resize).
pub const QUICK: Duration = Duration::from_secs(120);
/// Bound for conversions, which copy whole images.
pub const LONG: Duration = Duration::from_secs(3600);

/// Image formats we create and convert to.
pub const FORMATS: &[&str] = &["qcow2", "raw", "vmdk", "vdi", "vhdx", "vpc", "qed"];

/// Why a qemu-img operation failed.
#[derive(Debug)]
pub enum ImgError {
    /// Could not run qemu-img at all (missing, timed out, cancelled).
    Run(RunError),
    /// QEMU holds the image's lock: a running VM uses it.
    Locked(String),
    /// qemu-img ran and refused; its stderr.
    Failed(String),
    /// qemu-img's output was not what we expected.
    BadOutput(String),
}

impl std::fmt::Display for ImgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ImgError::Run(e) => write!(f, "{e}"),
            ImgError::Locked(msg) => write!(
                f,
                "the image is in use by a running VM (QEMU holds its write lock): stop the VM \
                 with stop_vm first, then retry. qemu-img said: {msg}"
            ),
            ImgError::Failed(msg) => write!(f, "qemu-img failed: {msg}"),
            ImgError::BadOutput(msg) => write!(f, "qemu-img gave unexpected output: {msg}"),
        }
    }
}

impl std::error::Error for ImgError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ImgError::Run(e) => Some(e),
            _ => None,
        }
    }
}

impl From<RunError> for ImgError {
    fn from(e: RunError) -> Self {
        ImgError::Run(e)
    }
}

/// The qemu-img binary: `$MCQEMU_QEMU_IMG`, else the one of the QEMU build in
/// `$MCQEMU_QEMU_DIR`, else `qemu-img` on PATH.
pub fn binary() -> String {
    if let Some(b) = std::env::var("MCQEMU_QEMU_IMG")
        .ok()
        .filter(|s| !s.is_empty())
    {
        return b;
    }
    std::env::var_os("MCQEMU_QEMU_DIR")
        .filter(|d| !d.is_empty())
        .map(|d| std::path::PathBuf::from(d).join("qemu-img"))
        .filter(|p| p.is_file())
        .map_or_else(|| "qemu-img".to_string(), |p| p.display().to_string())
}

fn exec(
    args: &[&std::ffi::OsStr],
    timeout: Duration,
    cancelled: &dyn Fn() -> bool,
) -> Result<Vec<u8>, ImgError> {
    let mut cmd = Command::new(binary());
    cmd.args(args);
    let out = run(&mut cmd, timeout, cancelled).map_err(ImgError::Run)?;
    if out.status.success() {
        return Ok(out.stdout);
    }
    let text = String::from_utf8_lossy(&out.stderr).trim().to_string();
    let text = if text.is_empty() {
        format!("exit status {}", out.status)
    } else {
        text
    };
    if text.contains("lock") && (text.contains("Failed to get") || text.contains("is locked")) {
        Err(ImgError::Locked(text))
    } else {
        Err(ImgError::Failed(text))
    }
}

fn os(s: &str) -> &std::ffi::OsStr {
    std::ffi::OsStr::new(s)
}

/// `qemu-img info`'s answer for one image: the fields mcqemu reads, and the whole JSON as
/// qemu-img printed it (image_info shows it).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct ImageInfo {
    /// The format.
    pub format: Option<String>,
    /// The virtual size in bytes.
    #[serde(rename = "virtual-size")]
    pub virtual_size: Option<u64>,
    /// Bytes on disk.
    #[serde(rename = "actual-size")]
    pub actual_size: Option<u64>,
    /// The backing file, resolved.
    #[serde(rename = "full-backing-filename")]
    pub full_backing_filename: Option<String>,
    /// The backing file as the image names it.
    #[serde(rename = "backing-filename")]
    pub backing_filename: Option<String>,
    /// The backing file's format, when the image records it.
    #[serde(rename = "backing-filename-format")]
    pub backing_format: Option<String>,
    /// Internal snapshots.
    #[serde(default)]
    pub snapshots: Vec<SnapshotInfo>,
    /// The whole JSON.
    #[serde(skip)]
    pub raw: Value,
}

impl ImageInfo {
    /// The backing file: resolved when qemu-img could, else as named.
    pub fn backing(&self) -> Option<&str> {
        self.full_backing_filename
            .as_deref()
            .or(self.backing_filename.as_deref())
    }

    /// Reads `qemu-img info`'s JSON of one image.
    pub fn of(raw: Value) -> Result<ImageInfo, ImgError> {
        let mut info = ImageInfo::deserialize(&raw)
            .map_err(|e| ImgError::BadOutput(format!("unexpected qemu-img info: {e}")))?;
        info.raw = raw;
        Ok(info)
    }
}

/// `qemu-img info` of the image at `path`, read as `format` (see [`info_json`]).
pub fn info(path: &Path, format: &str) -> Result<ImageInfo, ImgError> {
    ImageInfo::of(info_json(path, format, false)?)
}

/// `qemu-img info` of every image in the backing chain of `path`, top first (check it with
/// `untrusted::check` first: this opens every file in it).
pub fn info_chain(path: &Path, format: &str) -> Result<Vec<ImageInfo>, ImgError> {
    match info_json(path, format, true)? {
        Value::Array(all) => all.into_iter().map(ImageInfo::of).collect(),
        _ => Err(ImgError::BadOutput(
            "the backing chain is not a list".into(),
        )),
    }
}

/// `qemu-img info --output=json` (with `-U`, so an image a VM holds can still be inspected),
/// read as `format` (never probed: see [`info_as`]). With `chain`, the array of the whole
/// backing chain.
fn info_json(path: &Path, format: &str, chain: bool) -> Result<Value, ImgError> {
    let mut args = vec![
        os("info"),
        os("--output=json"),
        os("-U"),
        os("-f"),
        os(format),
    ];
    if chain {
        args.push(os("--backing-chain"));
    }
    args.push(path.as_os_str());
    let out = exec(&args, QUICK, &|| false)?;
    serde_json::from_slice(&out).map_err(|e| ImgError::BadOutput(format!("not JSON: {e}")))
}

/// `qemu-img info --output=json -U` of one image (its backing file is not opened), read as
/// `format` when given: a pinned format is never probed, so a guest that wrote another
/// format's header into its disk cannot change how the image is read.
pub fn info_as(path: &Path, format: Option<&str>) -> Result<Value, ImgError> {
    let mut args = vec![os("info"), os("--output=json"), os("-U")];
    if let Some(f) = format {
        args.extend([os("-f"), os(f)]);
    }
    args.push(path.as_os_str());
    let out = exec(&args, QUICK, &|| false)?;
    serde_json::from_slice(&out).map_err(|e| ImgError::BadOutput(format!("not JSON: {e}")))
}

/// Creates an image of `size` bytes; with a backing file, its format is passed explicitly.
pub fn create(
    path: &Path,
    format: &str,
    size: Option<u64>,
    backing: Option<(&Path, &str)>,
) -> Result<(), ImgError> {
    let size_s = size.map(|s| s.to_string());
    let mut args = vec![os("create"), os("-q"), os("-f"), os(format)];
    if let Some((b, bf)) = backing {
        args.extend([os("-b"), b.as_os_str(), os("-F"), os(bf)]);
    }
    args.push(path.as_os_str());
    if let Some(s) = &size_s {
        args.push(os(s));
    }
    exec(&args, QUICK, &|| false).map(|_| ())
}

/// Creates a qcow2 overlay of `size` bytes over `backing` (of `backing_format`) without opening
/// it (`-u`): for a backing file that a running QEMU still holds locked.
pub fn create_overlay_unopened(
    path: &Path,
    backing: &Path,
    backing_format: &str,
    size: u64,
) -> Result<(), ImgError> {
    let size_s = size.to_string();
    let args = [
        os("create"),
        os("-q"),
        os("-f"),
        os("qcow2"),
        os("-u"),
        os("-b"),
        backing.as_os_str(),
        os("-F"),
        os(backing_format),
        path.as_os_str(),
        os(&size_s),
    ];
    exec(&args, QUICK, &|| false).map(|_| ())
}

/// Names `backing` (of `backing_format`) as the qcow2 image's backing file without reading
/// either (`rebase -u`): the same bytes moved to another place, as a pulled template's are.
pub fn rebase_unsafe(path: &Path, backing: &Path, backing_format: &str) -> Result<(), ImgError> {
    let args = [
        os("rebase"),
        os("-q"),
        os("-u"),
        os("-f"),
        os("qcow2"),
        os("-b"),
        backing.as_os_str(),
        os("-F"),
        os(backing_format),
        path.as_os_str(),
    ];
    exec(&args, QUICK, &|| false).map(|_| ())
}

/// Converts `src` (of `src_format`) into `dest` as `format`.
pub fn convert(
    src: &Path,
    src_format: &str,
    dest: &Path,
    format: &str,
    compress: bool,
    cancelled: &dyn Fn() -> bool,
) -> Result<(), ImgError> {
    let mut args = vec![
        os("convert"),
        os("-f"),
        os(src_format),
        os("-O"),
        os(format),
    ];
    if compress {
        args.push(os("-c"));
    }
    args.extend([src.as_os_str(), dest.as_os_str()]);
    exec(&args, LONG, cancelled).map(|_| ())
}

/// Resizes to an absolute size in bytes.
pub fn resize(path: &Path, format: &str, bytes: u64, shrink: bool) -> Result<(), ImgError> {
    let size = bytes.to_string();
    let mut args = vec![os("resize"), os("-q"), os("-f"), os(format)];
    if shrink {
        args.push(os("--shrink"));
    }
    args.extend([path.as_os_str(), os(&size)]);
    exec(&args, QUICK, &|| false).map(|_| ())
}

/// Internal snapshot operations on an image at rest.
#[derive(Clone, Copy, Debug)]
pub enum SnapshotOp {
    /// `-c`: create.
    Create,
    /// `-a`: apply (revert to).
    Apply,
    /// `-d`: delete.
    Delete,
}

/// Runs `qemu-img snapshot` with the given operation and tag, on the image read as `format`.
pub fn snapshot(path: &Path, format: &str, op: SnapshotOp, tag: &str) -> Result<(), ImgError> {
    let flag = match op {
        SnapshotOp::Create => "-c",
        SnapshotOp::Apply => "-a",
        SnapshotOp::Delete => "-d",
    };
    // qemu-img snapshot has no -f: the format is pinned through --image-opts instead.
    let opts = format!(
        "driver={},file.driver=file,file.filename={}",
        super::cmdline::qopt(format),
        super::cmdline::qopt(&path.to_string_lossy())
    );
    exec(
        &[
            os("snapshot"),
            os("--image-opts"),
            os(flag),
            os(tag),
            os(&opts),
        ],
        QUICK,
        &|| false,
    )
    .map(|_| ())
}

/// The first line of `qemu-img --version`.
pub fn version() -> Result<String, ImgError> {
    let out = exec(&[os("--version")], Duration::from_secs(10), &|| false)?;
    Ok(String::from_utf8_lossy(&out)
        .lines()
        .next()
        .unwrap_or("")
        .trim()
        .to_string())
}

/// A size parameter that is not a valid size; holds the input as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SizeError {
    /// Not a number with an optional binary unit.
    Invalid(String),
    /// Zero bytes.
    Zero(String),
    /// Over `i64::MAX` bytes.
    TooLarge(String),
}

impl std::fmt::Display for SizeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SizeError::Invalid(input) => write!(
                f,
                "invalid size {input:?}: use bytes or a number with K, M, G, T or P (binary \
                 units), e.g. \"10G\" or \"512M\""
            ),
            SizeError::Zero(input) => {
                write!(f, "invalid size {input:?}: must be greater than zero")
            }
            SizeError::TooLarge(input) => write!(f, "invalid size {input:?}: too large"),
        }
    }
}

impl std::error::Error for SizeError {}

/// Parses a size such as `10G`, `512M`, `1.5T`, `4096` or `64KiB` into bytes (binary units,
/// as qemu-img reads them). Rejects zero, negatives and overflow.
pub fn parse_size(input: &str) -> Result<u64, SizeError> {
    let s = input.trim();
    let bad = || SizeError::Invalid(input.to_string());
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() || num.starts_with('.') || num.ends_with('.') || num.matches('.').count() > 1
    {
        return Err(bad());
    }
    let unit = unit.trim();
    let unit_l = unit.to_ascii_lowercase();
    let unit_l = unit_l
        .strip_suffix("ib")
        .or_else(|| unit_l.strip_suffix('b'))
        .unwrap_or(&unit_l);
    let shift = match unit_l {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        "p" => 50,
        "e" => 60,
        _ => return Err(bad()),
    };
    if unit.eq_ignore_ascii_case("b") && num.contains('.') {
        return Err(bad());
    }
    let bytes = if let Some((whole, frac)) = num.split_once('.') {
        let whole: u128 = whole.parse().map_err(|_| bad())?;
        let digits = frac.len().min(18) as u32;
        let frac_v: u128 = frac[..digits as usize].parse().map_err(|_| bad())?;
        let unit_bytes: u128 = 1u128 << shift;
        whole * unit_bytes + frac_v * unit_bytes / 10u128.pow(digits)
    } else {
        let whole: u128 = num.parse().map_err(|_| bad())?;
        whole << shift
    };
    if bytes == 0 {
        return Err(SizeError::Zero(input.to_string()));
    }
    if bytes > i64::MAX as u128 {
        return Err(SizeError::TooLarge(input.to_string()));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("10G").unwrap(), 10 << 30);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("64KiB").unwrap(), 64 << 10);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("2 g").unwrap(), 2 << 30);
        for bad in [
            "",
            "G",
            "-1G",
            "0",
            "1.G",
            "10X",
            "1..5G",
            "99999999E",
            "+5G",
        ] {
            assert!(parse_size(bad).is_err(), "{bad} accepted");
        }
    }
}
