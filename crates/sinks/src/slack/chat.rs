//! A Slack chat id: `<channel>[/<thread_ts>[/<user>]]`.

/// Where in Slack a chat id points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlackChat<'a> {
    /// Channel (`C…`, `G…`) or DM (`D…`) id.
    pub channel: &'a str,
    /// The thread's parent message, when the chat is a thread.
    pub thread_ts: Option<&'a str>,
    /// The user the thread answers (Slack's `recipient_user_id`), when named.
    pub user: Option<&'a str>,
}

impl SlackChat<'_> {
    /// Splits a chat id; empty parts count as absent.
    pub fn parse(chat_id: &str) -> SlackChat<'_> {
        let mut parts = chat_id.splitn(3, '/');
        let channel = parts.next().unwrap_or("");
        let thread_ts = parts.next().filter(|s| !s.is_empty());
        let user = parts.next().filter(|s| !s.is_empty());
        SlackChat {
            channel,
            thread_ts,
            user,
        }
    }

    /// A direct-message conversation (Slack ids of DMs start with `D`).
    pub fn is_dm(&self) -> bool {
        self.channel.starts_with('D')
    }
}

#[cfg(test)]
mod tests {
    use super::SlackChat;

    #[test]
    fn parses_channel_thread_and_user() {
        let c = SlackChat::parse("C1/1700000000.000100/U9");
        assert_eq!(
            (c.channel, c.thread_ts, c.user),
            ("C1", Some("1700000000.000100"), Some("U9"))
        );
        let c = SlackChat::parse("D1");
        assert_eq!((c.channel, c.thread_ts, c.user), ("D1", None, None));
        assert!(c.is_dm());
        assert_eq!(SlackChat::parse("C1//").thread_ts, None);
    }
}
