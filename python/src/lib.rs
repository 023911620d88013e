//! Python bindings of the reader (being written).
