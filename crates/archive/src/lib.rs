//! Placeholder (being written).
