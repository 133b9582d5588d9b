//! The `edgecore` binary: its code is the `edgecore` library, built here
//! with the binaries' allocator.

/// jemalloc, as cloudcore has it (see there).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> anyhow::Result<()> {
    edgecore::main()
}
