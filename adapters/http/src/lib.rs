//! queen-http
