//! What a test saw the app or handler send.

use std::fmt;
use std::sync::Mutex;

use crate::codec::Decode;
use crate::outgoing::OnPublish;
use crate::{Json, Message};

/// What a publish hook saw: every message the handler sent.
#[derive(Default)]
pub(crate) struct Recorder(pub(crate) Mutex<Vec<(String, Message)>>);

impl OnPublish for Recorder {
    fn on_publish(&self, subject: &str, message: &mut Message) {
        let mut sent = self.0.lock().unwrap_or_else(|e| e.into_inner());
        sent.push((subject.to_owned(), message.clone()));
    }
}

impl Recorder {
    /// Everything recorded so far, in order.
    pub(crate) fn all(&self) -> Vec<(String, Message)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// What was sent to `subject`, decoded as JSON; one that does not decode
    /// panics with everything sent.
    #[track_caller]
    pub(crate) fn decoded<T>(&self, subject: &str) -> Vec<T>
    where
        Json: Decode<T>,
    {
        let sent = self.all();
        sent.iter()
            .filter(|(s, _)| s == subject)
            .map(|(_, message)| match Json::decode(message.payload()) {
                Ok(value) => value,
                Err(err) => panic!(
                    "a message sent to `{subject}` is not a `{}`: {err}\nsent: {}",
                    std::any::type_name::<T>(),
                    Sent(&sent)
                ),
            })
            .collect()
    }
}

/// What was sent, one line per message, for failure output.
pub(crate) struct Sent<'a>(pub(crate) &'a [(String, Message)]);

impl fmt::Display for Sent<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("nothing");
        }
        for (subject, message) in self.0 {
            write!(
                f,
                "\n  {subject}: {}",
                String::from_utf8_lossy(message.payload())
            )?;
        }
        Ok(())
    }
}
