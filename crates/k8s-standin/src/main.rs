//! `k8s-standin`: the Kubernetes API stand-in as a process, for tests that
//! run masters and clients as processes. It writes a kubeconfig pointing
//! at itself (and, over HTTPS, the CA beside it), prints its base URL on
//! stdout, and serves until killed. Faults are switched with
//! `POST /standin/{freeze,thaw}` and
//! `POST /standin/{deny,allow}?verb=..&resource=..`.

use std::path::PathBuf;

use clap::Parser;
use k8s_standin::{tls::TestCa, StandIn};

#[derive(Parser)]
#[command(about = "Stand-in for the Kubernetes API server (Leases, Pods)")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// Serve HTTPS with a CA made now (written next to the kubeconfig).
    #[arg(long)]
    tls: bool,
    /// Bearer token to accept (repeatable); none: no authentication.
    #[arg(long)]
    token: Vec<String>,
    /// Pod to create, `namespace/name` (repeatable).
    #[arg(long)]
    pod: Vec<String>,
    /// Where to write a kubeconfig for this server (with the first token).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let standin = StandIn::new();
    for t in &args.token {
        standin.add_token(t, "system:serviceaccount:default:mooncake");
    }
    for p in &args.pod {
        let (ns, name) = p
            .split_once('/')
            .ok_or_else(|| anyhow::anyhow!("--pod wants namespace/name, got {p:?}"))?;
        standin.add_pod(ns, name);
    }
    let ca = args.tls.then(TestCa::generate);
    let listener = tokio::net::TcpListener::bind(&args.listen).await?;
    let scheme = if ca.is_some() { "https" } else { "http" };
    let url = format!("{scheme}://{}", listener.local_addr()?);
    if let Some(path) = &args.kubeconfig {
        let mut cluster = format!("    server: {url}\n");
        if let Some(ca) = &ca {
            let ca_path = path.with_extension("ca.pem");
            std::fs::write(&ca_path, &ca.ca_pem)?;
            cluster += &format!("    certificate-authority: {}\n", ca_path.display());
        }
        let user = match args.token.first() {
            Some(t) => format!("    token: {t}\n"),
            None => "    {}\n".to_string(),
        };
        let config = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: standin\n  cluster:\n{cluster}\
             users:\n- name: standin\n  user:\n{user}contexts:\n- name: standin\n  context:\n    \
             cluster: standin\n    user: standin\n    namespace: default\ncurrent-context: standin\n"
        );
        std::fs::write(path, config)?;
    }
    println!("{url}");
    k8s_standin::run(listener, standin, ca.map(|c| c.acceptor())).await?;
    Ok(())
}
