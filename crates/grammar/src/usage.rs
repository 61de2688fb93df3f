//! Token counts out of a provider's usage object (docs/architecture.md §5, accounting). Usage stays
//! verbatim in the events; this reads the counts every provider reports under its own
//! names: Anthropic and OpenAI Responses (`input_tokens`, `output_tokens`,
//! `cache_read_input_tokens`, `output_tokens_details.reasoning_tokens`), OpenAI Chat
//! and its dialects (`prompt_tokens`, `completion_tokens`, `…_details.cached_tokens`,
//! `completion_tokens_details.reasoning_tokens`), Gemini (`promptTokenCount`,
//! `candidatesTokenCount`, `thoughtsTokenCount`, `cachedContentTokenCount`), ollama
//! (`prompt_eval_count`, `eval_count`), codex (`total.inputTokens`, …).
//!
//! Usage is cumulative within a run (a later lifecycle event restates or extends an
//! earlier one: Anthropic reports input at the start and output at the end), so a run's
//! tokens are the per-field maximum over its lifecycle usages ([`Tokens::max`]).

use crate::Json;
use serde_json::Value;

/// A run's token counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokens {
    /// Prompt tokens (cache reads included where the provider counts them so).
    pub input: u64,
    /// Generated tokens (reasoning included where the provider counts them so).
    pub output: u64,
    /// Reasoning tokens, where reported.
    pub reasoning: u64,
    /// Prompt tokens read from the provider's cache.
    pub cache_read: u64,
    /// Prompt tokens written to the provider's cache.
    pub cache_write: u64,
}

/// The first of `paths` (dot-separated) that holds a non-negative integer.
fn first(v: &Value, paths: &[&str]) -> u64 {
    paths
        .iter()
        .find_map(|p| {
            p.split('.')
                .try_fold(v, |v, k| v.get(k))
                .and_then(Value::as_u64)
        })
        .unwrap_or(0)
}

impl Tokens {
    /// The counts in one usage object (0 for what it does not report).
    pub fn from_usage(usage: &Json) -> Tokens {
        let Ok(v) = serde_json::from_str::<Value>(usage.get()) else {
            return Tokens::default();
        };
        Tokens {
            input: first(
                &v,
                &[
                    "input_tokens",
                    "prompt_tokens",
                    "promptTokenCount",
                    "prompt_eval_count",
                    "total.inputTokens",
                ],
            ),
            output: first(
                &v,
                &[
                    "output_tokens",
                    "completion_tokens",
                    "candidatesTokenCount",
                    "eval_count",
                    "total.outputTokens",
                ],
            ),
            reasoning: first(
                &v,
                &[
                    "output_tokens_details.reasoning_tokens",
                    "completion_tokens_details.reasoning_tokens",
                    "output_tokens_details.thinking_tokens",
                    "thoughtsTokenCount",
                    "total.reasoningOutputTokens",
                ],
            ),
            cache_read: first(
                &v,
                &[
                    "cache_read_input_tokens",
                    "prompt_tokens_details.cached_tokens",
                    "input_tokens_details.cached_tokens",
                    "cached_input_tokens",
                    "cachedContentTokenCount",
                    "prompt_cache_hit_tokens",
                    "total.cachedInputTokens",
                ],
            ),
            cache_write: first(
                &v,
                &[
                    "cache_creation_input_tokens",
                    "prompt_tokens_details.cache_write_tokens",
                ],
            ),
        }
    }

    /// Field by field, the larger (usage is cumulative within a run).
    pub fn max(self, o: Tokens) -> Tokens {
        Tokens {
            input: self.input.max(o.input),
            output: self.output.max(o.output),
            reasoning: self.reasoning.max(o.reasoning),
            cache_read: self.cache_read.max(o.cache_read),
            cache_write: self.cache_write.max(o.cache_write),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(json: &str) -> Tokens {
        Tokens::from_usage(&Json::parse(json).unwrap())
    }

    #[test]
    fn every_providers_names() {
        let anthropic = t(r#"{"input_tokens":10,"cache_read_input_tokens":4,"cache_creation_input_tokens":2,"output_tokens":1}"#)
            .max(t(r#"{"output_tokens":6}"#));
        assert_eq!(
            anthropic,
            Tokens {
                input: 10,
                output: 6,
                reasoning: 0,
                cache_read: 4,
                cache_write: 2
            }
        );
        let chat = t(
            r#"{"prompt_tokens":12,"completion_tokens":30,"prompt_tokens_details":{"cached_tokens":8},"completion_tokens_details":{"reasoning_tokens":20}}"#,
        );
        assert_eq!(
            chat,
            Tokens {
                input: 12,
                output: 30,
                reasoning: 20,
                cache_read: 8,
                cache_write: 0
            }
        );
        let gemini = t(r#"{"promptTokenCount":5,"candidatesTokenCount":7,"thoughtsTokenCount":3}"#);
        assert_eq!((gemini.input, gemini.output, gemini.reasoning), (5, 7, 3));
        let ollama = t(r#"{"prompt_eval_count":9,"eval_count":4}"#);
        assert_eq!((ollama.input, ollama.output), (9, 4));
        let codex = t(
            r#"{"total":{"inputTokens":100,"cachedInputTokens":60,"outputTokens":20,"reasoningOutputTokens":15},"last":{"inputTokens":1}}"#,
        );
        assert_eq!(
            codex,
            Tokens {
                input: 100,
                output: 20,
                reasoning: 15,
                cache_read: 60,
                cache_write: 0
            }
        );
        assert_eq!(t(r#"{"used":3}"#), Tokens::default());
    }
}
