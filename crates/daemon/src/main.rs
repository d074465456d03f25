//! ferrited: the composition root. Reads the configuration, starts one reactor
//! per core, opens backends, starts fabrics and serves management.
#![forbid(unsafe_code)]

fn main() {}
