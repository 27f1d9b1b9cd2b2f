//! Errors of the core. Every fallible call checks its arguments before it
//! mutates anything, so an `Err` always leaves the manager as it was.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CoreError {
    /// An argument is out of range or inconsistent (maps to ValueError).
    InvalidArgument(String),
    /// The request id is not known to the manager (maps to KeyError).
    UnknownRequest(String),
    /// A configuration the core does not implement (maps to NotImplementedError).
    Unsupported(String),
    /// An internal invariant does not hold (maps to RuntimeError).
    Invariant(String),
}

impl fmt::Display for CoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CoreError::InvalidArgument(m)
            | CoreError::UnknownRequest(m)
            | CoreError::Unsupported(m)
            | CoreError::Invariant(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for CoreError {}

impl CoreError {
    /// The same error, its message prefixed with `context: `.
    pub fn prefixed(self, context: &str) -> CoreError {
        let p = |m: String| format!("{context}: {m}");
        match self {
            CoreError::InvalidArgument(m) => CoreError::InvalidArgument(p(m)),
            CoreError::UnknownRequest(m) => CoreError::UnknownRequest(p(m)),
            CoreError::Unsupported(m) => CoreError::Unsupported(p(m)),
            CoreError::Invariant(m) => CoreError::Invariant(p(m)),
        }
    }
}

pub type CoreResult<T> = Result<T, CoreError>;

pub(crate) fn invalid<T>(msg: impl Into<String>) -> CoreResult<T> {
    Err(CoreError::InvalidArgument(msg.into()))
}
