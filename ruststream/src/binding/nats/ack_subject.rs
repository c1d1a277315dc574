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
    let tokens = reply.strip_prefix("$JS.ACK.")?;
    let index = match tokens.bytes().filter(|&b| b == b'.').count() + 1 {
        7 => 2,
        n if n >= 9 => 4,
        _ => return None,
    };
    tokens.split('.').nth(index)?.parse().ok()
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

    #[test]
    fn other_subjects_have_none() {
        for reply in [
            "_INBOX.abc.def",
            "$JS.ACK.ORDERS.worker.3",
            "$JS.ACK.ORDERS.worker.x.120.118.1733559000000000000.7",
            "$JS.ACK.a.b.c.d.e.f.g.h",
            "",
        ] {
            assert_eq!(delivery_count(reply), None, "{reply}");
        }
    }
}
