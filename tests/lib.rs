//! Helpers shared by the end-to-end tests live in `all/`; this library is empty.
