//! `cloudcore` for the benchmark harness: the `cloudcore` crate's program
//! with its allocator, as `cmd/cloudcore/src/main.rs` builds it.

/// jemalloc, as the real binary has it (the memory group measures it).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> anyhow::Result<()> {
    cloudcore::main()
}
