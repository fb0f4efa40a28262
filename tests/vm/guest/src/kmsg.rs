//! Reading the kernel log (`/dev/kmsg`) from a point on: the IOMMU reports blocked DMA there.

use std::fs::File;
use std::io::{ErrorKind, Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};

/// A reader of kernel log records written after [`Kmsg::open`].
pub struct Kmsg {
    file: Option<File>,
}

impl Kmsg {
    /// Opens `/dev/kmsg` positioned after the last record (a reader that cannot open it
    /// finds nothing).
    pub fn open() -> Kmsg {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/kmsg")
            .and_then(|mut f| f.seek(SeekFrom::End(0)).map(|_| f));
        if let Err(e) = &file {
            println!("INFO: /dev/kmsg: {e}");
        }
        Kmsg { file: file.ok() }
    }

    /// Waits up to `timeout` for a new record containing `needle`; returns its message.
    pub fn wait_for(&self, needle: &str, timeout: Duration) -> Option<String> {
        let mut f = self.file.as_ref()?;
        let t0 = Instant::now();
        let mut buf = vec![0u8; 8192];
        loop {
            match f.read(&mut buf) {
                Ok(0) => {}
                Ok(n) => {
                    // A record is "prio,seq,usec,flags;message\n".
                    let rec = String::from_utf8_lossy(&buf[..n]);
                    let msg = rec.split_once(';').map_or(&*rec, |(_, m)| m).trim_end();
                    if msg.contains(needle) {
                        return Some(msg.to_string());
                    }
                    continue;
                }
                // EPIPE: records were overwritten before we read them; go on.
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(_) => return None,
            }
            if t0.elapsed() > timeout {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
