//! black-box tests
