//! `mapper` for the tests: the `edgehive_mapper` crate's program, built by this
//! package so that `CARGO_BIN_EXE_e2e-mapper` finds it, current, with this
//! build's features.

fn main() -> anyhow::Result<()> {
    edgehive_mapper::main()
}
