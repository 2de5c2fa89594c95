//! Which S3 endpoints and buckets a sink may name, and which addresses it may connect to.
//!
//! A tenant names its own sink's endpoint through the control plane, so without these rules a
//! tenant could make a node send requests to its own loopback ports, the cloud's metadata
//! service or the private network, and read the answers back (SSRF). The rules are checked
//! twice: the text when a sink is configured ([`check_endpoint`], [`check_bucket`]), and every
//! resolved address when a connection is made ([`refused_class`], used by the guarded client),
//! so a name that resolves to a public address at configuration time and to a private one later
//! (DNS rebinding) is still refused.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Which addresses a sink's connections may reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AddressPolicy {
    /// Any address: the operator's own endpoint (`QUEEN_S3_ENDPOINT`), or tenant endpoints on a
    /// node started with `QUEEN_S3_ALLOW_PRIVATE_ENDPOINTS=true`.
    #[default]
    Any,
    /// Public addresses only: loopback, link-local, private, unspecified, shared, multicast and
    /// metadata addresses (also in their IPv4-mapped IPv6 forms) are refused, literal or
    /// resolved; redirects are not followed and no proxy from the environment is used.
    PublicOnly,
}

/// Why an endpoint or a bucket was refused: a sentence that starts after the field's name and
/// never repeats the value (which may hold a password).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EndpointError(pub &'static str);

/// Cloud metadata and platform services that sit on otherwise public-looking or special
/// addresses; refused even where their range would pass.
const METADATA_V4: [Ipv4Addr; 5] = [
    Ipv4Addr::new(169, 254, 169, 254), // AWS, GCP, Azure, OCI, DigitalOcean ...
    Ipv4Addr::new(169, 254, 170, 2),   // AWS ECS task credentials
    Ipv4Addr::new(100, 100, 100, 200), // Alibaba Cloud
    Ipv4Addr::new(168, 63, 129, 16),   // Azure wire server
    Ipv4Addr::new(192, 0, 0, 192),     // Oracle Cloud (legacy)
];

/// AWS's IPv6 metadata service (`fd00:ec2::254`).
const METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254);

/// The class of address `ip` belongs to when a public-only sink may not reach it, `None` when it
/// may. IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`) and NAT64
/// (`64:ff9b::a.b.c.d`) IPv6 addresses are judged by the IPv4 address they carry.
#[must_use]
pub fn refused_class(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => refused_v4(v4),
        IpAddr::V6(v6) => refused_v6(v6),
    }
}

fn refused_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    if METADATA_V4.contains(&ip) {
        Some("metadata")
    } else if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_unspecified() || a == 0 {
        Some("unspecified")
    } else if ip.is_link_local() {
        Some("link-local")
    } else if ip.is_private() {
        Some("private")
    } else if a == 100 && (64..128).contains(&b) {
        Some("shared")
    } else if ip.is_multicast() || ip.is_broadcast() || a >= 240 {
        Some("reserved")
    } else {
        None
    }
}

fn refused_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    if ip == METADATA_V6 {
        return Some("metadata");
    }
    if let Some(v4) = ip.to_ipv4_mapped() {
        return refused_v4(v4);
    }
    // IPv4-compatible (deprecated, `::a.b.c.d`) and NAT64 (`64:ff9b::a.b.c.d`).
    if s[..6] == [0; 6] || s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        let [hi, lo] = [s[6], s[7]];
        let v4 = Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
        if ip.is_loopback() {
            return Some("loopback");
        }
        if ip.is_unspecified() {
            return Some("unspecified");
        }
        return refused_v4(v4);
    }
    if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_unspecified() {
        Some("unspecified")
    } else if s[0] & 0xffc0 == 0xfe80 || s[0] & 0xffc0 == 0xfec0 {
        Some("link-local")
    } else if s[0] & 0xfe00 == 0xfc00 {
        Some("private")
    } else if ip.is_multicast() {
        Some("reserved")
    } else {
        None
    }
}

/// Check an `http(s)://host[:port]` endpoint and answer it normalised (the host as the HTTP
/// client will see it, no trailing slash). Refused: another scheme, a user name or password, a
/// path, a query, a fragment, spaces or control characters, and under
/// [`AddressPolicy::PublicOnly`] a literal address [`refused_class`] refuses (names are checked
/// when they are resolved, at each connection).
///
/// # Errors
/// [`EndpointError`], a sentence to put after the field's name; it never repeats the value.
pub fn check_endpoint(text: &str, policy: AddressPolicy) -> Result<String, EndpointError> {
    if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(EndpointError(
            "must not contain spaces or control characters",
        ));
    }
    let url = url::Url::parse(text)
        .map_err(|_| EndpointError("is not a URL (http://host[:port] or https://host[:port])"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(EndpointError(
            "must be an http:// or https:// URL (http://host[:port])",
        ));
    }
    if !url.username().is_empty() || url.password().is_some() || text.contains('@') {
        return Err(EndpointError(
            "must not carry a user name or password (the credentials are accessKey and secretKey)",
        ));
    }
    if url.query().is_some() || text.contains('?') {
        return Err(EndpointError("must not carry a query (?...)"));
    }
    if url.fragment().is_some() || text.contains('#') {
        return Err(EndpointError("must not carry a fragment (#...)"));
    }
    if url.path() != "/" {
        return Err(EndpointError(
            "must not carry a path: http(s)://host[:port] only (the bucket is its own setting)",
        ));
    }
    let host = match url.host() {
        Some(url::Host::Domain(d)) if !d.is_empty() => None,
        Some(url::Host::Ipv4(ip)) => Some(IpAddr::V4(ip)),
        Some(url::Host::Ipv6(ip)) => Some(IpAddr::V6(ip)),
        _ => return Err(EndpointError("names no host")),
    };
    if policy == AddressPolicy::PublicOnly
        && let Some(class) = host.and_then(refused_class)
    {
        return Err(EndpointError(match class {
            "loopback" => "names a loopback address, which this node's sinks may not reach",
            "link-local" => "names a link-local address, which this node's sinks may not reach",
            "private" => "names a private address, which this node's sinks may not reach",
            "metadata" => "names a cloud metadata address, which this node's sinks may not reach",
            "unspecified" => "names an unspecified address, which this node's sinks may not reach",
            _ => "names a reserved address, which this node's sinks may not reach",
        }));
    }
    let mut normalised = format!("{}://{}", url.scheme(), url.host_str().unwrap_or_default());
    if let Some(port) = url.port() {
        normalised.push_str(&format!(":{port}"));
    }
    Ok(normalised)
}

/// Check an S3 bucket name: 3 to 63 characters, lowercase letters, digits, dots and hyphens,
/// starting and ending with a letter or a digit, no `..`, not an IPv4 address.
///
/// # Errors
/// [`EndpointError`], a sentence to put after the field's name; it never repeats the value.
pub fn check_bucket(name: &str) -> Result<(), EndpointError> {
    if !(3..=63).contains(&name.len()) {
        return Err(EndpointError("must be 3 to 63 characters long"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
    {
        return Err(EndpointError(
            "may hold only lowercase letters, digits, dots and hyphens",
        ));
    }
    let edge = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !edge(name.bytes().next()) || !edge(name.bytes().last()) {
        return Err(EndpointError("must start and end with a letter or a digit"));
    }
    if name.contains("..") {
        return Err(EndpointError("must not contain two dots in a row"));
    }
    if name.parse::<Ipv4Addr>().is_ok() {
        return Err(EndpointError("must not be an IP address"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn public(text: &str) -> Result<String, EndpointError> {
        check_endpoint(text, AddressPolicy::PublicOnly)
    }

    #[test]
    fn refused_addresses_include_their_mapped_forms() {
        for ip in [
            "127.0.0.1",
            "127.9.9.9",
            "0.0.0.0",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "169.254.1.1",
            "100.64.0.1",
            "100.100.100.200",
            "168.63.129.16",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "fc00::1",
            "fd00:ec2::254",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
        ] {
            let parsed: IpAddr = ip.parse().unwrap();
            assert!(refused_class(parsed).is_some(), "{ip} passed");
        }
        for ip in [
            "8.8.8.8",
            "52.216.0.1",
            "172.32.0.1",
            "2600:1f18::1",
            "::ffff:8.8.8.8",
        ] {
            let parsed: IpAddr = ip.parse().unwrap();
            assert_eq!(refused_class(parsed), None, "{ip} refused");
        }
    }

    #[test]
    fn endpoints_are_host_and_port_only() {
        assert_eq!(
            public("https://s3.eu-west-1.amazonaws.com").unwrap(),
            "https://s3.eu-west-1.amazonaws.com"
        );
        assert_eq!(
            public("http://minio.example.com:9000/").unwrap(),
            "http://minio.example.com:9000"
        );
        for bad in [
            "ftp://s3.example.com",
            "file:///etc",
            "http://user:pw@s3.example.com",
            "http://user@s3.example.com",
            "http://s3.example.com/?x=1",
            "http://s3.example.com?",
            "http://s3.example.com/#f",
            "http://s3.example.com/latest/meta-data",
            "http://s3.exa mple.com",
            "http://s3.example.com\n",
            "http://",
            "s3.example.com",
        ] {
            assert!(public(bad).is_err(), "{bad} passed");
        }
    }

    #[test]
    fn literal_private_addresses_are_refused_in_every_spelling() {
        for bad in [
            "http://127.0.0.1:9000",
            "http://127.1:9000",
            "http://0x7f.1",
            "http://2130706433",
            "http://[::1]:9000",
            "http://[::ffff:127.0.0.1]",
            "http://[::ffff:a9fe:a9fe]",
            "http://169.254.169.254",
            "http://[fd00:ec2::254]",
            "http://0.0.0.0:6632",
        ] {
            let e = public(bad).unwrap_err();
            assert!(e.0.starts_with("names a"), "{bad}: {e}");
            assert!(check_endpoint(bad, AddressPolicy::Any).is_ok(), "{bad}");
        }
        // Names pass here: they are judged when resolved, at every connection.
        assert!(public("http://localhost:9000").is_ok());
    }

    #[test]
    fn bucket_names_follow_the_s3_rules() {
        for good in ["abc", "acme-lake", "my.bucket.1", &"a".repeat(63)] {
            assert!(check_bucket(good).is_ok(), "{good}");
        }
        for bad in [
            "ab",
            &"a".repeat(64),
            "Lake",
            "a/b",
            "a?b",
            "a#b",
            "a..b",
            "-ab",
            "ab-",
            ".ab",
            "a_b",
            "192.168.1.1",
            "a b",
        ] {
            assert!(check_bucket(bad).is_err(), "{bad} passed");
        }
    }
}
