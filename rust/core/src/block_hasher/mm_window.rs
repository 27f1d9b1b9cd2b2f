//! Which multimodal input a block's scan starts from. vLLM walks a
//! request's inputs (sorted by offset, not overlapping) with an index it
//! carries from block to block; where a hasher resumes at a later block,
//! and where lookahead windows overlap the next block, the index is set by
//! the rules below. `ends[i]` is input i's `offset + length`.

use crate::profile::MmStart;

/// The index the first new block's scan starts from, for a hasher resuming
/// at token `start` (0 on the first block). `LastInput` is vLLM's
/// `-1` (the scan resolves it to the last input); `Window` is vLLM's
/// `get_mm_features_in_window(...)[0]`: the first input ending after
/// `start`, where the last one does.
pub fn resume_index(mode: MmStart, ends: &[usize], start: usize) -> i64 {
    if start == 0 {
        return 0;
    }
    match mode {
        MmStart::LastInput => -1,
        MmStart::Window => match ends.last() {
            Some(&last) if last > start => ends.partition_point(|&e| e <= start) as i64,
            _ => 0,
        },
    }
}

/// After a lookahead window's scan returned `idx`, back to the first input
/// that still overlaps tokens after `block_end`: the next block's window
/// starts there (vLLM's `generate_lookahead_block_hash_extra_keys`).
pub fn lookahead_rewind(ends: &[usize], block_end: usize, mut idx: i64) -> i64 {
    while idx > 0 {
        match ends.get(idx as usize - 1) {
            Some(&e) if e > block_end => idx -= 1,
            _ => break,
        }
    }
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resume_at_the_first_input_ending_after_start() {
        let ends = [4, 10, 20];
        assert_eq!(resume_index(MmStart::Window, &ends, 0), 0);
        assert_eq!(resume_index(MmStart::Window, &ends, 4), 1);
        assert_eq!(resume_index(MmStart::Window, &ends, 9), 1);
        assert_eq!(resume_index(MmStart::Window, &ends, 10), 2);
        assert_eq!(resume_index(MmStart::Window, &ends, 20), 0); // all passed
        assert_eq!(resume_index(MmStart::Window, &[], 8), 0);
        assert_eq!(resume_index(MmStart::LastInput, &ends, 8), -1);
        assert_eq!(resume_index(MmStart::LastInput, &ends, 0), 0);
    }

    #[test]
    fn rewind_keeps_inputs_reaching_past_the_block() {
        let ends = [4, 10, 20];
        assert_eq!(lookahead_rewind(&ends, 8, 3), 1);
        assert_eq!(lookahead_rewind(&ends, 10, 3), 2);
        assert_eq!(lookahead_rewind(&ends, 3, 3), 0);
        assert_eq!(lookahead_rewind(&ends, 30, 3), 3);
        assert_eq!(lookahead_rewind(&ends, 0, -1), -1);
    }
}
