//! Guest files through the agent's file commands (guest_file_read, guest_file_write) and the
//! agent's answer (guest_ping): bounded chunks, a file's size when it can seek, nothing past
//! the cap read.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::with_guest;
use crate::b64;
use crate::ops::error::OpError;
use crate::qemu::agent_calls::{self, FileHandle, Whence};
use crate::qemu::qga::{Qga, QgaError};

/// Bytes per guest-file-read / guest-file-write call: large, since every call is a round trip
/// into a TCG guest (qemu-ga allows reads of up to 48 MB), and a multiple of 3 so base64
/// chunks join without padding.
const FILE_CHUNK: usize = 1024 * 1024 - 1;
/// Cap on guest_file_read's max_bytes.
pub const MAX_READ: i64 = 8 * 1024 * 1024;

crate::described! {
    /// guest_ping's result.
    #[derive(Debug, Clone, Serialize)]
    pub struct Pong {
        /// The VM.
        pub name: String,
        /// Always true (a silent agent is an error).
        pub ok: bool,
        /// The round trip.
        pub latency_ms: f64,
    }
}

/// Asks the agent to answer within 5 s.
pub fn ping(name: &str) -> Result<Pong, OpError> {
    let t = Instant::now();
    with_guest(name, "guest-ping", |q| {
        agent_calls::ping(q, Duration::from_secs(5))
    })?;
    Ok(Pong {
        name: name.to_string(),
        ok: true,
        latency_ms: t.elapsed().as_secs_f64() * 1000.0,
    })
}

/// guest_file_read's request.
#[derive(Debug, Clone)]
pub struct ReadRequest {
    /// The VM.
    pub name: String,
    /// The file in the guest.
    pub path: String,
    /// The most bytes returned (1 to [`MAX_READ`]).
    pub max: usize,
    /// Where to start.
    pub offset: u64,
    /// Return base64 instead of UTF-8 text.
    pub base64: bool,
}

crate::described! {
    /// What guest_file_read returns (in this order).
    #[derive(Debug, Clone, Serialize)]
    pub struct FileRead {
        /// The VM.
        pub name: String,
        /// The file.
        pub path: String,
        /// The bytes, as text or base64.
        pub content: String,
        /// "utf-8" or "base64".
        pub encoding: &'static str,
        /// Bytes returned.
        pub size: usize,
        /// True when the file goes on past them.
        pub truncated: bool,
        /// Where the read started.
        pub offset: u64,
        /// The file's size, when it can seek (not /proc files or pipes) and is not empty (an
        /// empty file reads like a /proc file); absent otherwise, never null (the schema says an
        /// integer, and the official client refuses a null).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub file_size: Option<u64>,
    }
}

/// Reads up to `max` bytes of a guest file from `offset` on.
pub fn read(req: &ReadRequest) -> Result<FileRead, OpError> {
    let (path, offset, max) = (&req.path, req.offset, req.max);
    let (data, truncated, file_size) = with_guest(&req.name, "guest-file-read", |q| {
        let handle = agent_calls::file_open(q, path, "r")?;
        let result = read_at(q, handle, offset, max);
        let _ = agent_calls::file_close(q, handle, Duration::from_secs(10));
        result
    })?;
    let (content, encoding) = if req.base64 {
        (b64::encode(&data), "base64")
    } else {
        let text = String::from_utf8(data.clone()).map_err(|_| {
            OpError::invalid(format!(
                "{path} is not valid UTF-8 text; read it with encoding=\"base64\""
            ))
        })?;
        (text, "utf-8")
    };
    Ok(FileRead {
        name: req.name.clone(),
        path: path.clone(),
        content,
        encoding,
        size: data.len(),
        truncated,
        offset,
        file_size,
    })
}

/// Reads up to `max` bytes from `offset` on; also returns the file's size (None for files
/// that cannot seek, such as /proc files and pipes: they are read from their start).
fn read_at(
    q: &mut Qga,
    handle: FileHandle,
    offset: u64,
    max: usize,
) -> Result<(Vec<u8>, bool, Option<u64>), QgaError> {
    let size = match agent_calls::file_seek(q, handle, 0, Whence::End) {
        Ok(position) => Some(position),
        Err(QgaError::Command { .. }) => None,
        Err(e) => return Err(e),
    };
    if size.is_some() || offset > 0 {
        agent_calls::file_seek(q, handle, offset as i64, Whence::Set)?;
    }
    // A /proc file reports size 0 and still has content: read it as it is.
    let size = size.filter(|s| *s > 0 || offset > 0);
    let (data, truncated) = read_all(q, handle, max)?;
    Ok((data, truncated, size))
}

fn read_all(q: &mut Qga, handle: FileHandle, max: usize) -> Result<(Vec<u8>, bool), QgaError> {
    let mut data = Vec::new();
    let mut idle = 0;
    loop {
        // Ask for one byte past the cap, so a file of exactly max bytes is not called truncated.
        let want = (max + 1 - data.len()).min(FILE_CHUNK);
        let (chunk, eof) = agent_calls::file_read(q, handle, want)?;
        if chunk.is_empty() {
            idle += 1;
        } else {
            idle = 0;
        }
        data.extend_from_slice(&chunk);
        if data.len() > max {
            data.truncate(max);
            return Ok((data, true));
        }
        if eof || idle >= 3 {
            return Ok((data, false));
        }
    }
}

/// guest_file_write's request.
#[derive(Debug, Clone)]
pub struct WriteRequest {
    /// The VM.
    pub name: String,
    /// The file in the guest.
    pub path: String,
    /// The bytes to write.
    pub data: Vec<u8>,
    /// Append instead of replacing.
    pub append: bool,
}

crate::described! {
    /// What guest_file_write did (in this order).
    #[derive(Debug, Clone, Serialize)]
    pub struct Written {
        /// The VM.
        pub name: String,
        /// The file.
        pub path: String,
        /// Bytes the guest took.
        pub bytes_written: usize,
        /// Whether they were appended.
        pub append: bool,
    }
}

/// Writes (or appends) the bytes to a guest file; a guest that takes nothing is an error.
pub fn write(req: &WriteRequest) -> Result<Written, OpError> {
    let path = &req.path;
    let written = with_guest(&req.name, "guest-file-write", |q| {
        let mode = if req.append { "a" } else { "w" };
        let handle = agent_calls::file_open(q, path, mode)?;
        let result = write_all(q, handle, &req.data);
        let closed = agent_calls::file_close(q, handle, Duration::from_secs(10));
        let n = result?;
        closed?;
        Ok(n)
    })?;
    Ok(Written {
        name: req.name.clone(),
        path: path.clone(),
        bytes_written: written,
        append: req.append,
    })
}

fn write_all(q: &mut Qga, handle: FileHandle, data: &[u8]) -> Result<usize, QgaError> {
    let mut done = 0;
    let mut idle = 0;
    while done < data.len() {
        let end = (done + FILE_CHUNK).min(data.len());
        let n = agent_calls::file_write(q, handle, &data[done..end])? as usize;
        if n == 0 {
            idle += 1;
            if idle >= 3 {
                return Err(QgaError::Command {
                    class: "GenericError".into(),
                    desc: format!("the guest accepted no bytes after {done}; is the disk full?"),
                });
            }
        } else {
            idle = 0;
        }
        done += n.min(end - done);
    }
    Ok(done)
}
