//! Accounting (docs/architecture.md §5): what runs cost, from a price table in config.
//!
//! `STREAMGATE_PRICES` / `--prices`: `<model>:input=<p>,output=<p>,cache_read=<p>,cache_write=<p>`
//! entries, `;`-separated, prices per million tokens in `STREAMGATE_PRICE_CURRENCY` (USD);
//! `<model>` is a name or a prefix ending in `*`; the first entry that matches wins.
//! Tokens are priced as the provider counts them: where a provider's input count includes
//! cache reads (OpenAI), price `input` for all of them and `cache_read` at the difference.

use streamgate_grammar::usage::Tokens;

/// One model's prices, per million tokens.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Price {
    /// `claude-sonnet-4-5` or a prefix `claude-*`.
    pub model: String,
    /// Per million input tokens.
    pub input: f64,
    /// Per million output tokens.
    pub output: f64,
    /// Per million cache-read tokens.
    pub cache_read: f64,
    /// Per million cache-write tokens.
    pub cache_write: f64,
}

/// The price table.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Prices(pub Vec<Price>);

impl std::str::FromStr for Prices {
    type Err = String;

    fn from_str(s: &str) -> Result<Prices, String> {
        let mut out = Vec::new();
        for spec in s
            .split([';', '\n'])
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            let (model, rules) = spec
                .rsplit_once(':')
                .ok_or_else(|| format!("`{spec}`: expected <model>:input=<p>,output=<p>,…"))?;
            let mut price = Price {
                model: model.trim().to_owned(),
                ..Price::default()
            };
            for rule in rules.split(',').map(str::trim) {
                let (key, value) = rule
                    .split_once('=')
                    .ok_or_else(|| format!("`{rule}`: expected <kind>=<price per million>"))?;
                let value: f64 = value
                    .parse()
                    .ok()
                    .filter(|v: &f64| v.is_finite() && *v >= 0.0)
                    .ok_or_else(|| format!("`{value}`: a price, like 3 or 0.3"))?;
                match key {
                    "input" => price.input = value,
                    "output" => price.output = value,
                    "cache_read" => price.cache_read = value,
                    "cache_write" => price.cache_write = value,
                    _ => {
                        return Err(format!(
                            "`{key}`: the kinds are input, output, cache_read, cache_write"
                        ))
                    }
                }
            }
            out.push(price);
        }
        Ok(Prices(out))
    }
}

impl Prices {
    /// The price of `model`, when the table has one.
    pub fn of(&self, model: &str) -> Option<&Price> {
        self.0.iter().find(|p| match p.model.strip_suffix('*') {
            Some(prefix) => model.starts_with(prefix),
            None => p.model == model,
        })
    }

    /// What `tokens` of `model` cost.
    pub fn cost(&self, model: &str, tokens: &Tokens) -> Option<f64> {
        let p = self.of(model)?;
        let m = |n: u64, price: f64| n as f64 * price / 1e6;
        Some(
            m(tokens.input, p.input)
                + m(tokens.output, p.output)
                + m(tokens.cache_read, p.cache_read)
                + m(tokens.cache_write, p.cache_write),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prices_by_name_or_prefix() {
        let prices: Prices =
            "claude-test:input=3,output=15; gpt-*:input=1.25,output=10,cache_read=0.125"
                .parse()
                .unwrap();
        let t = Tokens {
            input: 1_000_000,
            output: 2_000_000,
            reasoning: 0,
            cache_read: 0,
            cache_write: 0,
        };
        assert_eq!(prices.cost("claude-test", &t), Some(33.0));
        assert_eq!(prices.cost("gpt-5-mini", &t), Some(21.25));
        assert_eq!(prices.cost("llama3", &t), None);
        assert!("x:input=-1".parse::<Prices>().is_err());
        assert!("x:bogus=1".parse::<Prices>().is_err());
    }
}
