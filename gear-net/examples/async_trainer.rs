//! A trainer loop on the async cluster client: batches decoded straight
//! into the trainer's own buffers, reused every step, and priorities sent
//! back. The README's "Async client" snippet is the part between the
//! `snippet` markers (gear-net's `tests/readme.rs` checks they match), a
//! whole `rust,no_run` block that compiles on its own.
//!
//! ```sh
//! GEAR_TOKEN=... GEAR_SHARDS=node0:50051,node1:50051 cargo run -p gear-net --example async_trainer
//! ```

// snippet begin
use gear_core::WindowSpec;
use gear_net::{AsyncClusterClient, BatchRows, ClusterConfig, ClusterSample};

async fn train(shards: Vec<String>, token: String, steps: usize) -> gear_net::Result<()> {
    let cluster = AsyncClusterClient::new(ClusterConfig::new(shards, token))?;
    let request = ClusterSample { rows: 256, window: WindowSpec::last(32), columns: vec![], random_start: false };
    // The trainer's own buffers (pinned memory, say), filled in place.
    let sizes = cluster.column_bytes(&request).await?;
    let mut columns: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0; n]).collect();
    let mut rows = BatchRows::default();
    for _ in 0..steps {
        let mut views: Vec<&mut [u8]> = columns.iter_mut().map(Vec::as_mut_slice).collect();
        cluster.sample_into(&request, &mut views, &mut rows).await?;
        // ... a training step on `columns`, weighted by `rows.weights` ...
        let priorities: Vec<_> = rows.keys.iter().map(|&key| (key, 1.0)).collect();
        cluster.update_priorities(&priorities).await?;
    }
    Ok(())
}
// snippet end

#[tokio::main(flavor = "current_thread")]
async fn main() -> gear_net::Result<()> {
    let shards: Vec<String> = std::env::var("GEAR_SHARDS")
        .unwrap_or_else(|_| "127.0.0.1:50051".into())
        .split(',')
        .map(str::to_owned)
        .collect();
    let token = std::env::var("GEAR_TOKEN").unwrap_or_default();
    train(shards, token, 100).await
}
