//! What a JetStream message's ack subject says about its delivery, read
//! without parsing the rest: the client's `Message::info` parses every
//! token (the publish time into a date among them), thousands of
//! instructions per message for the one number a delivery needs.

/// The server's delivery count of the message whose ack subject is
/// `reply` (`$JS.ACK.<stream>.<consumer>.<delivered>.…`, 7 tokens after the
/// prefix; or, per ADR-15, `$JS.ACK.<domain>.<account>.<stream>.<consumer>.
/// <delivered>.…`, 9 or more). Stream and consumer names hold no `.`, so the
/// number of tokens tells the two apart. `None` for any other subject.
pub(super) fn delivery_count(reply: &str) -> Option<u64> {
    let tokens = reply.strip_prefix("$JS.ACK.")?.as_bytes();
    let dots = Dots::of(tokens);
    // The delivery count is token 2 of 7, or token 4 of 9 or more.
    let index = match dots.count + 1 {
        7 => 2,
        n if n >= 9 => 4,
        _ => return None,
    };
    let token = &tokens[dots.first[index - 1] + 1..dots.first[index]];
    if token.is_empty() {
        return None;
    }
    token.iter().try_fold(0u64, |count, &b| {
        let digit = b.checked_sub(b'0').filter(|d| *d < 10)?;
        count.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// Where the first five `.` of a subject are, and how many it has: read
/// eight bytes at a time (an ack subject is ~100 bytes, read on every
/// message).
struct Dots {
    first: [usize; 5],
    count: usize,
}

impl Dots {
    fn of(bytes: &[u8]) -> Self {
        let mut dots = Dots {
            first: [0; 5],
            count: 0,
        };
        let mut chunks = bytes.chunks_exact(8);
        let mut at = 0;
        for chunk in &mut chunks {
            let word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
            dots.add(at, dot_bytes(word));
            at += 8;
        }
        let mut tail = [0u8; 8];
        tail[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
        // The tail's padding is zeros, never a dot.
        dots.add(at, dot_bytes(u64::from_le_bytes(tail)));
        dots
    }

    /// Counts the dots `mask` marks (the high bit of each byte that is a dot)
    /// in the eight bytes starting at `at`.
    fn add(&mut self, at: usize, mut mask: u64) {
        while mask != 0 && self.count < self.first.len() {
            self.first[self.count] = at + mask.trailing_zeros() as usize / 8;
            self.count += 1;
            mask &= mask - 1;
        }
        self.count += mask.count_ones() as usize;
    }
}

/// The high bit of each byte of `word` that is `.`, and no other bit.
fn dot_bytes(word: u64) -> u64 {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    let zero_where_dot = word ^ u64::from_ne_bytes([b'.'; 8]);
    !(((zero_where_dot & LOW7) + LOW7) | zero_where_dot | LOW7)
}

/// The attempt a JetStream message is on: the server's delivery count (1
/// when its ack subject says none).
pub(super) fn attempt(message: &async_nats::Message) -> u32 {
    message
        .reply
        .as_ref()
        .and_then(|reply| delivery_count(reply.as_str()))
        .map_or(1, |delivered| u32::try_from(delivered).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delivery_count_is_read_from_both_formats() {
        let v1 = "$JS.ACK.ORDERS.worker.3.120.118.1733559000000000000.7";
        let v2 = "$JS.ACK._.ACCHASH.ORDERS.worker.5.120.118.1733559000000000000.7";
        let v2_token = "$JS.ACK.hub.ACCHASH.ORDERS.worker.1.120.118.1733559000000000000.0.r4nd";
        assert_eq!(delivery_count(v1), Some(3));
        assert_eq!(delivery_count(v2), Some(5));
        assert_eq!(delivery_count(v2_token), Some(1));
    }

    /// The same, by splitting: what the eight-bytes-at-a-time reading must
    /// agree with.
    fn by_split(reply: &str) -> Option<u64> {
        let tokens: Vec<&str> = reply.strip_prefix("$JS.ACK.")?.split('.').collect();
        let token = match tokens.len() {
            7 => tokens[2],
            n if n >= 9 => tokens[4],
            _ => return None,
        };
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        token.parse().ok()
    }

    #[test]
    fn every_length_and_position_agrees_with_splitting() {
        for prefix_len in 0..20 {
            for delivered in ["1", "7", "42", "18446744073709551615"] {
                let stream = "s".repeat(prefix_len);
                for reply in [
                    format!("$JS.ACK.{stream}.c.{delivered}.120.118.17335.7"),
                    format!("$JS.ACK._.acc.{stream}.c.{delivered}.120.118.17335.7"),
                    format!("$JS.ACK.d.acc.{stream}.cons.{delivered}.1.1.1.0.tok.more"),
                    format!("$JS.ACK.{stream}.{delivered}.1.1.1.1.1.1"),
                ] {
                    assert_eq!(delivery_count(&reply), by_split(&reply), "{reply}");
                }
            }
        }
    }

    #[test]
    fn other_subjects_have_none() {
        for reply in [
            "_INBOX.abc.def",
            "$JS.ACK.ORDERS.worker.3",
            "$JS.ACK.ORDERS.worker.x.120.118.1733559000000000000.7",
            "$JS.ACK.a.b.c.d.e.f.g.h",
            "$JS.ACK.ORDERS.worker..120.118.1733559000000000000.7",
            "$JS.ACK.ORDERS.worker.99999999999999999999.1.1.1.1",
            "",
        ] {
            assert_eq!(delivery_count(reply), None, "{reply}");
        }
    }
}
