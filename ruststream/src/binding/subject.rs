//! Subject patterns: `.`-separated tokens, `*` matches one token, `>` matches
//! one or more trailing tokens (the NATS convention, so subscriptions move
//! between the memory Core and NATS unchanged). The memory Core routes by
//! them; the JetStream binding reads a stream's subjects with them.

/// True when `pattern` contains a wildcard token.
pub(crate) fn is_pattern(pattern: &str) -> bool {
    pattern.split('.').any(|t| t == "*" || t == ">")
}

/// True when `subject` matches `pattern`.
pub(crate) fn matches(pattern: &str, subject: &str) -> bool {
    let mut subject_tokens = subject.split('.');
    for token in pattern.split('.') {
        match (token, subject_tokens.next()) {
            (">", Some(_)) => return true,
            ("*", Some(_)) => {}
            (t, Some(s)) if t == s => {}
            _ => return false,
        }
    }
    subject_tokens.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards() {
        assert!(matches("a.b", "a.b"));
        assert!(!matches("a.b", "a.b.c"));
        assert!(matches("a.*", "a.b"));
        assert!(!matches("a.*", "a.b.c"));
        assert!(matches("a.>", "a.b.c"));
        assert!(!matches("a.>", "a"));
        assert!(!matches("a.*.c", "a.b.d"));
        assert!(is_pattern("a.*") && is_pattern("a.>") && !is_pattern("a.b"));
    }
}
