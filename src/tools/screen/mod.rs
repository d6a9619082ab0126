//! Screen and input tools: screenshots and screen waits, the live view, keys, clicks and pointer
//! gestures.

pub mod drive;
pub mod keyboard;
pub mod params;
pub mod pointer;
pub mod screenshot;
pub mod view;
pub mod wait;
