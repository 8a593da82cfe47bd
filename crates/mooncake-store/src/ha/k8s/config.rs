//! How to reach the API server, found as client-go finds it
//! (`rest.InClusterConfig`, then `clientcmd` loading rules):
//!
//! 1. in a pod: `KUBERNETES_SERVICE_HOST`/`KUBERNETES_SERVICE_PORT` and the
//!    service account's `token` and `ca.crt` under
//!    `/var/run/secrets/kubernetes.io/serviceaccount/`;
//! 2. else `$KUBECONFIG` (`:`-separated files, merged: the first file to
//!    name an entry or the current context wins);
//! 3. else `~/.kube/config`.
//!
//! From a kubeconfig: the current context's cluster (`server`,
//! `certificate-authority[-data]`, `insecure-skip-tls-verify`) and user
//! (`token`, `tokenFile`, `client-certificate[-data]` with
//! `client-key[-data]`, `username`/`password`). Relative paths are relative
//! to the file that names them. Credential plugins (`exec`,
//! `auth-provider`), `tls-server-name` and `proxy-url` are refused with a
//! clear error rather than ignored.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use base64::Engine;
use mooncake_common::{Error, ErrorCode, Result};
use serde::Deserialize;

/// The service account's files in a pod.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Where the API server is and how to authenticate to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// Base URL, e.g. `https://10.96.0.1:443`.
    pub server: String,
    /// PEM CA bundle to trust; none: the system's roots.
    pub ca_pem: Option<Vec<u8>>,
    pub insecure_skip_tls_verify: bool,
    pub auth: Auth,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    None,
    Token(String),
    /// A token re-read as the file rotates (projected service-account
    /// tokens are replaced about hourly).
    TokenFile(PathBuf),
    /// A client certificate and key, PEM.
    ClientCert {
        cert_pem: Vec<u8>,
        key_pem: Vec<u8>,
    },
    Basic {
        username: String,
        password: String,
    },
}

fn config_error(what: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorCode::K8S_LEASE_OPERATION_ERROR,
        format!("kubernetes config: {what}"),
    )
}

impl ClusterConfig {
    /// client-go's order: in-cluster, then `$KUBECONFIG`, then
    /// `~/.kube/config`.
    pub fn infer() -> Result<ClusterConfig> {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        if let Some(c) = Self::in_cluster(
            Path::new(SERVICE_ACCOUNT_DIR),
            env("KUBERNETES_SERVICE_HOST"),
            env("KUBERNETES_SERVICE_PORT"),
        )? {
            return Ok(c);
        }
        if let Some(list) = env("KUBECONFIG") {
            let paths: Vec<PathBuf> = std::env::split_paths(&list).collect();
            return Self::from_kubeconfigs(&paths);
        }
        match env("HOME") {
            Some(home) => Self::from_kubeconfigs(&[Path::new(&home).join(".kube/config")]),
            None => Err(config_error(
                "not in a pod (KUBERNETES_SERVICE_HOST unset), and neither KUBECONFIG nor HOME is set",
            )),
        }
    }

    /// The in-cluster config from a service-account directory, if `host`
    /// and `port` are set (client-go's `InClusterConfig`).
    pub fn in_cluster(
        dir: &Path,
        host: Option<String>,
        port: Option<String>,
    ) -> Result<Option<ClusterConfig>> {
        let (Some(host), Some(port)) = (host, port) else {
            return Ok(None);
        };
        let token = dir.join("token");
        // Read now so that a pod without a mounted token fails at start.
        std::fs::read_to_string(&token)
            .map_err(|e| config_error(format!("in-cluster token {}: {e}", token.display())))?;
        let ca = dir.join("ca.crt");
        let ca_pem = std::fs::read(&ca)
            .map_err(|e| config_error(format!("in-cluster CA {}: {e}", ca.display())))?;
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host
        };
        Ok(Some(ClusterConfig {
            server: format!("https://{host}:{port}"),
            ca_pem: Some(ca_pem),
            insecure_skip_tls_verify: false,
            auth: Auth::TokenFile(token),
        }))
    }

    /// The current context of the merged kubeconfig `files` (missing files
    /// are skipped, as client-go skips them; none existing is an error).
    pub fn from_kubeconfigs(files: &[PathBuf]) -> Result<ClusterConfig> {
        let mut merged = Merged::default();
        let mut read_any = false;
        for file in files {
            let text = match std::fs::read_to_string(file) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(config_error(format!("{}: {e}", file.display()))),
            };
            read_any = true;
            let kc: KubeConfig = serde_yaml::from_str(&text)
                .map_err(|e| config_error(format!("{}: {e}", file.display())))?;
            merged.add(kc, file.parent().unwrap_or(Path::new(".")));
        }
        if !read_any {
            let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
            return Err(config_error(format!(
                "no kubeconfig found (looked at {})",
                names.join(", ")
            )));
        }
        merged.resolve()
    }

    /// The current context of one kubeconfig's `text`, as if read from a
    /// file in `dir` (relative paths in it resolve against `dir`).
    pub fn from_kubeconfig_text(text: &str, dir: &Path) -> Result<ClusterConfig> {
        let kc: KubeConfig = serde_yaml::from_str(text).map_err(config_error)?;
        let mut merged = Merged::default();
        merged.add(kc, dir);
        merged.resolve()
    }
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "kebab-case")]
struct KubeConfig {
    current_context: Option<String>,
    clusters: Vec<NamedCluster>,
    users: Vec<NamedUser>,
    contexts: Vec<NamedContext>,
}

#[derive(Deserialize)]
struct NamedCluster {
    name: String,
    cluster: Cluster,
}

#[derive(Deserialize)]
struct NamedUser {
    name: String,
    #[serde(default)]
    user: User,
}

#[derive(Deserialize)]
struct NamedContext {
    name: String,
    context: Context,
}

#[derive(Deserialize, Default, Clone)]
#[serde(default, rename_all = "kebab-case")]
struct Cluster {
    server: String,
    certificate_authority: Option<String>,
    certificate_authority_data: Option<String>,
    insecure_skip_tls_verify: bool,
    tls_server_name: Option<String>,
    proxy_url: Option<String>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(default, rename_all = "kebab-case")]
struct User {
    token: Option<String>,
    #[serde(rename = "tokenFile")]
    token_file: Option<String>,
    client_certificate: Option<String>,
    client_certificate_data: Option<String>,
    client_key: Option<String>,
    client_key_data: Option<String>,
    username: Option<String>,
    password: Option<String>,
    exec: Option<serde_yaml::Value>,
    auth_provider: Option<serde_yaml::Value>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(default)]
struct Context {
    cluster: String,
    user: String,
}

/// Entries of several files, first name wins; file paths already made
/// absolute against their file's directory.
#[derive(Default)]
struct Merged {
    current_context: Option<String>,
    clusters: HashMap<String, Cluster>,
    users: HashMap<String, User>,
    contexts: HashMap<String, Context>,
}

fn relative_to(dir: &Path, p: &mut Option<String>) {
    if let Some(path) = p {
        if !path.is_empty() && Path::new(path).is_relative() {
            *path = dir.join(&*path).display().to_string();
        }
    }
}

impl Merged {
    fn add(&mut self, kc: KubeConfig, dir: &Path) {
        if self.current_context.is_none() {
            self.current_context = kc.current_context.filter(|c| !c.is_empty());
        }
        for mut c in kc.clusters {
            relative_to(dir, &mut c.cluster.certificate_authority);
            self.clusters.entry(c.name).or_insert(c.cluster);
        }
        for mut u in kc.users {
            relative_to(dir, &mut u.user.token_file);
            relative_to(dir, &mut u.user.client_certificate);
            relative_to(dir, &mut u.user.client_key);
            self.users.entry(u.name).or_insert(u.user);
        }
        for c in kc.contexts {
            self.contexts.entry(c.name).or_insert(c.context);
        }
    }

    fn resolve(self) -> Result<ClusterConfig> {
        let name = self
            .current_context
            .ok_or_else(|| config_error("kubeconfig has no current-context"))?;
        let ctx = self
            .contexts
            .get(&name)
            .ok_or_else(|| config_error(format!("context {name:?} not found")))?;
        let cluster = self.clusters.get(&ctx.cluster).ok_or_else(|| {
            config_error(format!(
                "cluster {:?} of context {name:?} not found",
                ctx.cluster
            ))
        })?;
        if cluster.server.is_empty() {
            return Err(config_error(format!(
                "cluster {:?} has no server",
                ctx.cluster
            )));
        }
        for (field, set) in [
            ("tls-server-name", cluster.tls_server_name.is_some()),
            ("proxy-url", cluster.proxy_url.is_some()),
        ] {
            if set {
                return Err(config_error(format!(
                    "cluster {:?}: {field} is not supported",
                    ctx.cluster
                )));
            }
        }
        let ca_pem = pem_or_file(
            "certificate-authority",
            &cluster.certificate_authority_data,
            &cluster.certificate_authority,
        )?;
        let user =
            match ctx.user.as_str() {
                "" => User::default(),
                u => self.users.get(u).cloned().ok_or_else(|| {
                    config_error(format!("user {u:?} of context {name:?} not found"))
                })?,
            };
        Ok(ClusterConfig {
            server: cluster.server.trim_end_matches('/').to_string(),
            ca_pem,
            insecure_skip_tls_verify: cluster.insecure_skip_tls_verify,
            auth: user_auth(&ctx.user, user)?,
        })
    }
}

fn user_auth(name: &str, u: User) -> Result<Auth> {
    if u.exec.is_some() || u.auth_provider.is_some() {
        return Err(config_error(format!(
            "user {name:?}: credential plugins (exec, auth-provider) are not supported; \
             use a token, a tokenFile or a client certificate"
        )));
    }
    if let Some(t) = u.token.filter(|t| !t.is_empty()) {
        return Ok(Auth::Token(t));
    }
    if let Some(f) = u.token_file.filter(|f| !f.is_empty()) {
        return Ok(Auth::TokenFile(PathBuf::from(f)));
    }
    let cert = pem_or_file(
        "client-certificate",
        &u.client_certificate_data,
        &u.client_certificate,
    )?;
    let key = pem_or_file("client-key", &u.client_key_data, &u.client_key)?;
    match (cert, key) {
        (Some(cert_pem), Some(key_pem)) => return Ok(Auth::ClientCert { cert_pem, key_pem }),
        (None, None) => {}
        _ => {
            return Err(config_error(format!(
                "user {name:?}: a client certificate needs both certificate and key"
            )))
        }
    }
    if let (Some(username), Some(password)) = (u.username, u.password) {
        return Ok(Auth::Basic { username, password });
    }
    Ok(Auth::None)
}

/// `<field>-data` (base64 PEM) wins over `<field>` (a file), as in client-go.
fn pem_or_file(
    field: &str,
    data: &Option<String>,
    file: &Option<String>,
) -> Result<Option<Vec<u8>>> {
    if let Some(d) = data.as_deref().filter(|d| !d.is_empty()) {
        let compact: String = d.split_whitespace().collect();
        return base64::engine::general_purpose::STANDARD
            .decode(compact)
            .map(Some)
            .map_err(|e| config_error(format!("{field}-data: {e}")));
    }
    match file.as_deref().filter(|f| !f.is_empty()) {
        Some(f) => std::fs::read(f)
            .map(Some)
            .map_err(|e| config_error(format!("{field} {f}: {e}"))),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    const TWO_CONTEXTS: &str = "
apiVersion: v1
kind: Config
current-context: prod
clusters:
- name: prod
  cluster:
    server: https://10.0.0.1:6443/
    certificate-authority: ca.pem
- name: dev
  cluster:
    server: http://127.0.0.1:8080
    insecure-skip-tls-verify: true
users:
- name: ci
  user:
    tokenFile: token
- name: me
  user:
    client-certificate-data: Y2VydA==
    client-key-data: a2V5
contexts:
- name: prod
  context: {cluster: prod, user: ci, namespace: mooncake}
- name: dev
  context: {cluster: dev, user: me}
";

    #[test]
    fn the_current_context_with_paths_relative_to_the_file() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "ca.pem", "PEM");
        let kc = write(dir.path(), "config", TWO_CONTEXTS);
        let c = ClusterConfig::from_kubeconfigs(&[kc]).unwrap();
        assert_eq!(c.server, "https://10.0.0.1:6443");
        assert_eq!(c.ca_pem.as_deref(), Some(&b"PEM"[..]));
        assert_eq!(c.auth, Auth::TokenFile(dir.path().join("token")));
        assert!(!c.insecure_skip_tls_verify);
    }

    #[test]
    fn text_reads_like_a_file_in_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "ca.pem", "PEM");
        let kc = write(dir.path(), "config", TWO_CONTEXTS);
        let from_file = ClusterConfig::from_kubeconfigs(&[kc]).unwrap();
        let from_text = ClusterConfig::from_kubeconfig_text(TWO_CONTEXTS, dir.path()).unwrap();
        assert_eq!(from_text, from_file);
        assert!(ClusterConfig::from_kubeconfig_text("clusters: 3", dir.path()).is_err());
    }

    #[test]
    fn files_merge_first_wins() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "ca.pem", "PEM");
        let first = write(
            dir.path(),
            "first",
            "current-context: dev\nusers:\n- name: me\n  user: {token: abc}\n",
        );
        let second = write(dir.path(), "second", TWO_CONTEXTS);
        let missing = dir.path().join("missing");
        let c = ClusterConfig::from_kubeconfigs(&[missing, first, second]).unwrap();
        assert_eq!(c.server, "http://127.0.0.1:8080");
        assert!(c.insecure_skip_tls_verify);
        assert_eq!(c.auth, Auth::Token("abc".into()));
    }

    #[test]
    fn client_certificates_from_data() {
        let dir = tempfile::tempdir().unwrap();
        let text = TWO_CONTEXTS.replace("current-context: prod", "current-context: dev");
        let c = ClusterConfig::from_kubeconfigs(&[write(dir.path(), "c", &text)]).unwrap();
        assert_eq!(
            c.auth,
            Auth::ClientCert {
                cert_pem: b"cert".to_vec(),
                key_pem: b"key".to_vec()
            }
        );
    }

    #[test]
    fn unusable_configs_say_why() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            ("", "no current-context"),
            ("current-context: x\n", "context \"x\" not found"),
            (
                "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\nclusters:\n- name: c\n  cluster: {server: 'https://h', tls-server-name: k}\n",
                "tls-server-name is not supported",
            ),
            (
                "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\nclusters:\n- name: c\n  cluster: {server: 'https://h'}\nusers:\n- name: u\n  user: {exec: {command: aws}}\n",
                "credential plugins",
            ),
            (
                "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\nclusters:\n- name: c\n  cluster: {server: 'https://h'}\nusers:\n- name: u\n  user: {client-key-data: a2V5}\n",
                "needs both",
            ),
            ("clusters: 5\n", "clusters"),
        ];
        for (i, (text, want)) in cases.iter().enumerate() {
            let f = write(dir.path(), &format!("c{i}"), text);
            let e = ClusterConfig::from_kubeconfigs(&[f]).unwrap_err();
            assert_eq!(e.code, ErrorCode::K8S_LEASE_OPERATION_ERROR);
            assert!(e.context.contains(want), "{text:?}: {e}");
        }
        let e = ClusterConfig::from_kubeconfigs(&[dir.path().join("none")]).unwrap_err();
        assert!(e.context.contains("no kubeconfig found"), "{e}");
    }

    #[test]
    fn in_cluster_from_the_service_account_directory() {
        let dir = tempfile::tempdir().unwrap();
        let (host, port) = (Some("10.96.0.1".to_string()), Some("443".to_string()));
        assert_eq!(
            ClusterConfig::in_cluster(dir.path(), None, port.clone()).unwrap(),
            None
        );
        let e = ClusterConfig::in_cluster(dir.path(), host.clone(), port.clone()).unwrap_err();
        assert!(e.context.contains("in-cluster token"), "{e}");
        write(dir.path(), "token", "t0");
        write(dir.path(), "ca.crt", "CA");
        let c = ClusterConfig::in_cluster(dir.path(), host, port.clone())
            .unwrap()
            .unwrap();
        assert_eq!(c.server, "https://10.96.0.1:443");
        assert_eq!(c.ca_pem.as_deref(), Some(&b"CA"[..]));
        assert_eq!(c.auth, Auth::TokenFile(dir.path().join("token")));
        let v6 = ClusterConfig::in_cluster(dir.path(), Some("fd00::1".into()), port)
            .unwrap()
            .unwrap();
        assert_eq!(v6.server, "https://[fd00::1]:443");
    }
}
