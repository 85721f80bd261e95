//! [`S3Config`]: where S3 checkpoint storage is and how to reach it, read from an
//! `s3://bucket/prefix` URL and the standard AWS environment variables, and checked before any
//! request is made.

use crate::CheckpointError;
use opendal::Operator;

/// The region used when neither the configuration nor the environment names one.
pub const DEFAULT_REGION: &str = "us-east-1";

/// The URL scheme of S3 checkpoint storage.
const SCHEME: &str = "s3://";

/// Whether `s` names S3 storage (`s3://…`) rather than a local path.
pub fn is_s3_url(s: &str) -> bool {
    s.starts_with(SCHEME)
}

/// Where S3 checkpoint storage is: a bucket and a key prefix on an S3-compatible endpoint, with
/// static credentials.
///
/// Checkpoints go to `<prefix>/<job-id>/chk-<n>/…` in `bucket`. Only what is here is used:
/// opendal is told not to read `~/.aws/config`, profiles or the EC2 instance metadata, so what
/// a job writes to never depends on files it was not told about.
/// [`from_url_and_env`](Self::from_url_and_env) fills it from the standard environment
/// variables. `Debug` does not show the secret key.
#[derive(Clone, PartialEq, Eq)]
pub struct S3Config {
    /// The endpoint, such as `http://127.0.0.1:9000` for a local server; `None`: AWS's endpoint
    /// for the region.
    pub endpoint: Option<String>,
    /// The signing region (`us-east-1` unless told otherwise).
    pub region: String,
    /// The bucket; it must exist (opendal does not create buckets).
    pub bucket: String,
    /// The key prefix checkpoints go under, without leading or trailing `/`; empty for the
    /// bucket's root.
    pub prefix: String,
    /// The access key id.
    pub access_key_id: Option<String>,
    /// The secret access key.
    pub secret_access_key: Option<String>,
    /// A session token, for temporary credentials.
    pub session_token: Option<String>,
    /// Path-style requests (`http://endpoint/bucket/key`, the default, what local servers
    /// expect) rather than virtual-hosted style (`http://bucket.endpoint/key`).
    pub path_style: bool,
}

impl std::fmt::Debug for S3Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Config")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("access_key_id", &self.access_key_id)
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "<redacted>"),
            )
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "<redacted>"),
            )
            .field("path_style", &self.path_style)
            .finish()
    }
}

impl S3Config {
    /// A configuration for `bucket` and `prefix` with the defaults: AWS's endpoint, region
    /// `us-east-1`, path-style requests and no credentials (set them before use).
    pub fn new(bucket: impl Into<String>, prefix: impl Into<String>) -> Self {
        S3Config {
            endpoint: None,
            region: DEFAULT_REGION.to_string(),
            bucket: bucket.into(),
            prefix: prefix.into(),
            access_key_id: None,
            secret_access_key: None,
            session_token: None,
            path_style: true,
        }
    }

    /// Reads an `s3://bucket/prefix` URL and the process's environment:
    /// - `AWS_ENDPOINT_URL_S3`, else `AWS_ENDPOINT_URL`: the endpoint (absent: AWS);
    /// - `AWS_REGION`, else `AWS_DEFAULT_REGION`: the region (absent: `us-east-1`);
    /// - `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` (both required), and
    ///   `AWS_SESSION_TOKEN` (optional).
    ///
    /// Empty variables count as absent. A URL or a value that cannot work (not `s3://`, no
    /// bucket, an invalid bucket name, `..` in the prefix, an endpoint that is not `http(s)://`,
    /// missing credentials) is a [`CheckpointError::Config`] naming the problem.
    pub fn from_url_and_env(url: &str) -> Result<Self, CheckpointError> {
        Self::from_url_and_vars(url, |name| std::env::var(name).ok())
    }

    /// [`from_url_and_env`](Self::from_url_and_env) with the variables looked up by `var`
    /// instead of in the process's environment.
    pub fn from_url_and_vars(
        url: &str,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, CheckpointError> {
        let var = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let (bucket, prefix) = parse_url(url)?;
        let mut config = S3Config::new(bucket, prefix);
        config.endpoint = var("AWS_ENDPOINT_URL_S3").or_else(|| var("AWS_ENDPOINT_URL"));
        if let Some(region) = var("AWS_REGION").or_else(|| var("AWS_DEFAULT_REGION")) {
            config.region = region;
        }
        config.access_key_id = var("AWS_ACCESS_KEY_ID");
        config.secret_access_key = var("AWS_SECRET_ACCESS_KEY");
        config.session_token = var("AWS_SESSION_TOKEN");
        config.validate()?;
        Ok(config)
    }

    /// The storage root as a URL: `s3://bucket/prefix` (`s3://bucket` without a prefix).
    pub fn url(&self) -> String {
        if self.prefix.is_empty() {
            format!("{SCHEME}{}", self.bucket)
        } else {
            format!("{SCHEME}{}/{}", self.bucket, self.prefix)
        }
    }

    /// The endpoint requests go to: the configured one, else AWS's for the region.
    pub fn effective_endpoint(&self) -> String {
        match &self.endpoint {
            Some(e) => e.trim_end_matches('/').to_string(),
            None => format!("https://s3.{}.amazonaws.com", self.region),
        }
    }

    /// `s3://bucket/prefix (endpoint …, region …)`, as the storage describes itself in
    /// messages and logs: an endpoint's user information (`user:password@`) never shows.
    pub fn describe(&self) -> String {
        let shown = weir_core::redact::redact_url(&self.effective_endpoint());
        format!("{} (endpoint {shown}, region {})", self.url(), self.region)
    }

    /// Checks every field, so that a configuration that cannot work is refused before any
    /// request: the bucket name (S3's rules), the prefix (no `.`/`..` segments, no control
    /// characters), the endpoint (`http://` or `https://` with a host), a region, and both
    /// halves of the credentials.
    pub fn validate(&self) -> Result<(), CheckpointError> {
        let bad = |msg: String| Err(CheckpointError::Config(msg));
        if let Err(why) = check_bucket(&self.bucket) {
            return bad(format!(
                "S3 bucket name {:?} is invalid: {why}",
                self.bucket
            ));
        }
        if let Err(why) = check_prefix(&self.prefix) {
            return bad(format!("S3 key prefix {:?} is invalid: {why}", self.prefix));
        }
        if self.region.trim().is_empty() || self.region.chars().any(char::is_whitespace) {
            return bad(format!(
                "S3 region {:?} is invalid: it must be a non-empty name such as us-east-1",
                self.region
            ));
        }
        if let Some(endpoint) = &self.endpoint
            && let Err(why) = check_endpoint(endpoint)
        {
            return bad(format!("S3 endpoint {endpoint:?} is invalid: {why}"));
        }
        match (&self.access_key_id, &self.secret_access_key) {
            (Some(_), Some(_)) => Ok(()),
            (None, None) => bad(format!(
                "no credentials for {}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY \
                 (credential files, profiles and instance metadata are not read)",
                self.url()
            )),
            (Some(_), None) => bad(format!(
                "incomplete credentials for {}: AWS_ACCESS_KEY_ID is set but \
                 AWS_SECRET_ACCESS_KEY is not",
                self.url()
            )),
            (None, Some(_)) => bad(format!(
                "incomplete credentials for {}: AWS_SECRET_ACCESS_KEY is set but \
                 AWS_ACCESS_KEY_ID is not",
                self.url()
            )),
        }
    }

    /// Validates the configuration and builds an opendal S3 operator rooted at the prefix,
    /// reading no other configuration source. Without the `s3` feature, a
    /// [`CheckpointError::Config`] saying so (after validation, so a bad URL is still named).
    #[cfg(not(feature = "s3"))]
    pub(crate) fn operator(&self) -> Result<Operator, CheckpointError> {
        self.validate()?;
        Err(CheckpointError::Config(format!(
            "{} is S3 storage, and this build has none: build with weir-checkpoint's `s3` \
             feature (weir-runtime's and weir-examples' `s3` turn it on)",
            self.url()
        )))
    }

    /// Validates the configuration and builds an opendal S3 operator rooted at the prefix,
    /// reading no other configuration source.
    #[cfg(feature = "s3")]
    pub(crate) fn operator(&self) -> Result<Operator, CheckpointError> {
        use opendal::services;
        self.validate()?;
        // Without opendal's default features nothing installs its HTTP client before `main`;
        // this does, once per process (later calls are no-ops).
        opendal::install_default();
        let root = if self.prefix.is_empty() {
            "/".to_string()
        } else {
            format!("/{}/", self.prefix)
        };
        let mut builder = services::S3::default()
            .bucket(&self.bucket)
            .region(&self.region)
            .root(&root)
            .disable_config_load()
            .disable_ec2_metadata();
        if let Some(endpoint) = &self.endpoint {
            builder = builder.endpoint(endpoint);
        }
        if let Some(key) = &self.access_key_id {
            builder = builder.access_key_id(key);
        }
        if let Some(secret) = &self.secret_access_key {
            builder = builder.secret_access_key(secret);
        }
        if let Some(token) = &self.session_token {
            builder = builder.session_token(token);
        }
        if !self.path_style {
            builder = builder.enable_virtual_host_style();
        }
        Operator::new(builder).map_err(|source| CheckpointError::Storage {
            path: self.url(),
            source,
        })
    }
}

/// Splits `s3://bucket/prefix` into a bucket and a normalised prefix (no leading, trailing or
/// doubled `/`).
fn parse_url(url: &str) -> Result<(String, String), CheckpointError> {
    let bad = |why: &str| {
        Err(CheckpointError::Config(format!(
            "invalid S3 checkpoint URL {url:?}: {why}; expected s3://bucket/prefix"
        )))
    };
    let Some(rest) = url.strip_prefix(SCHEME) else {
        return bad("it does not start with s3://");
    };
    if rest.contains(['?', '#']) {
        return bad("query strings and fragments are not supported");
    }
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return bad("it names no bucket");
    }
    if bucket.contains('@') {
        return bad(
            "credentials in the URL are not supported (use AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)",
        );
    }
    let prefix = prefix
        .split('/')
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("/");
    Ok((bucket.to_string(), prefix))
}

/// S3's bucket naming rules: 3 to 63 characters of lowercase letters, digits, `.` and `-`,
/// starting and ending with a letter or digit, without `..`.
fn check_bucket(bucket: &str) -> Result<(), &'static str> {
    if bucket.is_empty() {
        return Err("it is empty");
    }
    if !(3..=63).contains(&bucket.len()) {
        return Err("it must be 3 to 63 characters long");
    }
    if !bucket
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
    {
        return Err("it may hold only lowercase letters, digits, '.' and '-'");
    }
    let edge_ok = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !edge_ok(bucket.bytes().next()) || !edge_ok(bucket.bytes().last()) {
        return Err("it must start and end with a letter or digit");
    }
    if bucket.contains("..") {
        return Err("it must not contain '..'");
    }
    Ok(())
}

/// A prefix is `/`-separated segments, none of them empty, `.` or `..`, without control
/// characters.
fn check_prefix(prefix: &str) -> Result<(), &'static str> {
    if prefix.is_empty() {
        return Ok(());
    }
    if prefix.chars().any(char::is_control) {
        return Err("it contains control characters");
    }
    for segment in prefix.split('/') {
        match segment {
            "" => return Err("it has an empty segment (a leading, trailing or doubled '/')"),
            "." | ".." => return Err("it must not contain '.' or '..' segments"),
            _ => {}
        }
    }
    Ok(())
}

/// An endpoint is `http://host[:port][/]` or `https://…`.
fn check_endpoint(endpoint: &str) -> Result<(), &'static str> {
    let Some(rest) = endpoint
        .strip_prefix("http://")
        .or_else(|| endpoint.strip_prefix("https://"))
    else {
        return Err("it must start with http:// or https://");
    };
    let host = rest.split('/').next().unwrap_or("");
    if host.is_empty() {
        return Err("it names no host");
    }
    if endpoint
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err("it contains whitespace or control characters");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    const CREDS: [(&str, &str); 2] = [
        ("AWS_ACCESS_KEY_ID", "AKID"),
        ("AWS_SECRET_ACCESS_KEY", "SECRET"),
    ];

    fn config_error(r: Result<S3Config, CheckpointError>) -> String {
        match r {
            Err(CheckpointError::Config(msg)) => msg,
            other => panic!("expected a Config error, got {other:?}"),
        }
    }

    #[test]
    fn a_url_and_the_standard_variables_make_a_config() {
        let c = S3Config::from_url_and_vars(
            "s3://weir-ckpt/jobs/word-count",
            vars(&[
                ("AWS_ENDPOINT_URL", "http://127.0.0.1:9000"),
                ("AWS_REGION", "eu-west-1"),
                ("AWS_DEFAULT_REGION", "ignored"),
                CREDS[0],
                CREDS[1],
            ]),
        )
        .unwrap();
        assert_eq!(c.bucket, "weir-ckpt");
        assert_eq!(c.prefix, "jobs/word-count");
        assert_eq!(c.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!(c.region, "eu-west-1");
        assert_eq!(c.access_key_id.as_deref(), Some("AKID"));
        assert_eq!(c.secret_access_key.as_deref(), Some("SECRET"));
        assert_eq!(c.session_token, None);
        assert!(c.path_style);
        assert_eq!(c.url(), "s3://weir-ckpt/jobs/word-count");
        assert_eq!(
            c.describe(),
            "s3://weir-ckpt/jobs/word-count (endpoint http://127.0.0.1:9000, region eu-west-1)"
        );
    }

    #[test]
    fn an_endpoint_s_user_information_is_never_described() {
        let mut c = S3Config::from_url_and_vars("s3://bucket/p", vars(&CREDS)).unwrap();
        c.endpoint = Some("http://user:pw@127.0.0.1:9000/base".into());
        let shown = c.describe();
        assert!(!shown.contains("pw") && !shown.contains("user"), "{shown}");
        assert!(shown.contains("http://127.0.0.1:9000/base"), "{shown}");
    }

    #[test]
    fn defaults_and_fallbacks() {
        let c = S3Config::from_url_and_vars("s3://bucket", vars(&CREDS)).unwrap();
        assert_eq!((c.prefix.as_str(), c.region.as_str()), ("", DEFAULT_REGION));
        assert_eq!(c.endpoint, None);
        assert_eq!(
            c.describe(),
            "s3://bucket (endpoint https://s3.us-east-1.amazonaws.com, region us-east-1)"
        );
        let c = S3Config::from_url_and_vars(
            "s3://bucket/",
            vars(&[
                ("AWS_DEFAULT_REGION", "ap-south-1"),
                ("AWS_REGION", ""),
                ("AWS_ENDPOINT_URL", "http://a:1"),
                ("AWS_ENDPOINT_URL_S3", "http://b:2"),
                ("AWS_SESSION_TOKEN", "TOKEN"),
                CREDS[0],
                CREDS[1],
            ]),
        )
        .unwrap();
        assert_eq!(c.prefix, "");
        assert_eq!(
            c.region, "ap-south-1",
            "an empty AWS_REGION counts as unset"
        );
        assert_eq!(
            c.endpoint.as_deref(),
            Some("http://b:2"),
            "the S3-specific one wins"
        );
        assert_eq!(c.session_token.as_deref(), Some("TOKEN"));
    }

    #[test]
    fn prefixes_are_normalised() {
        for (url, prefix) in [
            ("s3://b-1/a", "a"),
            ("s3://b-1//a//b/", "a/b"),
            ("s3://b-1/a/chk-3/", "a/chk-3"),
        ] {
            let c = S3Config::from_url_and_vars(url, vars(&CREDS)).unwrap();
            assert_eq!(c.prefix, prefix, "{url}");
        }
    }

    #[test]
    fn bad_urls_are_config_errors_naming_the_problem() {
        for (url, names) in [
            ("/tmp/checkpoints", "does not start with s3://"),
            ("S3://bucket/x", "does not start with s3://"),
            ("s3:/bucket", "does not start with s3://"),
            ("s3://", "names no bucket"),
            ("s3:///prefix", "names no bucket"),
            ("s3://ab", "3 to 63 characters"),
            ("s3://My_Bucket/x", "lowercase letters"),
            ("s3://-bucket/x", "start and end"),
            ("s3://a..b/x", "'..'"),
            ("s3://bucket/a/../b", "'..' segments"),
            ("s3://bucket/a/./b", "'.' or '..'"),
            ("s3://bucket/a\nb", "control characters"),
            ("s3://bucket/x?versionId=1", "query strings"),
            ("s3://key:secret@bucket/x", "credentials in the URL"),
        ] {
            let msg = config_error(S3Config::from_url_and_vars(url, vars(&CREDS)));
            assert!(msg.contains(names), "{url}: {msg}");
        }
    }

    #[test]
    fn bad_variables_are_config_errors_naming_them() {
        let msg = config_error(S3Config::from_url_and_vars("s3://bucket/x", vars(&[])));
        assert!(
            msg.contains("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
            "{msg}"
        );
        let msg = config_error(S3Config::from_url_and_vars(
            "s3://bucket/x",
            vars(&[CREDS[0]]),
        ));
        assert!(msg.contains("AWS_SECRET_ACCESS_KEY is not"), "{msg}");
        let msg = config_error(S3Config::from_url_and_vars(
            "s3://bucket/x",
            vars(&[CREDS[1]]),
        ));
        assert!(msg.contains("AWS_ACCESS_KEY_ID is not"), "{msg}");
        for endpoint in ["127.0.0.1:9000", "ftp://host", "http://", "http://a b"] {
            let msg = config_error(S3Config::from_url_and_vars(
                "s3://bucket/x",
                vars(&[("AWS_ENDPOINT_URL", endpoint), CREDS[0], CREDS[1]]),
            ));
            assert!(msg.contains("S3 endpoint"), "{endpoint}: {msg}");
        }
        let msg = config_error(S3Config::from_url_and_vars(
            "s3://bucket/x",
            vars(&[("AWS_REGION", "us east"), CREDS[0], CREDS[1]]),
        ));
        assert!(msg.contains("S3 region"), "{msg}");
    }

    #[test]
    fn debug_hides_the_secrets() {
        let mut c = S3Config::new("bucket", "p");
        c.secret_access_key = Some("very-secret".into());
        c.session_token = Some("token-secret".into());
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("very-secret") && !shown.contains("token-secret"),
            "{shown}"
        );
        assert!(shown.contains("<redacted>"), "{shown}");
    }

    #[test]
    fn a_valid_config_builds_an_operator_without_any_request() {
        let mut c = S3Config::new("bucket", "a/b");
        c.endpoint = Some("http://127.0.0.1:1".into());
        c.access_key_id = Some("A".into());
        c.secret_access_key = Some("S".into());
        let op = c.operator().unwrap();
        assert_eq!(op.info().scheme(), "s3");
        assert_eq!(op.info().root(), "/a/b/");
        c.path_style = false;
        c.operator().unwrap();
        c.bucket = String::new();
        assert!(matches!(c.operator(), Err(CheckpointError::Config(_))));
    }
}
