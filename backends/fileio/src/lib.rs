//! ferrite-fileio: a backend on a regular file through the page cache, driven by
//! io_uring. Write-back by default (flush = fdatasync, FUA = RWF_DSYNC),
//! write-through when configured.
#![forbid(unsafe_code)]
