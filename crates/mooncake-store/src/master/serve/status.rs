//! The status page at `GET /` of the HTTP port: the cluster at a glance in
//! one self-contained HTML page. Every number is rendered here, so it reads
//! without JavaScript; with it, the page refreshes them from `/metrics`
//! every two seconds and adds request rates.
//!
//! Each live number is an element with `data-metric` (the sample's name and
//! labels exactly as `/metrics` prints them) and `data-value` (the raw
//! value); `data-unit="bytes"` formats it as a size.

use std::fmt::Write as _;

use mooncake_common::size::format_size;

use crate::master::state::service::{MasterStats, SegmentSummary};

/// What the page shows, gathered by the HTTP handler.
pub(crate) struct StatusView<'a> {
    pub role: &'a str,
    pub stats: &'a MasterStats,
    pub segments: &'a [SegmentSummary],
    /// `(sample name, value)` of the request totals shown (and rated).
    pub totals: Vec<(&'static str, &'static str, u64)>,
    pub file_used: u64,
    pub file_capacity: u64,
    pub ha_lag: i64,
    pub ha_state: i64,
    pub gets: (u64, u64),
}

/// HTML-escapes `s` for text and attribute values.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A live number.
fn num(metric: &str, v: impl std::fmt::Display) -> String {
    format!(
        r#"<span class="n" data-metric="{}" data-value="{v}">{v}</span>"#,
        esc(metric)
    )
}

/// A live size.
fn bytes(metric: &str, v: u64) -> String {
    format!(
        r#"<span class="n" data-metric="{}" data-unit="bytes" data-value="{v}">{}</span>"#,
        esc(metric),
        format_size(v)
    )
}

fn pct(used: u64, cap: u64) -> f64 {
    if cap == 0 {
        0.0
    } else {
        (used as f64 * 100.0 / cap as f64).min(100.0)
    }
}

/// A usage bar; `used`/`cap` name the samples it follows.
fn bar(used_metric: &str, cap_metric: &str, used: u64, cap: u64) -> String {
    format!(
        r#"<div class="bar" data-used="{}" data-cap="{}"><div style="width:{:.1}%"></div></div>"#,
        esc(used_metric),
        esc(cap_metric),
        pct(used, cap)
    )
}

const STYLE: &str = r#"
body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#f4f5f7;color:#1d2330}
header{background:#1d2330;color:#fff;padding:12px 24px;display:flex;gap:24px;align-items:baseline}
header h1{font-size:18px;margin:0}header .role{background:#2e7d32;padding:2px 10px;border-radius:10px}
main{padding:16px 24px;display:grid;gap:16px}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(210px,1fr));gap:12px}
.card{background:#fff;border-radius:8px;padding:12px 16px;box-shadow:0 1px 2px #0002}
.card h2{font-size:12px;text-transform:uppercase;color:#5b6475;margin:0 0 6px}
.card .big{font-size:22px;font-weight:600}
.bar{background:#e3e6ec;border-radius:4px;height:8px;margin-top:6px;overflow:hidden}
.bar div{background:#3b7ddd;height:100%}
table{width:100%;border-collapse:collapse;background:#fff;border-radius:8px;box-shadow:0 1px 2px #0002}
th,td{text-align:left;padding:6px 12px;border-bottom:1px solid #eceef2}th{font-size:12px;color:#5b6475}
td.bar-cell{width:30%}.rate{color:#2e7d32}.muted{color:#8a93a5}
"#;

/// Refreshes every `data-metric` element and the bars from `/metrics`, and
/// fills the rates from two successive scrapes.
const SCRIPT: &str = r#"
(function(){
  function size(v){var u=['B','KiB','MiB','GiB','TiB'],i=0;while(v>=1024&&i<4){v/=1024;i++}return i?v.toFixed(2)+' '+u[i]:v+' B'}
  function parse(t){var m={};t.split('\n').forEach(function(l){if(!l||l[0]=='#')return;var i=l.lastIndexOf(' ');m[l.slice(0,i)]=parseFloat(l.slice(i+1))});return m}
  var prev=null,prevAt=0;
  function tick(){
    fetch('/metrics').then(function(r){return r.text()}).then(function(t){
      var m=parse(t),now=Date.now();
      document.querySelectorAll('[data-metric]').forEach(function(e){
        var v=m[e.dataset.metric];if(v===undefined)return;
        e.dataset.value=v;e.textContent=e.dataset.unit=='bytes'?size(v):v;
      });
      document.querySelectorAll('.bar[data-used]').forEach(function(b){
        var u=m[b.dataset.used],c=m[b.dataset.cap];if(u===undefined||!c)return;
        b.firstChild.style.width=Math.min(100,u*100/c).toFixed(1)+'%';
      });
      document.querySelectorAll('[data-rate]').forEach(function(e){
        var k=e.dataset.rate;if(!prev||prev[k]===undefined||m[k]===undefined)return;
        e.textContent=((m[k]-prev[k])*1000/(now-prevAt)).toFixed(2)+'/s';
      });
      var h=document.getElementById('hit');var tg=m['total_get_nums_'],vg=m['valid_get_nums_'];
      if(h&&tg)h.textContent=(vg*100/tg).toFixed(1)+'%';
      document.getElementById('updated').textContent='live, updated '+new Date().toLocaleTimeString();
      prev=m;prevAt=now;
    }).catch(function(){document.getElementById('updated').textContent='refresh failed'});
  }
  tick();setInterval(tick,2000);
})();
"#;

const HA_STATES: [&str; 9] = [
    "stopped",
    "connecting",
    "syncing",
    "watching",
    "recovering",
    "reconnecting",
    "promoting",
    "promoted",
    "failed",
];

pub(crate) fn render(v: &StatusView<'_>) -> String {
    let st = v.stats;
    let mut h = String::with_capacity(8192);
    let _ = write!(
        h,
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1"><title>Mooncake master</title><style>{STYLE}</style></head><body>
<header><h1>Mooncake master</h1><span class="role" id="role">{role}</span><span class="muted" id="updated">rendered by the server</span></header><main>
<section class="cards">"#,
        role = esc(v.role)
    );
    let card = |h: &mut String, title: &str, body: String| {
        let _ = write!(h, r#"<div class="card"><h2>{title}</h2>{body}</div>"#);
    };
    card(
        &mut h,
        "Memory",
        format!(
            r#"<div class="big">{} / {}</div>{}"#,
            bytes("master_allocated_bytes", st.allocated_bytes),
            bytes("master_total_capacity_bytes", st.capacity_bytes),
            bar(
                "master_allocated_bytes",
                "master_total_capacity_bytes",
                st.allocated_bytes,
                st.capacity_bytes
            )
        ),
    );
    card(
        &mut h,
        "Disk tier",
        format!(
            r#"<div class="big">{} / {}</div>{}"#,
            bytes("master_allocated_file_size_bytes", v.file_used),
            bytes("master_total_file_capacity_bytes", v.file_capacity),
            bar(
                "master_allocated_file_size_bytes",
                "master_total_file_capacity_bytes",
                v.file_used,
                v.file_capacity
            )
        ),
    );
    card(
        &mut h,
        "Keys",
        format!(
            r#"<div class="big">{}</div>soft-pinned {}"#,
            num("master_key_count", st.key_count),
            num("master_soft_pin_key_count", st.soft_pin_key_count)
        ),
    );
    card(
        &mut h,
        "Clients",
        format!(
            r#"<div class="big">{}</div>segments <span class="n">{}</span>"#,
            num("master_active_clients", st.active_clients),
            st.segment_count
        ),
    );
    let (valid, total) = v.gets;
    let hit = if total == 0 {
        "–".to_string()
    } else {
        format!("{:.1}%", valid as f64 * 100.0 / total as f64)
    };
    card(
        &mut h,
        "Hit rate",
        format!(
            r#"<div class="big" id="hit">{hit}</div>{} of {} reads found"#,
            num("valid_get_nums_", valid),
            num("total_get_nums_", total)
        ),
    );
    let state = usize::try_from(v.ha_state)
        .ok()
        .and_then(|i| HA_STATES.get(i))
        .unwrap_or(&"unknown");
    card(
        &mut h,
        "HA",
        format!(
            r#"<div class="big">{}</div>replication lag {} entries, standby state {} ({state})"#,
            esc(v.role),
            num("ha_oplog_standby_lag", v.ha_lag),
            num("ha_standby_state", v.ha_state)
        ),
    );
    h.push_str("</section>\n<section><table><tr><th>Requests</th><th>Total</th><th>Rate</th></tr>");
    for (label, metric, n) in &v.totals {
        let _ = write!(
            h,
            r#"<tr><td>{label}</td><td>{}</td><td class="rate" data-rate="{m}"><span class="muted">needs JavaScript</span></td></tr>"#,
            num(metric, n),
            m = esc(metric)
        );
    }
    h.push_str("</table></section>\n<section><table><tr><th>Segment</th><th>Endpoint</th><th>Used</th><th>Capacity</th><th></th></tr>");
    for s in v.segments {
        let label = format!("{{segment=\"{}\"}}", s.name);
        let used = format!("segment_allocated_bytes{label}");
        let cap = format!("segment_total_capacity_bytes{label}");
        let _ = write!(
            h,
            r#"<tr class="segment"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class="bar-cell">{}</td></tr>"#,
            esc(&s.name),
            esc(&s.endpoint),
            bytes(&used, s.used),
            bytes(&cap, s.capacity),
            bar(&used, &cap, s.used, s.capacity)
        );
    }
    if v.segments.is_empty() {
        h.push_str(r#"<tr><td colspan="5" class="muted">no segment mounted</td></tr>"#);
    }
    let _ = write!(
        h,
        "</table></section></main><script>{SCRIPT}</script></body></html>"
    );
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_rendered_and_names_escaped() {
        let stats = MasterStats {
            allocated_bytes: 2048,
            capacity_bytes: 4096,
            key_count: 3,
            ..Default::default()
        };
        let segs = [SegmentSummary {
            id: 1,
            name: "<seg>".into(),
            endpoint: "h:1".into(),
            base: 0,
            used: 2048,
            capacity: 4096,
            owner: 1,
            status: "OK",
        }];
        let page = render(&StatusView {
            role: "leader",
            stats: &stats,
            segments: &segs,
            totals: vec![("Put", "master_put_start_requests_total", 7)],
            file_used: 0,
            file_capacity: 0,
            ha_lag: 0,
            ha_state: 0,
            gets: (1, 2),
        });
        assert!(page.contains(r#"data-metric="master_key_count" data-value="3">3<"#));
        assert!(page.contains(r#"data-value="2048">2.00 KiB<"#));
        assert!(page.contains("&lt;seg&gt;"));
        assert!(!page.contains("<seg>"));
        assert!(page.contains(r#"style="width:50.0%""#));
        assert!(page.contains("50.0%"), "hit rate");
        assert!(
            !page.contains("http://") && !page.contains("https://"),
            "no external asset"
        );
    }
}
