//! `gear config example [serve|tables|cluster]`: commented configs that
//! run as they are (gear-cli's tests start a server from the serve and the
//! tables examples and parse the cluster example). Every key is in
//! docs/CONFIG.md.

/// A table config for `gear serve --config FILE`: small (about 2 MB),
/// without `[grpc]` so that it needs no token.
pub const SERVE: &str = r#"# A table for `gear serve --config FILE`; every key is in docs/CONFIG.md.
# It runs as it is:
#   gear config example serve > table.toml
#   gear serve --config table.toml --dry-run   # checks it, prints the memory it needs
#   gear serve --config table.toml             # creates /dev/shm/my-table until Ctrl-C
# Programs attach by name: ReplayTable::attach("my-table", ..) in Rust,
# gear.Table.attach("my-table") in Python.
name = "my-table"              # the name processes attach by (a file in `dir`)
# dir = "/dev/shm"             # where the table's file goes
max_len = 100                  # T: the most steps one trajectory holds
capacity = 1024                # trajectories; a full table evicts (see [remover])
seed = 0                       # seeds the samplers' and remover's random streams
# sample_while_writing = false # true: samplers also read trajectories being written
# max_times_sampled = 1        # remove a trajectory once sampled this many times

[[columns]]                    # one per value a step stores, in storage order
name = "obs"
dtype = "f32"                  # bool u8 i8 i16 i32 i64 f16 bf16 f32 f64 (or float32, int64, ...)
shape = [4]                    # per step; leave out (or []) for a scalar

[[columns]]
name = "action"
dtype = "i64"

[[columns]]
name = "reward"
dtype = "f32"

[sampler]                      # uniform, prioritized, fifo, lifo, max-heap, min-heap
kind = "prioritized"
alpha = 0.6                    # priority exponent (0: uniform, 1: proportional)
beta = 0.4                     # importance-sampling exponent
# stratified = true            # one draw per equal slice of the priority mass

[remover]                      # which trajectory a full table evicts
kind = "fifo"                  # the oldest

[rate_limiter]                 # Reverb's semantics
min_size_to_sample = 64        # samplers wait until this many trajectories are stored
# A ratio also makes writers wait when samplers fall behind (and samplers
# when writers do): with no sampler running, writers stop after about
# error_buffer / samples_per_insert inserts. `gear serve`'s status line and
# `gear inspect my-table` show who waits and on what.
# samples_per_insert = 8.0
# error_buffer = 512.0         # slack around the ratio; at least 2 * max(1, samples_per_insert)
# queue = 256                  # instead of a ratio: a queue, each trajectory sampled once

# Uncomment to serve remote trainers and actors (gear-net). Every call
# carries the cluster token (16 characters or more): `token` here, else the
# GEAR_TOKEN environment variable.
# [grpc]
# listen = "0.0.0.0:50051"
# shard = 0                    # this server's index in the cluster file's `shards`
# token = "change-me-to-a-long-secret"
# max_message_bytes = 268435456   # largest message sent or accepted
# tls_cert = "server.pem"      # TLS: certificate chain and key (PEM)
# tls_key = "server.key"
# tls_client_ca = "ca.pem"     # mutual TLS: clients need a certificate from this CA
# [grpc.rdma]                  # the RDMA data plane (gear-net's `rdma` feature)
# device = "mlx5_0"            # else the first device
# port = 1                     # from 1
# gid_index = 3                # else chosen from the GID table (`show_gids`)
"#;

/// A server of two tables (`[[tables]]`) with a metrics endpoint, small,
/// without `[grpc]` so that it needs no token.
pub const TABLES: &str = r#"# A `gear serve --config FILE` of two tables; every key is in docs/CONFIG.md.
# It runs as it is:
#   gear config example tables > tables.toml
#   gear serve --config tables.toml --dry-run   # checks it, prints the memory they need
#   gear serve --config tables.toml             # until Ctrl-C; Prometheus on the printed address
# Local programs attach by each table's shm_name: ReplayTable::attach("my-replay", ..)
# in Rust, gear.Table.attach("my-replay") in Python. Remote ones (with [grpc])
# name the table by its name (a cluster file's `table`).

[[tables]]                     # a prioritized replay buffer for the learner
name = "replay"                # what remote clients name it by
shm_name = "my-replay"         # its file in `dir`, what local processes attach by (default: name)
# dir = "/dev/shm"
max_len = 64                   # T: the most steps one trajectory holds
capacity = 1024                # trajectories; a full table evicts the oldest
seed = 0

[[tables.columns]]             # one per value a step stores, in storage order
name = "obs"
dtype = "f32"
shape = [8]

[[tables.columns]]
name = "reward"
dtype = "f32"

[tables.sampler]
kind = "prioritized"
alpha = 0.6
beta = 0.4

[tables.rate_limiter]
min_size_to_sample = 16        # samplers wait until 16 trajectories are stored

[[tables]]                     # beside it, a queue: each trajectory read once, in order
name = "queue"
shm_name = "my-queue"
max_len = 64
capacity = 256
max_times_sampled = 1          # removed once sampled

[[tables.columns]]
name = "obs"
dtype = "f32"
shape = [8]

[[tables.columns]]
name = "reward"
dtype = "f32"

[tables.sampler]
kind = "fifo"

[tables.rate_limiter]
queue = 256                    # writers wait while 256 unread trajectories are stored

# Prometheus text on GET /metrics (no token: keep the address private).
# Port 0 takes a free port, printed at start; give Prometheus a fixed one
# such as "127.0.0.1:9090".
[metrics]
listen = "127.0.0.1:0"

# Uncomment to serve remote clients; the token is `token` here, else the
# GEAR_TOKEN environment variable (16 characters or more).
# [grpc]
# listen = "0.0.0.0:50051"
# shard = 0
# token = "change-me-to-a-long-secret"
"#;

/// The example `gear config example KIND` prints: `serve`, `tables` or
/// `cluster` (clap admits no other).
pub fn by_kind(kind: &str) -> &'static str {
    match kind {
        "cluster" => CLUSTER,
        "tables" => TABLES,
        _ => SERVE,
    }
}

/// A cluster file, as `gear cluster up --local 3` writes one.
pub const CLUSTER: &str = r#"# How trainers and actors reach a cluster of `gear serve` shards; every key
# is in docs/CONFIG.md. `gear cluster up --local 3 --config shard.toml`
# writes one for three local shards; `gear cluster-info --cluster FILE`
# asks each shard its counters.
shards = ["127.0.0.1:50051", "127.0.0.1:50052", "127.0.0.1:50053"]  # index = the server's `shard`
# token = "change-me-to-a-long-secret"  # else the GEAR_TOKEN environment variable
# call_timeout_ms = 10000      # deadline of every call
# connect_timeout_ms = 1000    # deadline of connecting to a shard
# free_space_refresh_ms = 500  # writers with WriteTarget::MostFree ask the sizes this often
# mass_refresh_ms = 100        # a shard's priority mass from its replies is used this long (0: ask every batch)

# With tls_cert/tls_key on the servers:
# [tls]
# ca = "ca.pem"                # the CA that signed the servers' certificates
# domain = "gear.cluster.local"  # the name in their certificates (else each address's host)
# cert = "client.pem"          # mutual TLS: this client's certificate
# key = "client.key"           # and key

# The RDMA device byte-range reads open (gear-net's `rdma` feature):
# [rdma]
# device = "mlx5_0"            # else the first device
# port = 1                     # from 1
# gid_index = 3                # else chosen from the GID table (`show_gids`)
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_examples_parse_and_describe_a_working_table() {
        let c = crate::config::TableConfig::parse(SERVE).unwrap();
        assert!(c.grpc.is_none(), "the serve example must run without a token");
        let bytes = c.builder().unwrap().check().unwrap();
        assert!(bytes < 16 << 20, "the example table stays small: {bytes} bytes");
        let cluster = crate::cluster_config::ClusterFile::parse(CLUSTER).unwrap();
        assert_eq!(cluster.shards.len(), 3);
        // The commented-out sections parse once uncommented.
        let uncomment = |text: &str| {
            text.lines()
                .map(|l| l.strip_prefix("# ").filter(|r| r.starts_with('[') || r.contains(" = ")).unwrap_or(l))
                .collect::<Vec<_>>()
                .join("\n")
        };
        let full = uncomment(SERVE).replace("queue = 256", "");
        let c = crate::config::TableConfig::parse(&full).unwrap();
        assert_eq!(c.grpc.as_ref().map(|g| g.shard), Some(0));
        assert_eq!(c.max_times_sampled, Some(1));
        crate::cluster_config::ClusterFile::parse(&uncomment(CLUSTER)).unwrap();
        let tables = crate::config::ServeConfig::parse(TABLES).unwrap();
        assert!(tables.several && tables.grpc.is_none() && tables.metrics.is_some());
        assert_eq!(tables.tables.len(), 2);
        for t in &tables.tables {
            let bytes = t.builder().unwrap().check().unwrap();
            assert!(bytes < 16 << 20, "the example tables stay small: {bytes} bytes");
        }
        let full = crate::config::ServeConfig::parse(&uncomment(TABLES)).unwrap();
        assert_eq!(full.grpc.as_ref().map(|g| g.shard), Some(0));
    }
}
