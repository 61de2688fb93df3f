//! Tests against the local fake server.
