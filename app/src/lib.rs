//! queen-app
