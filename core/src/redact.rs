//! Credentials kept out of what is shown: a URL without its user information, for the REST
//! API, logs and storage descriptions.

/// `url` with any user information (`user:password@`) removed; anything else as it is.
pub fn redact_url(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            format!("{scheme}://{host}{path}")
        }
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn user_information_never_leaves_a_url() {
        assert_eq!(
            super::redact_url("sim://key:secret@host:9000/root/x@y"),
            "sim://host:9000/root/x@y"
        );
        assert_eq!(
            super::redact_url("s3://bucket/prefix"),
            "s3://bucket/prefix"
        );
        assert_eq!(super::redact_url("plain"), "plain");
    }
}
