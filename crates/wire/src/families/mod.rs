//! One module per wire family, each implementing the spec's mapping table (§6) and the
//! §3.5 finality dispatch for that family.

use crate::adapter::{Adapter, Family};

pub mod codex;
pub mod f1;
pub mod f1e;
pub mod f2;
pub mod f3;
pub mod f5;
pub mod ollama;
pub mod segments;
pub mod whole_calls;

/// A fresh adapter for one run of `family`.
pub fn new_adapter(family: Family) -> Box<dyn Adapter> {
    match family {
        Family::F1 => Box::<f1::F1Adapter>::default(),
        Family::F1e => Box::<f1e::F1eAdapter>::default(),
        Family::F2 => Box::<f2::F2Adapter>::default(),
        Family::F3 => Box::<f3::F3Adapter>::default(),
        Family::F5 => Box::<f5::F5Adapter>::default(),
        Family::OllamaNative => Box::<ollama::OllamaNativeAdapter>::default(),
        Family::CodexAppServer => Box::<codex::CodexAppServerAdapter>::default(),
    }
}
