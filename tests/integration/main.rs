//! The integration test harness: every test runs a real program through the real dynamic linker,
//! under `LD_PRELOAD`, against the simulated CUDA stack of `tests/sim`, and asserts exact numbers.

mod attribution;
mod ceiling;
mod cli;
mod containers;
mod doc_lists;
mod doors;
mod emulation;
mod entries;
mod exporter;
mod fit;
mod group_attacks;
mod group_members;
mod groups;
mod hardening;
mod headers;
mod hostile_inputs;
mod house;
mod kernel;
mod modules;
mod outputs;
mod pipes;
mod processes;
mod readers;
mod recorder;
mod recorder_harm;
mod replay;
mod ring;
mod setup;
mod standins;
mod timeline;
mod versions;
mod view;
