//! ferrite-mgmt: the management plane: the JSON configuration, the object tree
//! and the control socket served by ferrited; binary `ferritectl`.
#![forbid(unsafe_code)]
