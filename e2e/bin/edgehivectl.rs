//! `edgehivectl` for the tests: the `edgehivectl` crate's program, built by this
//! package so that `CARGO_BIN_EXE_e2e-edgehivectl` finds it, current, with this
//! build's features.

fn main() {
    edgehivectl::main()
}
