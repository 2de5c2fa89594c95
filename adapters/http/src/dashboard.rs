//! The dashboard: one HTML page, one stylesheet and a few ES modules, built into the binary and
//! served on the client port (`GET /` and `GET /dashboard/<file>`). There is no build step: the
//! files under `dashboard/` are what the browser runs. They carry no data, so they are served
//! before any credential check; every figure the page shows comes from the API routes, called
//! by the page with the user's token (see `docs/dashboard.md`).

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Response};

use crate::api::ApiError;
use crate::error::error_response;

/// Every file of the dashboard: its path under `/dashboard/`, its content type, its text.
const ASSETS: [(&str, &str, &str); 6] = [
    (
        "app.css",
        "text/css; charset=utf-8",
        include_str!("dashboard/app.css"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("dashboard/app.js"),
    ),
    (
        "api.js",
        "text/javascript; charset=utf-8",
        include_str!("dashboard/api.js"),
    ),
    (
        "dom.js",
        "text/javascript; charset=utf-8",
        include_str!("dashboard/dom.js"),
    ),
    (
        "chart.js",
        "text/javascript; charset=utf-8",
        include_str!("dashboard/chart.js"),
    ),
    (
        "views.js",
        "text/javascript; charset=utf-8",
        include_str!("dashboard/views.js"),
    ),
];

/// The SVG namespace the charts' elements are created in (a name, never fetched).
#[cfg(test)]
const SVG_NS: &str = "http://www.w3.org/2000/svg";

const PAGE: &str = include_str!("dashboard/index.html");

/// What the page may load and call: only this node. A script or stylesheet from anywhere
/// else, an inline script or a frame around the page is refused by the browser.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'none'; base-uri 'none'; frame-ancestors 'none'";

/// Whether a request is one of the dashboard's paths (the route label `dashboard`).
pub(crate) fn is_dashboard(method: &Method, segs: &[&str]) -> bool {
    (method == Method::GET || method == Method::HEAD) && matches!(segs, [] | ["dashboard", ..])
}

/// The answer to a dashboard path: the page, a file, or a 404 naming the files there are.
pub(crate) fn answer(segs: &[&str]) -> Response<Full<Bytes>> {
    let found = match segs {
        [] => Some(("text/html; charset=utf-8", PAGE)),
        ["dashboard", name] => ASSETS
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, t, body)| (*t, *body)),
        _ => None,
    };
    let Some((content_type, body)) = found else {
        return error_response(&ApiError::new(
            404,
            "no_such_route",
            format!(
                "no dashboard file /{}; the dashboard serves /dashboard/{{{}}}",
                segs.join("/"),
                ASSETS.map(|(n, _, _)| n).join(",")
            ),
        ));
    };
    Response::builder()
        .status(200)
        .header("content-type", content_type)
        // A node that is upgraded serves its own page: never a stale copy from a cache.
        .header("cache-control", "no-cache")
        .header("x-content-type-options", "nosniff")
        .header("content-security-policy", POLICY)
        .header("referrer-policy", "no-referrer")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_and_every_file_are_served_with_their_type() {
        let r = answer(&[]);
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["content-type"], "text/html; charset=utf-8");
        for (name, t, _) in ASSETS {
            let r = answer(&["dashboard", name]);
            assert_eq!(r.status(), 200, "{name}");
            assert_eq!(r.headers()["content-type"], t, "{name}");
        }
        assert_eq!(answer(&["dashboard", "nope.js"]).status(), 404);
        assert_eq!(answer(&["dashboard", "a", "b"]).status(), 404);
    }

    #[test]
    fn the_page_names_each_module_it_loads_and_nothing_outside_the_node() {
        for (name, _, _) in ASSETS {
            if name.ends_with(".js") && name != "app.js" {
                assert!(
                    ASSETS
                        .iter()
                        .any(|(_, _, b)| b.contains(&format!("./{name}"))),
                    "{name} is imported by no module"
                );
            }
        }
        assert!(PAGE.contains("/dashboard/app.js") && PAGE.contains("/dashboard/app.css"));
        // The SVG namespace is a name, not an address: nothing is loaded from it.
        for text in ASSETS.iter().map(|(_, _, b)| *b).chain([PAGE]) {
            let text = text.replace(SVG_NS, "");
            assert!(!text.contains("http://") && !text.contains("https://"));
        }
    }

    #[test]
    fn only_get_and_head_of_the_root_and_its_folder_are_the_dashboard() {
        assert!(is_dashboard(&Method::GET, &[]));
        assert!(is_dashboard(&Method::GET, &["dashboard", "app.js"]));
        assert!(!is_dashboard(&Method::POST, &[]));
        assert!(!is_dashboard(&Method::GET, &["health"]));
    }
}
