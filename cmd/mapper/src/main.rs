//! The `edgehive-mapper` binary: its code is the `edgehive_mapper` library.

fn main() -> anyhow::Result<()> {
    edgehive_mapper::main()
}
