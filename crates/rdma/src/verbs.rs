//! libibverbs + librdmacm provider.
