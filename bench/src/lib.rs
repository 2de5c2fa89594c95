//! What the bench binaries share: the load driver and the process readings (CPU time and peak
//! RSS from `/proc`), so `queen-bench` and `queen-sink-bench` measure the same way.

pub mod load;
