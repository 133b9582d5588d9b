//! edgehive's fuzz targets in one binary, so CI builds one instrumented
//! program (scripts/fuzz; docs/fuzzing.md says what each target covers).
//!
//! ```text
//! edgehive-fuzz TARGET            under afl-fuzz: AFL++'s persistent mode
//!                                 (with the `afl` feature), else one input on stdin
//! edgehive-fuzz TARGET FILE...    runs each file once (a crash's input, a corpus)
//! edgehive-fuzz seeds DIR         writes every target's seeds under DIR/<target>/
//! edgehive-fuzz list              the targets' names
//! ```

mod targets;

use std::path::Path;
use std::process::ExitCode;

use targets::{ALL, Target};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("list") => {
            for target in &ALL {
                println!("{}", target.name);
            }
            ExitCode::SUCCESS
        }
        Some("seeds") => {
            let Some(dir) = args.get(1) else {
                eprintln!("usage: edgehive-fuzz seeds DIR");
                return ExitCode::from(2);
            };
            match targets::seeds::write_all(Path::new(dir)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("seeds not written: {err}");
                    ExitCode::FAILURE
                }
            }
        }
        Some(name) => {
            let Some(target) = ALL.iter().find(|t| t.name == name) else {
                eprintln!("no target {name:?}; edgehive-fuzz list names them");
                return ExitCode::from(2);
            };
            if args.len() > 1 {
                replay(target, &args[1..])
            } else {
                fuzz(target);
                ExitCode::SUCCESS
            }
        }
        None => {
            eprintln!("usage: edgehive-fuzz TARGET [FILE...] | seeds DIR | list");
            ExitCode::from(2)
        }
    }
}

/// Runs each file through `target` (a panic aborts the process).
fn replay(target: &Target, files: &[String]) -> ExitCode {
    (target.prepare)();
    for file in files {
        match std::fs::read(file) {
            Ok(data) => (target.run)(&data),
            Err(err) => {
                eprintln!("{file}: {err}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

#[cfg(not(feature = "afl"))]
fn fuzz(target: &Target) {
    use std::io::Read as _;
    (target.prepare)();
    let mut data = Vec::new();
    if std::io::stdin().read_to_end(&mut data).is_ok() {
        (target.run)(&data);
    }
}

#[cfg(feature = "afl")]
fn fuzz(target: &Target) {
    afl::run(target.prepare, target.run);
}

/// AFL++'s persistent mode over its runtime (afl-compiler-rt.o), as its
/// `__AFL_LOOP` and `__AFL_FUZZ_TESTCASE_BUF` macros do in C: the fork
/// server starts once the target is prepared, then each child runs many
/// inputs, each handed over in shared memory.
#[cfg(feature = "afl")]
#[allow(unsafe_code)]
mod afl {
    use std::io::Read as _;

    unsafe extern "C" {
        fn __afl_persistent_loop(max_cnt: u32) -> i32;
        fn __afl_manual_init();
        static __afl_fuzz_ptr: *const u8;
        static __afl_fuzz_len: *const u32;
    }

    /// Tells the runtime (a weak symbol there) that this program takes
    /// its inputs in shared memory.
    #[unsafe(no_mangle)]
    pub static mut __afl_sharedmem_fuzzing: i32 = 1;

    /// afl-fuzz looks for these in the binary: persistent mode, and a fork
    /// server that waits for `__afl_manual_init`.
    static PERSISTENT: [u8; 23] = *b"##SIG_AFL_PERSISTENT##\0";
    static DEFERRED: [u8; 26] = *b"##SIG_AFL_DEFER_FORKSRV##\0";

    /// Inputs per child before it is replaced by a fresh one.
    const RUNS_PER_CHILD: u32 = 10_000;

    pub fn run(prepare: fn(), target: fn(&[u8])) {
        // Read, so the linker keeps them.
        // SAFETY: plain reads of statics initialised at compile time.
        unsafe {
            std::ptr::read_volatile(&PERSISTENT);
            std::ptr::read_volatile(&DEFERRED);
        }
        prepare();
        // SAFETY: called once, before any input, as the runtime expects.
        unsafe { __afl_manual_init() };
        let mut stdin = Vec::new();
        // SAFETY: the loop and the test case buffer are the runtime's
        // documented interface: between two calls of the loop function the
        // buffer holds one input of the length given, and nothing else
        // writes it.
        while unsafe { __afl_persistent_loop(RUNS_PER_CHILD) } != 0 {
            let ptr = unsafe { std::ptr::addr_of!(__afl_fuzz_ptr).read_volatile() };
            if ptr.is_null() {
                // Not under afl-fuzz's shared memory: the input is on stdin.
                stdin.clear();
                let _ = std::io::stdin().read_to_end(&mut stdin);
                target(&stdin);
            } else {
                let len = unsafe { *std::ptr::addr_of!(__afl_fuzz_len).read_volatile() };
                let data = unsafe { std::slice::from_raw_parts(ptr, len as usize) };
                target(data);
            }
        }
    }
}
