//! The zstd codec of compressed key-group sections, present with the `zstd` feature; without
//! it, every use is an error that names the missing feature.

/// Why zstd is refused in a build without it.
#[cfg_attr(feature = "zstd", allow(dead_code))]
pub(crate) const MISSING: &str = "zstd is not in this build: build with weir-state's `zstd` feature (weir-runtime's and \
     weir-examples' `zstd` turn it on)";

/// The zstd compression level of `Compression::Zstd`: the fastest, as
/// checkpoints are on the hot path. (Readers need not know it.)
pub const ZSTD_LEVEL: i32 = 1;

/// Whether this build has zstd.
pub(crate) const AVAILABLE: bool = cfg!(feature = "zstd");

/// A zstd compressor at [`ZSTD_LEVEL`], kept across sections (it owns a context).
pub(crate) struct Compressor {
    #[cfg(feature = "zstd")]
    inner: zstd::bulk::Compressor<'static>,
}

impl Compressor {
    /// A compressor, or why there is none.
    #[cfg(feature = "zstd")]
    pub(crate) fn new() -> Result<Compressor, String> {
        let inner = zstd::bulk::Compressor::new(ZSTD_LEVEL).map_err(|e| format!("zstd: {e}"))?;
        Ok(Compressor { inner })
    }

    /// A compressor, or why there is none.
    #[cfg(not(feature = "zstd"))]
    pub(crate) fn new() -> Result<Compressor, String> {
        Err(MISSING.to_string())
    }

    /// Compresses `blocks` into `out` from `start` on (growing it to the bound first); the
    /// compressed length.
    #[cfg(feature = "zstd")]
    pub(crate) fn compress(
        &mut self,
        blocks: &[u8],
        out: &mut Vec<u8>,
        start: usize,
    ) -> Result<usize, String> {
        out.resize(start + zstd::zstd_safe::compress_bound(blocks.len()), 0);
        self.inner
            .compress_to_buffer(blocks, &mut out[start..])
            .map_err(|e| format!("zstd: {e}"))
    }

    /// Compresses `blocks` into `out` from `start` on; never reached without zstd.
    #[cfg(not(feature = "zstd"))]
    pub(crate) fn compress(
        &mut self,
        _blocks: &[u8],
        _out: &mut Vec<u8>,
        _start: usize,
    ) -> Result<usize, String> {
        Err(MISSING.to_string())
    }
}

/// Decompresses one frame that must hold exactly `len` bytes. The frame records its content
/// size (Weir's writer always has it written): a header that does not parse, or a size other
/// than `len`, is refused before `len` bytes are allocated.
#[cfg(feature = "zstd")]
pub(crate) fn decompress(payload: &[u8], len: usize) -> Result<Vec<u8>, String> {
    match zstd::zstd_safe::get_frame_content_size(payload) {
        Ok(Some(size)) if size != len as u64 => {
            return Err(format!(
                "the zstd frame holds {size} bytes, the section claims {len}; refusing to allocate"
            ));
        }
        Ok(_) => {}
        Err(_) => {
            return Err(
                "zstd cannot decompress the blocks: the frame header does not parse".to_string(),
            );
        }
    }
    zstd::bulk::decompress(payload, len)
        .map_err(|e| format!("zstd cannot decompress the blocks: {e}"))
}

/// Decompresses one frame; without zstd, the error naming the feature.
#[cfg(not(feature = "zstd"))]
pub(crate) fn decompress(_payload: &[u8], _len: usize) -> Result<Vec<u8>, String> {
    Err(format!(
        "the section is compressed with zstd, and {MISSING}"
    ))
}
