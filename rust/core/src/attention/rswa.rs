//! Reference sliding window attention (vLLM's `RSWAManager`): full
//! attention for hits, caching and sizing, whose window frees, given the
//! prompt length, drop the decode blocks between the prompt's last block and
//! the last `window` processed tokens (the prompt stays visible to every
//! token). Without the prompt length nothing leaves the window.

use crate::cdiv;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rswa {
    window: usize,
}

impl Rswa {
    pub fn new(window: u32) -> Self {
        Rswa {
            window: window as usize,
        }
    }

    /// The blocks `[first, last)` a free at `n` processed tokens drops:
    /// those wholly after the prompt and before the window's start,
    /// `max(prompt, n - window)` (empty when that is inside the prompt).
    #[inline]
    pub fn gap_blocks(&self, n: usize, num_prompt_tokens: usize, bs: usize) -> (usize, usize) {
        let first = cdiv(num_prompt_tokens, bs);
        let window_start = num_prompt_tokens.max(n.saturating_sub(self.window));
        (first, window_start / bs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gap_is_between_prompt_and_window() {
        let r = Rswa::new(8);
        // Prompt of 10 tokens in blocks of 4: blocks 0..3 hold it.
        assert_eq!(r.gap_blocks(12, 10, 4), (3, 2)); // window reaches into the prompt
        assert_eq!(r.gap_blocks(24, 10, 4), (3, 4)); // block 3 (tokens 12..16) left
        assert_eq!(r.gap_blocks(27, 10, 4), (3, 4));
        assert_eq!(r.gap_blocks(28, 10, 4), (3, 5));
        // An aligned prompt: its tail block stays.
        assert_eq!(r.gap_blocks(40, 8, 4), (2, 8));
        assert_eq!(Rswa::new(0).gap_blocks(9, 8, 4), (2, 2));
    }
}
