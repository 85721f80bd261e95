//! In-flight data of unaligned checkpoints: which channel a section belongs to, the handle a
//! checkpoint records for it, and the channel-state file format (magic `WCHS`, version 1).
//!
//! A subtask's channel state is one file per checkpoint holding sections:
//! - *output* sections: the buffers its barrier overtook in its output queues;
//! - *input* sections: what each input channel delivered between the subtask's snapshot and that
//!   channel's barrier (including the buffers the barrier overtook inside the channel).
//!
//! A section's data is a sequence of batches, each `length (u32 LE) | postcard Vec<T>`; the
//! typed end of the channel encodes and decodes it. The file is a [`crate::codec`] envelope, so
//! a truncated or corrupt file is detected and named. `docs/channel-state-format.md` has the
//! byte layout.

use crate::CoreError;
pub use crate::handle::{ChannelDirection, ChannelInfo, ChannelSectionSummary, ChannelStateHandle};
use serde::{Deserialize, Serialize, de::DeserializeOwned};

/// Magic bytes of a channel-state file.
pub const CHANNEL_STATE_MAGIC: [u8; 4] = *b"WCHS";
/// The format version this build writes.
pub const CHANNEL_STATE_VERSION: u16 = 1;

/// One channel's in-flight data.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelSection {
    /// Which end persisted it.
    pub direction: ChannelDirection,
    /// The channel.
    pub channel: ChannelInfo,
    /// Number of records.
    pub records: u64,
    /// The batches: each `length (u32 LE) | postcard Vec<T>`.
    pub data: Vec<u8>,
}

impl ChannelSection {
    /// An empty section.
    pub fn new(direction: ChannelDirection, channel: ChannelInfo) -> ChannelSection {
        ChannelSection {
            direction,
            channel,
            records: 0,
            data: Vec::new(),
        }
    }

    /// Appends one batch.
    pub fn append_batch<T: Serialize>(&mut self, batch: &[T]) -> Result<(), CoreError> {
        let at = self.data.len();
        self.data.extend_from_slice(&[0; 4]);
        crate::codec::encode_into("in-flight batch", batch, &mut self.data)?;
        let len = (self.data.len() - at - 4) as u32;
        self.data[at..at + 4].copy_from_slice(&len.to_le_bytes());
        self.records += batch.len() as u64;
        Ok(())
    }

    fn what(&self) -> String {
        format!("in-flight data of channel {}", self.channel)
    }

    /// The encoded batches, each checked to lie within the section.
    fn frames(&self) -> Result<Vec<&[u8]>, CoreError> {
        let corrupt = |reason: String| CoreError::Corrupt {
            what: self.what(),
            reason,
        };
        let mut out = Vec::new();
        let mut rest = &self.data[..];
        while !rest.is_empty() {
            if rest.len() < 4 {
                return Err(corrupt(format!(
                    "{} stray bytes after the last batch",
                    rest.len()
                )));
            }
            let len = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
            rest = &rest[4..];
            if rest.len() < len {
                return Err(corrupt(format!(
                    "a batch of {len} bytes is cut off after {} bytes",
                    rest.len()
                )));
            }
            out.push(&rest[..len]);
            rest = &rest[len..];
        }
        Ok(out)
    }

    /// Checks the batch framing and each batch's record count against the section's, without
    /// knowing the record type (a postcard `Vec` starts with its length).
    pub fn verify(&self) -> Result<(), CoreError> {
        let mut records = 0u64;
        for frame in self.frames()? {
            let (n, _): (u64, _) = crate::codec::decode_prefix(&self.what(), frame)?;
            records += n;
        }
        self.check_count(records)
    }

    fn check_count(&self, records: u64) -> Result<(), CoreError> {
        if records != self.records {
            return Err(CoreError::Corrupt {
                what: self.what(),
                reason: format!(
                    "{records} records decoded, the section header says {}",
                    self.records
                ),
            });
        }
        Ok(())
    }

    /// Decodes the batches, in order.
    pub fn batches<T: DeserializeOwned>(&self) -> Result<Vec<Vec<T>>, CoreError> {
        let what = self.what();
        let mut out = Vec::new();
        let mut records = 0u64;
        for frame in self.frames()? {
            let batch: Vec<T> = crate::codec::decode(&what, frame)?;
            records += batch.len() as u64;
            out.push(batch);
        }
        self.check_count(records)?;
        Ok(out)
    }

    /// What a handle records of the section.
    pub fn summary(&self) -> ChannelSectionSummary {
        ChannelSectionSummary {
            direction: self.direction,
            channel: self.channel,
            records: self.records,
            bytes: self.data.len() as u64,
        }
    }
}

/// Encodes a channel-state file.
pub fn encode_file(sections: &[ChannelSection]) -> Result<Vec<u8>, CoreError> {
    let payload = crate::codec::encode("channel state", sections)?;
    Ok(crate::codec::seal(
        CHANNEL_STATE_MAGIC,
        CHANNEL_STATE_VERSION,
        &payload,
    ))
}

/// Decodes and checks a channel-state file; `what` names it in errors.
pub fn decode_file(what: &str, bytes: &[u8]) -> Result<Vec<ChannelSection>, CoreError> {
    let (_, payload) =
        crate::codec::open(what, CHANNEL_STATE_MAGIC, &[CHANNEL_STATE_VERSION], bytes)?;
    crate::codec::decode(what, payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::OperatorId;

    fn info() -> ChannelInfo {
        ChannelInfo {
            from: OperatorId::from_uid("a"),
            to: OperatorId::from_uid("b"),
            producer: 1,
            consumer: 0,
        }
    }

    #[test]
    fn sections_round_trip_through_a_file() {
        let mut s = ChannelSection::new(ChannelDirection::Output, info());
        s.append_batch(&[1u64, 2, 3]).unwrap();
        s.append_batch(&[4u64]).unwrap();
        let e = ChannelSection::new(ChannelDirection::Input, info());
        let bytes = encode_file(&[s.clone(), e.clone()]).unwrap();
        let back = decode_file("f", &bytes).unwrap();
        assert_eq!(back, vec![s.clone(), e]);
        assert_eq!(
            back[0].batches::<u64>().unwrap(),
            vec![vec![1, 2, 3], vec![4]]
        );
        assert_eq!(s.summary().records, 4);
    }

    #[test]
    fn corruption_is_detected_and_named() {
        let mut s = ChannelSection::new(ChannelDirection::Input, info());
        s.append_batch(&["x".to_string()]).unwrap();
        let mut bytes = encode_file(&[s.clone()]).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
        let err = decode_file("chk-3/v1-0-channels", &bytes)
            .unwrap_err()
            .to_string();
        assert!(err.contains("chk-3/v1-0-channels"), "{err}");
        let mut cut = s.clone();
        cut.data.truncate(cut.data.len() - 1);
        let err = cut.batches::<String>().unwrap_err().to_string();
        assert!(err.contains("cut off"), "{err}");
        let mut lying = s.clone();
        lying.records = 7;
        let err = lying.batches::<String>().unwrap_err().to_string();
        assert!(err.contains("7"), "{err}");
        let err = lying.verify().unwrap_err().to_string();
        assert!(err.contains("says 7"), "{err}");
        s.verify().unwrap();
    }
}
