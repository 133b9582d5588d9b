//! The `edgehivectl` binary: its code is the `edgehivectl` library.

fn main() {
    edgehivectl::main()
}
