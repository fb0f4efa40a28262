//! What the kernel says about a dma-buf fd: `/proc/self/fdinfo/<fd>`.
//!
//! The dma-buf core prints `size`, `count` (file references), `exp_name` (the exporter's
//! module, for example `nvidia`) and, once set, `name` (linux `drivers/dma-buf/dma-buf.c`,
//! `dma_buf_show_fdinfo`). Only dma-bufs have `exp_name`, so it tells a dma-buf from any
//! other fd.

use std::os::fd::{AsFd, AsRawFd};

/// Errors reading a dma-buf's fdinfo.
#[derive(Debug, thiserror::Error)]
pub enum DmaBufError {
    /// The fdinfo file could not be read.
    #[error("cannot read {path}")]
    Io {
        /// The fdinfo path.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The fd is not a dma-buf (its fdinfo has no `exp_name`).
    #[error("fd {0} is not a dma-buf (its fdinfo has no exp_name)")]
    NotDmaBuf(i32),
    /// A field that must be a number is not.
    #[error("dma-buf fdinfo field {field} is not a number: {value:?}")]
    BadField {
        /// The field.
        field: &'static str,
        /// Its text.
        value: String,
    },
}

/// A dma-buf's kernel facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DmaBufInfo {
    /// Size of the buffer in bytes.
    pub size: u64,
    /// The exporter's name (`nvidia`, `vfio-pci`, ...).
    pub exp_name: String,
    /// The buffer's name, if one was set.
    pub name: Option<String>,
    /// File references to the buffer, when the kernel prints it.
    pub count: Option<u64>,
}

impl DmaBufInfo {
    /// Reads the facts of the dma-buf `fd`.
    pub fn of(fd: impl AsFd) -> Result<Self, DmaBufError> {
        let raw = fd.as_fd().as_raw_fd();
        let path = format!("/proc/self/fdinfo/{raw}");
        let text =
            std::fs::read_to_string(&path).map_err(|source| DmaBufError::Io { path, source })?;
        Self::parse(&text).ok_or(DmaBufError::NotDmaBuf(raw))?
    }

    /// Parses fdinfo text: `None` if it is not a dma-buf's, an error if a number is bad.
    pub fn parse(text: &str) -> Option<Result<Self, DmaBufError>> {
        let field = |key: &str| {
            text.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == key).then(|| v.trim().to_string())
            })
        };
        let exp_name = field("exp_name")?;
        let number = |key: &'static str, v: String| {
            v.parse::<u64>().map_err(|_| DmaBufError::BadField {
                field: key,
                value: v,
            })
        };
        Some((|| {
            Ok(Self {
                size: number("size", field("size").unwrap_or_default())?,
                exp_name,
                name: field("name").filter(|n| !n.is_empty() && n != "<none>"),
                count: field("count").map(|v| number("count", v)).transpose()?,
            })
        })())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_dmabuf_fdinfo() {
        let text = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1234\nsize:\t2097152\n\
                    count:\t1\nexp_name:\tnvidia\nname:\tgpu0\n";
        let info = DmaBufInfo::parse(text).unwrap().unwrap();
        assert_eq!(info.size, 2 << 20);
        assert_eq!(info.exp_name, "nvidia");
        assert_eq!(info.name.as_deref(), Some("gpu0"));
        assert_eq!(info.count, Some(1));
    }

    #[test]
    fn other_fds_are_not_dmabufs() {
        assert!(DmaBufInfo::parse("pos:\t0\nflags:\t02\nmnt_id:\t1\n").is_none());
        let f = tempfile::tempfile().unwrap();
        assert!(matches!(DmaBufInfo::of(&f), Err(DmaBufError::NotDmaBuf(_))));
    }

    #[test]
    fn bad_size_is_an_error() {
        let r = DmaBufInfo::parse("size:\tlots\nexp_name:\tx\n").unwrap();
        assert!(matches!(
            r,
            Err(DmaBufError::BadField { field: "size", .. })
        ));
        let r = DmaBufInfo::parse("exp_name:\tx\n").unwrap();
        assert!(matches!(
            r,
            Err(DmaBufError::BadField { field: "size", .. })
        ));
    }
}
