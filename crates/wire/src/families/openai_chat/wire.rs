//! Borrowing serde shapes of one Chat Completions chunk.
//!
//! Every chunk is parsed once into these structs. Strings borrow from the frame when they
//! carry no escapes; provider objects passed through verbatim (usage, errors, metadata)
//! stay `&RawValue`. Scalar fields are lenient ([`Text`], [`Num`]): a dialect that puts an
//! unexpected type in a field we only probe must not turn the whole chunk into a
//! `malformed_frame`.

use crate::families::exact_frame::{once, Cursor, List};
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

/// One `chat.completion.chunk` (or a pioneer / OpenRouter variant of it).
///
/// [`hot_chunk`] reads the common chunk without serde and skips the members it lists as
/// not this struct's (`id`, `model`, …): a field of that name added here must be read
/// there too.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Chunk<'a> {
    #[serde(borrow, default)]
    pub choices: Option<Vec<Choice<'a>>>,
    /// Top-level usage (OpenAI, OpenRouter, DeepSeek, pioneer's trailing chunk).
    #[serde(borrow, default)]
    pub usage: Option<&'a RawValue>,
    /// OpenRouter's in-chunk mid-stream error.
    #[serde(borrow, default)]
    pub error: Option<&'a RawValue>,
    /// pioneer's post-stop metadata chunk.
    #[serde(borrow, default)]
    pub x_pioneer: Option<&'a RawValue>,
    /// Moderated completions: the moderation results of the input and the generated
    /// output (`{input, output}`), sent once the whole output exists.
    #[serde(borrow, default)]
    pub moderation: Option<&'a RawValue>,
}

/// `choices[i]`.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Choice<'a> {
    #[serde(borrow, default)]
    pub delta: Option<Delta<'a>>,
    #[serde(borrow, default)]
    pub finish_reason: Text<'a>,
    #[serde(borrow, default)]
    pub native_finish_reason: Text<'a>,
    /// Moonshot puts usage here, on the stop chunk.
    #[serde(borrow, default)]
    pub usage: Option<&'a RawValue>,
    /// Per-token log probabilities; present (not `null`) only when they were requested.
    #[serde(borrow, default)]
    pub logprobs: Option<&'a RawValue>,
}

/// `choices[i].delta`.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Delta<'a> {
    #[serde(borrow, default)]
    pub content: Content<'a>,
    #[serde(borrow, default)]
    pub refusal: Text<'a>,
    #[serde(borrow, default)]
    pub reasoning_details: Option<Vec<Detail<'a>>>,
    #[serde(borrow, default)]
    pub reasoning_content: Text<'a>,
    #[serde(borrow, default)]
    pub reasoning: Text<'a>,
    #[serde(borrow, default)]
    pub reasoning_text: Text<'a>,
    #[serde(borrow, default)]
    pub tool_calls: Option<Vec<ToolCall<'a>>>,
    #[serde(borrow, default)]
    pub function_call: Option<FunctionCall<'a>>,
    /// Audio output (`{id, data, transcript, expires_at}`), read through [`transcript`]
    /// so that an unexpected shape never fails the chunk.
    #[serde(borrow, default)]
    pub audio: Option<&'a RawValue>,
    /// OpenRouter's web-search citations (`url_citation` entries), verbatim.
    #[serde(borrow, default)]
    pub annotations: Option<&'a RawValue>,
    /// Usage nested in the delta (documented Moonshot variant).
    #[serde(borrow, default)]
    pub usage: Option<&'a RawValue>,
}

/// One `reasoning_details[]` entry (OpenRouter's structured reasoning lane).
#[derive(Debug, Deserialize)]
pub(super) struct Detail<'a> {
    #[serde(rename = "type", borrow, default)]
    pub kind: Text<'a>,
    #[serde(borrow, default)]
    pub text: Text<'a>,
    #[serde(borrow, default)]
    pub summary: Text<'a>,
    #[serde(borrow, default)]
    pub signature: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub data: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub id: Text<'a>,
    #[serde(borrow, default)]
    pub format: Text<'a>,
    #[serde(borrow, default)]
    pub index: Option<&'a RawValue>,
}

/// One `tool_calls[]` delta: a function call, or a custom-tool call (`type: "custom"`).
#[derive(Debug, Deserialize)]
pub(super) struct ToolCall<'a> {
    #[serde(default)]
    pub index: Num,
    #[serde(borrow, default)]
    pub id: Text<'a>,
    #[serde(borrow, default)]
    pub function: Option<FunctionCall<'a>>,
    #[serde(borrow, default)]
    pub custom: Option<CustomCall<'a>>,
}

impl<'a> ToolCall<'a> {
    /// The call's name and this delta's piece of its input: `function.name` and
    /// `function.arguments`, or a custom call's `custom.name` and `custom.input`.
    pub fn name_and_input(&self) -> (Option<Cow<'a, str>>, Option<Cow<'a, str>>) {
        let function = self.function.as_ref();
        let custom = self.custom.as_ref();
        let name = function
            .and_then(|f| f.name.0.clone())
            .or_else(|| custom.and_then(|c| c.name.0.clone()));
        let input = function
            .and_then(FunctionCall::arguments_text)
            .or_else(|| custom.and_then(|c| c.input.and_then(raw_text)));
        (name, input)
    }
}

/// `custom` of a custom-tool call: its name and free-form input (a string fragment).
#[derive(Debug, Deserialize)]
pub(super) struct CustomCall<'a> {
    #[serde(borrow, default)]
    pub name: Text<'a>,
    #[serde(borrow, default)]
    pub input: Option<&'a RawValue>,
}

/// `function` of a tool call, or the legacy `delta.function_call`.
#[derive(Debug, Deserialize)]
pub(super) struct FunctionCall<'a> {
    #[serde(borrow, default)]
    pub name: Text<'a>,
    /// A JSON string fragment normally; some OpenAI-compatible servers send an object.
    #[serde(borrow, default)]
    pub arguments: Option<&'a RawValue>,
}

impl<'a> FunctionCall<'a> {
    /// The argument text: the string's value, or an object's JSON text.
    pub fn arguments_text(&self) -> Option<Cow<'a, str>> {
        self.arguments.and_then(raw_text)
    }
}

/// A string's value, or any other value's JSON text (`null` is absent).
fn raw_text(raw: &RawValue) -> Option<Cow<'_, str>> {
    let text = raw.get();
    if text.starts_with('"') {
        serde_json::from_str::<Cow<'_, str>>(text).ok()
    } else {
        (text != "null").then_some(Cow::Borrowed(text))
    }
}

/// The transcript fragment of a `delta.audio` object, when it carries one. The audio
/// bytes (`data`) are skipped unread: they never leave `SG_RAW`.
pub(super) fn transcript(audio: &RawValue) -> Option<Cow<'_, str>> {
    #[derive(Deserialize)]
    struct Audio<'a> {
        #[serde(borrow, default)]
        transcript: Text<'a>,
    }
    serde_json::from_str::<Audio<'_>>(audio.get())
        .ok()
        .and_then(|a| a.transcript.0)
}

/// One typed part of an array-form `content`.
#[derive(Debug, Deserialize)]
pub(super) struct Part<'a> {
    #[serde(rename = "type", borrow, default)]
    pub kind: Text<'a>,
    #[serde(borrow, default)]
    pub text: Text<'a>,
    #[serde(borrow, default)]
    pub output_text: Text<'a>,
    #[serde(borrow, default)]
    pub content: Text<'a>,
    /// A `thinking` part's body (Mistral's reasoning models): a string, or typed parts
    /// of its own (`[{"type":"text","text":"…"}]`).
    #[serde(borrow, default)]
    pub thinking: Content<'a>,
}

impl<'a> Part<'a> {
    /// The part's text, whichever field carries it.
    pub fn into_text(self) -> Option<Cow<'a, str>> {
        self.text.0.or(self.output_text.0).or(self.content.0)
    }

    /// A thinking part's text: its `thinking` body (a string, or its parts' texts in
    /// order), else its text field.
    pub fn into_thinking_text(self) -> Option<Cow<'a, str>> {
        let Part {
            thinking,
            text,
            output_text,
            content,
            ..
        } = self;
        match thinking {
            Content::Text(t) => Some(t),
            Content::Parts(parts) => {
                let texts: Vec<Cow<'a, str>> =
                    parts.into_iter().filter_map(Part::into_text).collect();
                match texts.len() {
                    0 => None,
                    1 => texts.into_iter().next(),
                    _ => Some(Cow::Owned(texts.concat())),
                }
            }
            Content::Absent | Content::Other(_) => text.0.or(output_text.0).or(content.0),
        }
    }
}

/// `delta.content`: a string (the norm), `null` (DeepSeek during reasoning: absent), an
/// array of typed parts, or something unsupported.
#[derive(Debug, Default)]
pub(super) enum Content<'a> {
    /// Absent or `null`.
    #[default]
    Absent,
    /// A text fragment.
    Text(Cow<'a, str>),
    /// Typed parts.
    Parts(Vec<Part<'a>>),
    /// Any other JSON type (its name, for the diagnostic).
    Other(&'static str),
}

impl<'de: 'a, 'a> Deserialize<'de> for Content<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Content<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("content")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Content::Text(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Content::Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(Content::Text(Cow::Owned(v)))
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(Content::Absent)
            }
            fn visit_none<E>(self) -> Result<Self::Value, E> {
                Ok(Content::Absent)
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Content::Other("boolean"))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Content::Other("number"))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Content::Other("number"))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Content::Other("number"))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut parts = Vec::new();
                while let Some(p) = seq.next_element::<Lenient<Part<'a>>>()? {
                    if let Some(p) = p.0 {
                        parts.push(p);
                    }
                }
                Ok(Content::Parts(parts))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Content::Other("object"))
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// A part that is not an object is skipped, not fatal.
struct Lenient<T>(Option<T>);

impl<'de: 'a, 'a> Deserialize<'de> for Lenient<Part<'a>> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw: &'de RawValue = Deserialize::deserialize(d)?;
        Ok(Lenient(serde_json::from_str::<Part<'de>>(raw.get()).ok()))
    }
}

/// A string field read leniently: any non-string value (null, number, object, …) reads
/// as absent instead of failing the chunk.
#[derive(Debug, Default)]
pub(super) struct Text<'a>(pub Option<Cow<'a, str>>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Text<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Some(Cow::Borrowed(v))))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Text(Some(Cow::Owned(v.to_owned()))))
            }
            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(Text(Some(Cow::Owned(v))))
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(Text(None))
            }
            fn visit_none<E>(self) -> Result<Self::Value, E> {
                Ok(Text(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Text(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Text(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Text(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Text(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Text(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Text(None))
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// A non-negative integer field read leniently (anything else reads as absent).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Num(pub Option<u64>);

impl<'de> Deserialize<'de> for Num {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Num;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number")
            }
            fn visit_u64<E>(self, v: u64) -> Result<Num, E> {
                Ok(Num(Some(v)))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Num, E> {
                Ok(Num(u64::try_from(v).ok()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Num, E> {
                let ok = v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < 1.8e19;
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                Ok(Num(ok.then_some(v as u64)))
            }
            fn visit_str<E>(self, _: &str) -> Result<Num, E> {
                Ok(Num(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Num, E> {
                Ok(Num(None))
            }
            fn visit_unit<E>(self) -> Result<Num, E> {
                Ok(Num(None))
            }
            fn visit_none<E>(self) -> Result<Num, E> {
                Ok(Num(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Num, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Num(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Num, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Num(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// The reasoning-token count inside a usage object, wherever the dialect put it.
pub(super) fn reasoning_tokens(usage: &RawValue) -> Option<u64> {
    #[derive(Deserialize)]
    struct Usage {
        #[serde(default)]
        completion_tokens_details: Option<Details>,
        #[serde(default)]
        output_tokens_details: Option<Details>,
    }
    #[derive(Deserialize)]
    struct Details {
        #[serde(default)]
        reasoning_tokens: Num,
    }
    let u: Usage = serde_json::from_str(usage.get()).ok()?;
    u.completion_tokens_details
        .and_then(|d| d.reasoning_tokens.0)
        .or_else(|| u.output_tokens_details.and_then(|d| d.reasoning_tokens.0))
}

/// The chunks nearly every long run is made of — text or reasoning pieces, with nothing
/// finished yet — read member by member ([`exact_frame`]: any key order and spacing, as
/// providers and routers each write their own) into a [`TextChunk`]: only what such a
/// chunk can hold, handed straight to the adapter's text handling instead of being built
/// into the wide [`Chunk`] and moved through it (that memcpy was an eighth of the family's
/// time, `perf`). `None` for any other chunk (a finish reason, usage, tool calls, a member
/// this reading does not know), which is then read the generic way; a test holds
/// [`TextChunk::into_chunk`] equal to what serde reads (docs/performance.md has the
/// measurement).
///
/// [`exact_frame`]: crate::families::exact_frame
pub(super) fn hot_chunk(data: &str) -> Option<TextChunk<'_>> {
    let mut choices = None;
    let mut usage_null = None;
    let mut c = Cursor::new(data);
    c.object(|key, c| match key {
        "choices" => once(&mut choices, c.list(hot_choice)),
        // serde reads a `null` usage as absent (a duplicate still counts).
        "usage" => once(&mut usage_null, c.literal("null")),
        // Not members of `Chunk`: serde skips them, whatever they hold.
        "id" | "object" | "created" | "model" | "system_fingerprint" | "provider"
        | "service_tier" | "obfuscation" => c.skip_value(),
        _ => None,
    })?;
    c.whitespace();
    c.end()?;
    Some(TextChunk { choices })
}

/// A chunk [`hot_chunk`] read: choices that carry at most a text or reasoning piece.
#[derive(Debug)]
pub(super) struct TextChunk<'a> {
    pub choices: Option<List<TextChoice<'a>>>,
}

/// One choice of a [`TextChunk`]: its delta, when it had one.
#[derive(Debug)]
pub(super) struct TextChoice<'a> {
    pub delta: Option<TextDelta<'a>>,
}

/// The delta of a [`TextChoice`]: a piece of reply text and of flat reasoning, each
/// `None` when absent or `null`.
#[derive(Debug)]
pub(super) struct TextDelta<'a> {
    pub content: Option<Cow<'a, str>>,
    pub reasoning_content: Text<'a>,
    pub reasoning: Text<'a>,
    /// The last of those that was a string, as the frame has it (quotes, escapes).
    pub token: Option<&'a str>,
}

/// The delta member that held a chunk's one text ([`TextChunk::only_text`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum TextMember {
    #[default]
    Content,
    ReasoningContent,
    Reasoning,
}

impl<'a> TextChunk<'a> {
    /// The chunk of one choice whose delta holds `text` in `member` and nothing else:
    /// what [`hot_chunk`] reads from a frame [`SameFrame`] recognized.
    ///
    /// [`SameFrame`]: crate::families::same_frame::SameFrame
    pub(super) fn with_text(member: TextMember, text: Cow<'a, str>) -> TextChunk<'a> {
        let mut delta = TextDelta {
            content: None,
            reasoning_content: Text(None),
            reasoning: Text(None),
            token: None,
        };
        match member {
            TextMember::Content => delta.content = Some(text),
            TextMember::ReasoningContent => delta.reasoning_content = Text(Some(text)),
            TextMember::Reasoning => delta.reasoning = Text(Some(text)),
        }
        TextChunk {
            choices: Some(List::from_buf([TextChoice { delta: Some(delta) }])),
        }
    }

    /// The chunk's one text's member and its string as the frame has it, when the chunk
    /// has one choice whose delta holds exactly one string ([`TextChunk::with_text`] reads
    /// it back).
    pub(super) fn only_text(&self) -> Option<(TextMember, &'a str)> {
        let [choice] = self.choices.as_deref()? else {
            return None;
        };
        let delta = choice.delta.as_ref()?;
        let texts = [
            (TextMember::Content, delta.content.as_deref()),
            (
                TextMember::ReasoningContent,
                delta.reasoning_content.0.as_deref(),
            ),
            (TextMember::Reasoning, delta.reasoning.0.as_deref()),
        ];
        let mut present = texts.into_iter().filter_map(|(m, t)| t.map(|_| m));
        match (present.next(), present.next(), delta.token) {
            (Some(member), None, Some(token)) => Some((member, token)),
            _ => None,
        }
    }

    /// The [`Chunk`] serde reads from the same frame (for the tests that hold both
    /// readings equal).
    #[cfg(test)]
    pub(super) fn into_chunk(self) -> Chunk<'a> {
        let choice = |choice: TextChoice<'a>| Choice {
            delta: choice.delta.map(|d| Delta {
                content: d.content.map_or(Content::Absent, Content::Text),
                reasoning_content: d.reasoning_content,
                reasoning: d.reasoning,
                ..Delta::default()
            }),
            ..Choice::default()
        };
        Chunk {
            choices: self.choices.map(|c| c.into_iter().map(choice).collect()),
            ..Chunk::default()
        }
    }
}

fn hot_choice<'a>(c: &mut Cursor<'a>) -> Option<TextChoice<'a>> {
    let (mut delta, mut finish, mut native, mut logprobs) = (None, None, None, None);
    c.object(|key, c| match key {
        "delta" => once(&mut delta, hot_delta(c)),
        "finish_reason" => once(&mut finish, c.literal("null")),
        "native_finish_reason" => once(&mut native, c.literal("null")),
        "logprobs" => once(&mut logprobs, c.literal("null")),
        // Not a member of `Choice`.
        "index" => c.skip_value(),
        _ => None,
    })?;
    Some(TextChoice { delta })
}

fn hot_delta<'a>(c: &mut Cursor<'a>) -> Option<TextDelta<'a>> {
    let (mut content, mut reasoning_content, mut reasoning) = (None, None, None);
    let mut token = None;
    c.object(|key, c| match key {
        "content" => once(&mut content, text_or_null(c, &mut token).map(|t| t.0)),
        "reasoning_content" => once(&mut reasoning_content, text_or_null(c, &mut token)),
        "reasoning" => once(&mut reasoning, text_or_null(c, &mut token)),
        // Not a member of `Delta`.
        "role" => c.skip_value(),
        _ => None,
    })?;
    Some(TextDelta {
        content: content.flatten(),
        reasoning_content: reasoning_content.unwrap_or_default(),
        reasoning: reasoning.unwrap_or_default(),
        token,
    })
}

/// A string or `null`, as [`Text`] reads them; a string's text as the frame has it goes
/// to `token`.
fn text_or_null<'a>(c: &mut Cursor<'a>, token: &mut Option<&'a str>) -> Option<Text<'a>> {
    if c.literal("null").is_some() {
        return Some(Text(None));
    }
    let (text, raw) = c.string_token()?;
    *token = Some(raw);
    Some(Text(Some(text)))
}
