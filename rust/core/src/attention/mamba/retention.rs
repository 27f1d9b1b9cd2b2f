//! vLLM's sparse retention of Mamba states (`MambaManager.
//! reachable_block_mask`): a hit needs exactly the one state block ending
//! on its boundary, so a retention interval keeps each segment's last block
//! and the blocks ending at the request's replay boundaries and junction.

use super::Mamba;
use crate::attention::ReachableBlocks;
use crate::profile::Retention;

impl Mamba {
    /// Which state blocks caching keeps (None: all): dense without a
    /// retention interval, or when a segment is at most one block.
    pub fn reachable_blocks(
        &self,
        block_size: u32,
        (scheduler_block_size, alignment): (u32, u32),
        use_eagle: bool,
        any_eagle: bool,
        retention: Option<(usize, Retention)>,
    ) -> Option<ReachableBlocks> {
        let (interval, rule) = retention?;
        let per_segment = interval / block_size as usize;
        if interval > 0 && per_segment <= 1 {
            return None;
        }
        // No EAGLE shift (draft models have no Mamba layers); an EAGLE
        // group keeps the block below the junction too.
        Some(ReachableBlocks::new(
            0,
            1,
            per_segment,
            Some((rule, scheduler_block_size as usize, any_eagle)),
            alignment as usize,
            block_size as usize,
            use_eagle,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::{ReplayTails, RetentionMarks};
    use crate::spec::MambaMode;

    /// vLLM's mask, restated: segment tails, then the blocks ending
    /// at each aligned boundary.
    fn vllm_mask(
        start: usize,
        end: usize,
        bs: usize,
        align: usize,
        interval: usize,
        bounds: &[i64],
    ) -> Option<Vec<bool>> {
        let mut mask = vec![false; end - start];
        if interval > 0 {
            let per = interval / bs;
            if per <= 1 {
                return None;
            }
            let first = (start + per) / per * per - 1;
            let mut i = first - start;
            while i < mask.len() {
                mask[i] = true;
                i += per;
            }
        }
        for &b in bounds {
            let aligned = b.div_euclid(align as i64) * align as i64;
            let block = aligned.div_euclid(bs as i64) - 1;
            if block >= start as i64 && block < end as i64 {
                mask[block as usize - start] = true;
            }
        }
        Some(mask)
    }

    #[test]
    fn matches_vllm_mask() {
        let m = Mamba::new(MambaMode::Align, 1);
        for bs in [4usize, 8] {
            for interval in [0, 4, 8, 16, 24] {
                for eagle in [false, true] {
                    for prompt in 1..40usize {
                        for junction in [0usize, 8, 12, 16] {
                            let r = m.reachable_blocks(
                                bs as u32,
                                (bs as u32, bs as u32),
                                eagle,
                                eagle,
                                Some((interval, Retention::ReplayBoundaries)),
                            );
                            let tails = r.map_or(ReplayTails::default(), |r| {
                                r.replay_tails(RetentionMarks {
                                    num_prompt_tokens: Some(prompt),
                                    shared_prefix_boundary: junction,
                                    num_computed_tokens: 0,
                                })
                            });
                            let mut bounds: Vec<i64> = if eagle {
                                let resend = (prompt - 1) / bs * bs;
                                let ext = prompt / bs * bs;
                                vec![
                                    resend.saturating_sub(bs) as i64,
                                    ext.saturating_sub(bs) as i64,
                                ]
                            } else {
                                vec![prompt as i64 - 1]
                            };
                            if junction > 0 {
                                bounds.push(junction as i64);
                                if eagle {
                                    bounds.push(junction as i64 - bs as i64);
                                }
                            }
                            for start in 0..6 {
                                let want = vllm_mask(start, 12, bs, bs, interval, &bounds);
                                let got = r.map(|r| {
                                    (start..12).map(|i| r.keeps(i, &tails)).collect::<Vec<_>>()
                                });
                                assert_eq!(got, want, "bs={bs} interval={interval} eagle={eagle} prompt={prompt} junction={junction} start={start}");
                            }
                        }
                    }
                }
            }
        }
    }
}
