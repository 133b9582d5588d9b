//! The `cloudcore` binary: its code is the `cloudcore` library, built here
//! with the binaries' allocator.

/// jemalloc, configured (.cargo/config.toml) to give idle pages back
/// within a second: glibc's malloc kept the peak of a burst (an apply of
/// thousands of objects, a round of pod churn) resident long after it was
/// freed. docs/kubernetes.md has the figures.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> anyhow::Result<()> {
    cloudcore::main()
}
