//! The records of one checkpoint interval, serialized for Kafka into one buffer: what the
//! exactly-once sink keeps in its checkpoint until the checkpoint's transaction commits.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// The batch of the records after the last checkpoint, at end of input: committed when the
/// whole job finishes. It is the largest checkpoint id a marker offset (an `i64`) can hold.
pub(crate) const FINAL: u64 = i64::MAX as u64;

/// The records that went into the sink between two checkpoints, as `(key, value)` pairs:
/// `[key length u32 LE, or u32::MAX for none][key][value length u32 LE][value]`, repeated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PendingBatch {
    /// The checkpoint whose barrier closed it ([`FINAL`] at end of input).
    pub checkpoint: u64,
    /// How many records.
    pub records: u64,
    /// The records.
    pub bytes: Bytes,
}

/// The batch being filled.
#[derive(Default)]
pub(crate) struct OpenBatch {
    bytes: Vec<u8>,
    records: u64,
}

impl OpenBatch {
    /// Appends one record.
    pub(crate) fn push(&mut self, key: Option<&[u8]>, value: &[u8]) {
        match key {
            Some(k) => {
                self.bytes
                    .extend_from_slice(&(k.len() as u32).to_le_bytes());
                self.bytes.extend_from_slice(k);
            }
            None => self.bytes.extend_from_slice(&u32::MAX.to_le_bytes()),
        }
        self.bytes
            .extend_from_slice(&(value.len() as u32).to_le_bytes());
        self.bytes.extend_from_slice(value);
        self.records += 1;
    }

    /// Closes the batch as `checkpoint`'s; `None` when it is empty (no transaction needed).
    pub(crate) fn seal(&mut self, checkpoint: u64) -> Option<PendingBatch> {
        if self.records == 0 {
            return None;
        }
        let records = std::mem::take(&mut self.records);
        let bytes = std::mem::take(&mut self.bytes);
        Some(PendingBatch {
            checkpoint,
            records,
            bytes: Bytes::from(bytes),
        })
    }
}

impl PendingBatch {
    /// The records, in the order they came; a damaged buffer ends the iteration early, which
    /// [`check`](Self::check) finds first.
    pub(crate) fn records(&self) -> Records<'_> {
        Records { rest: &self.bytes }
    }

    /// Whether the buffer holds exactly `records` well-formed records.
    pub(crate) fn check(&self) -> Result<(), String> {
        let mut it = self.records();
        let mut n = 0u64;
        while it.next().is_some() {
            n += 1;
        }
        if n != self.records || !it.rest.is_empty() {
            return Err(format!(
                "the pending Kafka batch of checkpoint {} is damaged: it should hold {} records \
                 and holds {n} well-formed ones, with {} bytes left over",
                self.checkpoint,
                self.records,
                it.rest.len()
            ));
        }
        Ok(())
    }
}

/// The records of a batch.
pub(crate) struct Records<'a> {
    rest: &'a [u8],
}

impl<'a> Records<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.rest.len() < n {
            return None;
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Some(head)
    }

    fn len(&mut self) -> Option<u32> {
        let b = self.take(4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = (Option<&'a [u8]>, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let save = self.rest;
        let key = match self.len()? {
            u32::MAX => None,
            n => match self.take(n as usize) {
                Some(k) => Some(k),
                None => {
                    self.rest = save;
                    return None;
                }
            },
        };
        let value = self.len().and_then(|n| self.take(n as usize));
        match value {
            Some(v) => Some((key, v)),
            None => {
                self.rest = save;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_come_back_in_order_and_damage_is_found() {
        let mut open = OpenBatch::default();
        assert!(open.seal(1).is_none());
        open.push(Some(b"seven"), b"3");
        open.push(None, b"");
        open.push(Some(b""), b"x");
        let batch = open.seal(4).unwrap();
        assert_eq!(batch.checkpoint, 4);
        let got: Vec<_> = batch.records().collect();
        assert_eq!(
            got,
            vec![
                (Some(&b"seven"[..]), &b"3"[..]),
                (None, &b""[..]),
                (Some(&b""[..]), &b"x"[..])
            ]
        );
        batch.check().unwrap();
        assert!(open.seal(5).is_none(), "sealing empties the batch");
        let mut cut = batch.clone();
        cut.bytes = cut.bytes.slice(..cut.bytes.len() - 1);
        assert!(cut.check().unwrap_err().contains("damaged"));
        let mut miscounted = batch;
        miscounted.records = 4;
        assert!(miscounted.check().is_err());
    }
}
