//! streamgate CLI (placeholder until the commands land).
fn main() {}
