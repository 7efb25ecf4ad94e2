//! A replica slot's way to the database: one [`FaultProxy`] in front of the primary (which a
//! failover re-points: the moving address), or with a multi-host URL one proxy per server.
//! The network faults act on every proxy of the slot at once.

use std::net::SocketAddr;

use pg_elector_testkit::FaultProxy;
use pg_elector_testkit::server::failover::Follow;

/// What every slot's link is made of.
#[derive(Clone, Debug)]
pub(crate) struct Links {
    /// The servers, the primary first.
    pub(crate) targets: Vec<SocketAddr>,
    /// How the replicas follow a failover (with one server: a moving address that never
    /// moves).
    pub(crate) follow: Follow,
}

/// One slot's proxies.
#[derive(Debug)]
pub(crate) struct Link {
    proxies: Vec<FaultProxy>,
}

impl Link {
    /// One proxy in front of the first target, or (multi-host) one in front of each.
    pub(crate) async fn start(links: &Links) -> std::io::Result<Link> {
        let targets = match links.follow {
            Follow::MultiHost => &links.targets[..],
            _ => &links.targets[..1],
        };
        let mut proxies = Vec::new();
        for &target in targets {
            proxies.push(FaultProxy::start(target).await?);
        }
        Ok(Link { proxies })
    }

    /// The addresses a replica connects to, comma-separated, in the servers' order.
    pub(crate) fn addrs(&self) -> String {
        let addrs: Vec<String> = self.proxies.iter().map(|p| p.addr().to_string()).collect();
        addrs.join(",")
    }

    /// Drops every byte, both ways, on every proxy.
    pub(crate) fn blackhole(&self) {
        self.proxies.iter().for_each(FaultProxy::blackhole);
    }

    /// Forwards again.
    pub(crate) fn pass(&self) {
        self.proxies.iter().for_each(FaultProxy::pass);
    }

    /// Resets every connection of every proxy.
    pub(crate) fn reset(&self) {
        self.proxies.iter().for_each(FaultProxy::reset);
    }

    /// Connections accepted so far, on all proxies.
    pub(crate) fn accepted(&self) -> u64 {
        self.proxies.iter().map(FaultProxy::accepted).sum()
    }

    /// Connections open now, on all proxies.
    pub(crate) fn open(&self) -> usize {
        self.proxies.iter().map(FaultProxy::open).sum()
    }

    /// Moves a moving address to `target` (a multi-host link names both servers already).
    pub(crate) fn point_at(&self, target: SocketAddr) {
        if let [only] = &self.proxies[..] {
            only.retarget(target);
        }
    }
}
