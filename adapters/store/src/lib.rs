//! queen-store
