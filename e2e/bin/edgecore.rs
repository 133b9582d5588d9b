//! `edgecore` for the tests: the `edgecore` crate's program, built by this
//! package so that `CARGO_BIN_EXE_e2e-edgecore` finds it, current, with this
//! build's features.

/// jemalloc, as the real binary has it.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> anyhow::Result<()> {
    edgecore::main()
}
