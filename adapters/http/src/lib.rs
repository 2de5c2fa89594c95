//! queen-http: the client API on port 6632 over hyper + tower.
//!
//! Owns: routing (every path segment percent-decoded, `+` read as a space in queries), the JSON
//! wire shapes of the contract (`shared/spec/API.md`), input validation that names the bad
//! field, body bounds (413 too large, 408 too slow, 503 over the node's body budget), the
//! admin credential of `/api/v1/system/*` changes, broker JWT (`auth`: the `JWT_*` settings,
//! token checks and the level each route needs), the error envelope `{"error", "code"}`, and minting of ids a
//! request left out (transactionId, message id) before anything is proposed. Also the binary
//! bodies of `shared/spec/API.md` 4.6: QPB1 and QTB1 requests (`application/x-queen-push`), read
//! into the same push items and transactions as JSON, and the framed pop answer QPF1.
//! Must never depend on: openraft or the storage engine. It calls the application through the
//! `ClientApi` port
//! (`queen-ports`), so it can be tested with any implementation, and maps the port's typed
//! `BrokerError` to status, code and `retry-after` in one place (`api.rs`).

mod analytics_json;
mod api;
mod auth;
mod body;
mod dashboard;
mod ephemeral_json;
mod error;
mod fields;
mod frame;
mod front;
mod groups;
mod json;
mod kv_json;
mod pop_frames;
mod pop_query;
mod proxy;
mod push_binary;
mod raw;
mod reads;
mod render;
mod router;
mod server;
mod streams_json;
mod tenancy;
mod timers_json;
mod tls;
mod traces_json;
mod writes;

pub use api::ApiError;
pub use auth::{Auth, AuthConfigError, Principal};
pub use body::BodyBudget;
pub use front::FrontRules;
pub use groups::Groups;
pub use proxy::{Bootstrap, CP_TOKEN_HEADER, Proxy, ProxyConfigError, ProxySettings};
pub use server::{ADMIN_TOKEN_HEADER, ServeConfig, serve, serve_groups};
pub use tenancy::{TENANT_HEADER, Tenancy};
pub use tls::Tls;
