//! Engine tests on paused time with in-process sinks.
