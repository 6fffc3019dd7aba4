//! The protobuf wire format, by hand, for the few messages the library reads and writes
//! itself (ORCA's load reports and their out-of-band request, the probes): a reader that
//! follows the rules a generated decoder follows (unknown fields of every wire type skipped,
//! groups included; field number 0, a truncated varint or length, a length past the end, an
//! unmatched end of group, a reserved wire type: malformed), and the writers of varints and
//! doubles. `prost` would be a dependency of every build for three small messages.

pub(crate) const VARINT: u8 = 0;
pub(crate) const FIXED64: u8 = 1;
pub(crate) const LEN: u8 = 2;
pub(crate) const START_GROUP: u8 = 3;
pub(crate) const END_GROUP: u8 = 4;
pub(crate) const FIXED32: u8 = 5;

/// Groups nest at most this deep before the report counts as malformed (a bound on the work
/// garbage can make us do; protobuf's own limit is 100).
pub(crate) const MAX_DEPTH: u32 = 100;

/// Reads a message's fields from the front of a buffer; `None` where it does not parse.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf }
    }

    /// Whether every field has been read.
    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub(crate) fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for i in 0..10 {
            let (&b, rest) = self.buf.split_first()?;
            self.buf = rest;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                // The tenth byte may carry one bit only.
                return (i < 9 || b <= 1).then_some(v);
            }
        }
        None
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.buf.len() {
            return None;
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Some(head)
    }

    pub(crate) fn double(&mut self) -> Option<f64> {
        let b = self.bytes(8)?;
        Some(f64::from_le_bytes(b.try_into().ok()?))
    }

    pub(crate) fn len_delimited(&mut self) -> Option<&'a [u8]> {
        let n = usize::try_from(self.varint()?).ok()?;
        self.bytes(n)
    }

    /// The next field's number and wire type.
    pub(crate) fn key(&mut self) -> Option<(u32, u8)> {
        // A key is a 32-bit value: field numbers end at 2^29 - 1.
        let k = u32::try_from(self.varint()?).ok()?;
        let field = k >> 3;
        if field == 0 {
            return None;
        }
        Some((field, (k & 7) as u8))
    }

    /// Skips the value of a field of this wire type (a group up to its end).
    pub(crate) fn skip(&mut self, field: u32, wire: u8, depth: u32) -> Option<()> {
        match wire {
            VARINT => {
                self.varint()?;
            }
            FIXED64 => {
                self.bytes(8)?;
            }
            LEN => {
                self.len_delimited()?;
            }
            FIXED32 => {
                self.bytes(4)?;
            }
            START_GROUP => {
                if depth >= MAX_DEPTH {
                    return None;
                }
                loop {
                    let (f, w) = self.key()?;
                    if w == END_GROUP {
                        return (f == field).then_some(());
                    }
                    self.skip(f, w, depth + 1)?;
                }
            }
            _ => return None,
        }
        Some(())
    }
}

pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(crate) fn put_double(out: &mut Vec<u8>, field: u32, v: f64) {
    // proto3: a field at its default is not written.
    if v != 0.0 {
        put_varint(out, u64::from(field) << 3 | u64::from(FIXED64));
        out.extend_from_slice(&v.to_le_bytes());
    }
}

pub(crate) fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}
