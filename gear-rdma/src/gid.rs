//! Which entry of a port's GID table to address this side by, when the
//! configuration does not say.
//!
//! On InfiniBand any valid entry works and index 0 (the port GID) is the
//! usual one. On RoCE the table has an entry per IP address of the netdev
//! and per RoCE version, and index 0 is normally the RoCE v1 (or v2)
//! entry of the link-local IPv6 address: RoCE v1 frames are not routed,
//! and a link-local address does not cross a router, so index 0 works
//! only between hosts on one L2 segment. The default is therefore the
//! RoCE v2 entry of an IPv4 address (what NCCL and `show_gids` users pick
//! by hand), else of a global IPv6 address, else of a link-local one, and
//! index 0 when the port has no RoCE v2 entry (InfiniBand, RoCE v1 only).
//! The entries' types come from the device (`ibv_query_gid_type`, the
//! same data as sysfs `gid_attrs/types`).

/// What kind of entry a GID table row is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidKind {
    /// InfiniBand, or RoCE v1 (the device does not tell them apart:
    /// `IBV_GID_TYPE_IB` and sysfs `IB/RoCE v1`).
    InfiniBandOrRoceV1,
    /// RoCE v2: the GID is an IP address and frames are UDP/IP, routable.
    RoceV2,
}

/// One valid entry of a port's GID table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidEntry {
    /// Its index in the table.
    pub index: u8,
    /// The GID (an IPv6 address; IPv4 ones are IPv4-mapped, `::ffff:a.b.c.d`).
    pub gid: [u8; 16],
    /// Its type.
    pub kind: GidKind,
}

/// How much an entry is preferred as the default: lower is better; `None`
/// for entries never picked by default.
fn rank(entry: &GidEntry) -> Option<u8> {
    if entry.kind != GidKind::RoceV2 || entry.gid == [0; 16] {
        return None;
    }
    let ip = std::net::Ipv6Addr::from(entry.gid);
    if ip.to_ipv4_mapped().is_some() {
        Some(0)
    } else if ip.segments()[0] & 0xffc0 == 0xfe80 {
        // Link-local: reaches only the same segment.
        Some(2)
    } else {
        Some(1)
    }
}

/// The GID index to use when none is configured: the RoCE v2 entry of an
/// IPv4 address, else of a global IPv6 address, else of a link-local
/// IPv6 address (the lowest index of the best kind), else 0.
pub fn default_gid_index(table: &[GidEntry]) -> u8 {
    table.iter().filter_map(|e| rank(e).map(|r| (r, e.index))).min().map_or(0, |(_, index)| index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u8, ip: &str, kind: GidKind) -> GidEntry {
        let ip: std::net::IpAddr = ip.parse().unwrap();
        let gid = match ip {
            std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            std::net::IpAddr::V6(v6) => v6.octets(),
        };
        GidEntry { index, gid, kind }
    }

    use GidKind::{InfiniBandOrRoceV1 as V1, RoceV2 as V2};

    #[test]
    fn a_connectx_roce_table_picks_the_ipv4_roce_v2_entry() {
        // What `show_gids` prints for a ConnectX port with one IPv4 and one
        // global IPv6 address: v1 and v2 entries of each, link-local first.
        let table = [
            entry(0, "fe80::ba59:9fff:fe12:3456", V1),
            entry(1, "fe80::ba59:9fff:fe12:3456", V2),
            entry(2, "2001:db8::12", V1),
            entry(3, "2001:db8::12", V2),
            entry(4, "10.0.3.7", V1),
            entry(5, "10.0.3.7", V2),
        ];
        assert_eq!(default_gid_index(&table), 5);
        assert_eq!(default_gid_index(&table[..4]), 3, "no IPv4: the global IPv6 one");
        assert_eq!(default_gid_index(&table[..2]), 1, "link-local v2 rather than v1");
    }

    #[test]
    fn infiniband_roce_v1_and_empty_tables_keep_index_zero() {
        let ib = [entry(0, "fe80::2:c903:a:1b2c", V1), entry(1, "fec0::2:c903:a:1b2c", V1)];
        assert_eq!(default_gid_index(&ib), 0);
        assert_eq!(default_gid_index(&[]), 0);
        let zero = GidEntry { index: 2, gid: [0; 16], kind: V2 };
        assert_eq!(default_gid_index(&[ib[0], zero]), 0, "an empty entry is never picked");
    }

    #[test]
    fn the_lowest_index_wins_among_equals() {
        let table = [entry(7, "192.168.1.2", V2), entry(3, "10.0.0.1", V2), entry(1, "2001:db8::1", V2)];
        assert_eq!(default_gid_index(&table), 3);
    }
}
