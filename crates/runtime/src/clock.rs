//! The wall clock as the services stamp it: [`streamgate_grammar::clock`] (epoch
//! milliseconds, the unit of every timestamp in the grammar), here too so that a service
//! finds it beside the rest of its plumbing.

pub use streamgate_grammar::clock::*;
