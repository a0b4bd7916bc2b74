//! The control plane of the data plane: gear-core's [`PeerEndpoint`] and
//! [`RemoteRegion`] as `Connect` messages and back. Everything decoded
//! comes from the network and is validated before use.

use gear_core::{PeerEndpoint, QueuePairEndpoint, RdmaEndpoint, RemoteAccess, RemoteRegion, TcpEndpoint};

use crate::proto::{self, connect_reply, connect_request, ConnectReply, ConnectRequest};

fn rdma_to_proto(e: &RdmaEndpoint) -> proto::RdmaPeer {
    proto::RdmaPeer {
        gid: e.gid.to_vec(),
        gid_index: u32::from(e.gid_index),
        lid: u32::from(e.lid),
        mtu: e.mtu,
        queue_pairs: e.queue_pairs.iter().map(|q| proto::QueuePair { qp_number: q.qp_number, psn: q.psn }).collect(),
        session: e.session,
        max_read_initiator: u32::from(e.max_read_initiator),
        max_read_responder: u32::from(e.max_read_responder),
    }
}

fn rdma_from_proto(p: &proto::RdmaPeer) -> Result<RdmaEndpoint, String> {
    let gid: [u8; 16] =
        p.gid.as_slice().try_into().map_err(|_| format!("rdma gid has {} bytes, expected 16", p.gid.len()))?;
    let gid_index = u8::try_from(p.gid_index).map_err(|_| format!("rdma gid index {} is above 255", p.gid_index))?;
    let lid = u16::try_from(p.lid).map_err(|_| format!("rdma lid {} is above 65535", p.lid))?;
    if p.queue_pairs.len() > gear_core::transport::MAX_QUEUE_PAIRS {
        return Err(format!("{} rdma queue pairs", p.queue_pairs.len()));
    }
    let limit = |what: &str, v: u32| u8::try_from(v).map_err(|_| format!("rdma {what} read limit {v} is above 255"));
    let e = RdmaEndpoint {
        gid,
        gid_index,
        lid,
        mtu: p.mtu,
        queue_pairs: p.queue_pairs.iter().map(|q| QueuePairEndpoint { qp_number: q.qp_number, psn: q.psn }).collect(),
        session: p.session,
        max_read_initiator: limit("initiator", p.max_read_initiator)?,
        max_read_responder: limit("responder", p.max_read_responder)?,
    };
    e.validate().map_err(|e| e.to_string())?;
    Ok(e)
}

fn tcp_from_proto(p: &proto::TcpPeer) -> Result<TcpEndpoint, String> {
    let e = TcpEndpoint { address: p.address.clone() };
    PeerEndpoint::Tcp(e.clone()).validate().map_err(|e| e.to_string())?;
    Ok(e)
}

/// A client's endpoint as a `Connect` request.
pub fn request_from_endpoint(endpoint: &PeerEndpoint) -> ConnectRequest {
    let endpoint = match endpoint {
        PeerEndpoint::Rdma(e) => connect_request::Endpoint::Rdma(rdma_to_proto(e)),
        PeerEndpoint::Tcp(e) => connect_request::Endpoint::Tcp(proto::TcpPeer { address: e.address.clone() }),
        // gear-core may grow transports this crate does not carry yet.
        #[allow(unreachable_patterns)]
        _ => connect_request::Endpoint::Tcp(proto::TcpPeer { address: String::new() }),
    };
    ConnectRequest { endpoint: Some(endpoint), table: String::new() }
}

/// The endpoint of a `Connect` request, validated.
pub fn endpoint_from_request(req: &ConnectRequest) -> Result<PeerEndpoint, String> {
    match &req.endpoint {
        Some(connect_request::Endpoint::Rdma(p)) => Ok(PeerEndpoint::Rdma(rdma_from_proto(p)?)),
        Some(connect_request::Endpoint::Tcp(p)) => Ok(PeerEndpoint::Tcp(tcp_from_proto(p)?)),
        None => Err("connect request names no endpoint".into()),
    }
}

/// A region descriptor as a `Connect` reply.
pub fn reply_from_remote(remote: &RemoteRegion) -> ConnectReply {
    let access = match &remote.access {
        RemoteAccess::Rdma { addr, rkey, peer } => {
            connect_reply::Access::Rdma(proto::RdmaAccess { addr: *addr, rkey: *rkey, peer: Some(rdma_to_proto(peer)) })
        }
        RemoteAccess::Tcp { peer, region_id } => connect_reply::Access::Tcp(proto::TcpAccess {
            peer: Some(proto::TcpPeer { address: peer.address.clone() }),
            region_id: *region_id,
        }),
        #[allow(unreachable_patterns)]
        _ => connect_reply::Access::Tcp(proto::TcpAccess::default()),
    };
    ConnectReply { shard: remote.shard, incarnation: remote.incarnation, len: remote.len, access: Some(access) }
}

/// The region descriptor of a `Connect` reply, validated.
pub fn remote_from_reply(reply: &ConnectReply) -> Result<RemoteRegion, String> {
    let access = match &reply.access {
        Some(connect_reply::Access::Rdma(a)) => RemoteAccess::Rdma {
            addr: a.addr,
            rkey: a.rkey,
            peer: rdma_from_proto(a.peer.as_ref().ok_or("rdma access names no peer")?)?,
        },
        Some(connect_reply::Access::Tcp(a)) => RemoteAccess::Tcp {
            peer: tcp_from_proto(a.peer.as_ref().ok_or("tcp access names no peer")?)?,
            region_id: a.region_id,
        },
        None => return Err("connect reply names no access".into()),
    };
    let remote = RemoteRegion { shard: reply.shard, incarnation: reply.incarnation, len: reply.len, access };
    remote.validate().map_err(|e| e.to_string())?;
    Ok(remote)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_round_trip_and_bad_ones_are_refused() {
        let peer = RdmaEndpoint {
            gid: [3; 16],
            gid_index: 1,
            lid: 7,
            mtu: 4096,
            queue_pairs: vec![QueuePairEndpoint { qp_number: 0x11, psn: 5 }],
            session: 0x5e55_1011,
            max_read_initiator: 16,
            max_read_responder: 4,
        };
        let e = PeerEndpoint::Rdma(peer.clone());
        assert_eq!(endpoint_from_request(&request_from_endpoint(&e)).unwrap(), e);
        let r = RemoteRegion {
            shard: 1,
            incarnation: 2,
            len: 4096,
            access: RemoteAccess::Rdma { addr: 64, rkey: 9, peer },
        };
        assert_eq!(remote_from_reply(&reply_from_remote(&r)).unwrap(), r);
        let t = RemoteRegion {
            shard: 1,
            incarnation: 2,
            len: 4096,
            access: RemoteAccess::Tcp { peer: TcpEndpoint { address: "h:1".into() }, region_id: 4 },
        };
        assert_eq!(remote_from_reply(&reply_from_remote(&t)).unwrap(), t);

        let mut bad = request_from_endpoint(&e);
        if let Some(connect_request::Endpoint::Rdma(p)) = &mut bad.endpoint {
            p.gid.pop();
        }
        assert!(endpoint_from_request(&bad).is_err());
        for (initiator, responder) in [(0, 4), (16, 0), (256, 4), (16, 1000)] {
            let mut limits = request_from_endpoint(&e);
            if let Some(connect_request::Endpoint::Rdma(p)) = &mut limits.endpoint {
                (p.max_read_initiator, p.max_read_responder) = (initiator, responder);
            }
            let err = endpoint_from_request(&limits).unwrap_err();
            assert!(err.contains("read limit"), "{initiator}/{responder}: {err}");
        }
        assert!(endpoint_from_request(&ConnectRequest { endpoint: None, table: String::new() }).is_err());
        let mut wraps = reply_from_remote(&r);
        if let Some(connect_reply::Access::Rdma(a)) = &mut wraps.access {
            a.addr = u64::MAX;
        }
        assert!(remote_from_reply(&wraps).is_err());
        let mut long = reply_from_remote(&t);
        if let Some(connect_reply::Access::Tcp(a)) = &mut long.access {
            a.peer = Some(proto::TcpPeer { address: "x".repeat(5000) });
        }
        assert!(remote_from_reply(&long).is_err());
    }
}
