//! A tiny DNS server on 127.0.0.1 (UDP) that answers A and AAAA queries for one name from a list that
//! the test (or example) changes while it runs, or with SERVFAIL when told to fail; and the
//! resolver configuration that points a channel at it.
//!
//! Shared by the tests (`fleet::dns`) and the examples.
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tonic_balancer::DnsSettings;

/// A DNS server on 127.0.0.1 (UDP) that answers A and AAAA queries for one name from a list
/// the test changes, or with SERVFAIL when told to fail. Answers have a TTL of 0; other names get
/// NXDOMAIN. It runs on the current tokio runtime until that runtime ends.
pub struct DnsServer {
    /// Where it listens.
    pub addr: SocketAddr,
    records: Arc<Mutex<Vec<IpAddr>>>,
    /// When true, every query is answered with SERVFAIL.
    pub fail: Arc<AtomicBool>,
    /// Queries received (well-formed ones).
    pub queries: Arc<AtomicU64>,
}

impl DnsServer {
    /// Starts a server for `name` (fully qualified, such as `fleet.test.`), with no records.
    pub async fn start(name: &'static str) -> DnsServer {
        use hickory_proto::op::{Message, MessageType, ResponseCode};
        use hickory_proto::rr::{rdata::A, rdata::AAAA, Name, RData, Record, RecordType};
        let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = sock.local_addr().unwrap();
        let records = Arc::new(Mutex::new(Vec::new()));
        let fail = Arc::new(AtomicBool::new(false));
        let queries = Arc::new(AtomicU64::new(0));
        let (r, f, q) = (records.clone(), fail.clone(), queries.clone());
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            let want = Name::from_ascii(name).unwrap();
            loop {
                let Ok((n, peer)) = sock.recv_from(&mut buf).await else {
                    return;
                };
                let Ok(req) = Message::from_vec(&buf[..n]) else {
                    continue;
                };
                q.fetch_add(1, Ordering::SeqCst);
                let mut resp =
                    Message::new(req.metadata.id, MessageType::Response, req.metadata.op_code);
                resp.metadata.recursion_desired = req.metadata.recursion_desired;
                resp.metadata.recursion_available = true;
                resp.metadata.authoritative = true;
                for query in &req.queries {
                    resp.add_query(query.clone());
                    if f.load(Ordering::SeqCst) {
                        resp.metadata.response_code = ResponseCode::ServFail;
                        continue;
                    }
                    if query.name().to_lowercase() != want.to_lowercase() {
                        resp.metadata.response_code = ResponseCode::NXDomain;
                        continue;
                    }
                    for ip in r.lock().unwrap().iter() {
                        let rdata = match (query.query_type(), ip) {
                            (RecordType::A, IpAddr::V4(v4)) => RData::A(A(*v4)),
                            (RecordType::AAAA, IpAddr::V6(v6)) => RData::AAAA(AAAA(*v6)),
                            _ => continue,
                        };
                        resp.add_answer(Record::from_rdata(query.name().clone(), 0, rdata));
                    }
                }
                let _ = sock.send_to(&resp.to_vec().unwrap(), peer).await;
            }
        });
        DnsServer {
            addr,
            records,
            fail,
            queries,
        }
    }

    /// Replaces the records of the name with these A records.
    pub fn set(&self, ips: &[Ipv4Addr]) {
        *self.records.lock().unwrap() = ips.iter().map(|ip| IpAddr::V4(*ip)).collect();
    }

    /// Replaces the records of the name: A records for the IPv4 addresses, AAAA for the IPv6.
    pub fn set_ips(&self, ips: &[IpAddr]) {
        *self.records.lock().unwrap() = ips.to_vec();
    }

    /// The records now published.
    pub fn records(&self) -> Vec<IpAddr> {
        self.records.lock().unwrap().clone()
    }

    /// Makes every answer SERVFAIL (true) or normal again (false).
    pub fn set_failing(&self, fail: bool) {
        self.fail.store(fail, Ordering::SeqCst);
    }

    /// Queries received so far.
    pub fn query_count(&self) -> u64 {
        self.queries.load(Ordering::SeqCst)
    }
}

/// Resolver settings that ask only `server`, once, with a short timeout.
pub fn resolver_for(server: &DnsServer) -> DnsSettings {
    DnsSettings::name_servers([server.addr])
        .timeout(Duration::from_millis(500))
        .attempts(1)
}
