//! Choosing units to cover the most identifier weight per character: greedy set cover,
//! with a bucket queue so that it stays linear in the number of units.
//!
//! Each candidate sits in the bucket of its density: the weight of the identifiers it
//! would newly cover, per character it costs. The densest is taken when it fits. A
//! candidate's density only falls as others cover its identifiers, so it is recomputed
//! when it reaches the top, and moved down when it fell: every move lowers its bucket,
//! and buckets are few, so each candidate moves a bounded number of times.

use super::units::Unit;

/// Buckets of density. A density is `gain * SCALE / (chars + BIAS)`, capped.
const BUCKETS: usize = 1024;
const SCALE: u64 = 256;
/// What a bullet costs beyond its text: "- " and the line break.
pub(super) const OVERHEAD: usize = 3;

/// In a density, what a unit is charged beyond its text: a bias towards statements
/// that say something beyond their identifiers (at 24, "It's 15:20 now." outranked the
/// sentence that said what happened at 15:20).
const BIAS: usize = 48;

/// What `unit` adds: the squared weights of its identifiers not yet covered. Squared,
/// so that one identifier the agent wrote outweighs a row of counters from a table.
pub(super) fn gain(unit: &Unit, weights: &[u32], covered: &[bool]) -> u64 {
    unit.ids
        .iter()
        .filter(|&&id| !covered[id as usize])
        .map(|&id| u64::from(weights[id as usize]).pow(2))
        .sum()
}

fn density(unit: &Unit, weights: &[u32], covered: &[bool]) -> usize {
    let gain = gain(unit, weights, covered);
    let cost = (unit.chars() + BIAS) as u64;
    usize::try_from(gain * SCALE / cost)
        .unwrap_or(BUCKETS - 1)
        .min(BUCKETS - 1)
}

/// Takes candidates (indices into `units`) densest first while they fit in `room`
/// characters (each costs its chars plus `per_item`), marking what they cover. Returns
/// them in the order taken.
pub(super) fn choose(
    units: &[Unit],
    candidates: impl IntoIterator<Item = usize>,
    weights: &[u32],
    covered: &mut [bool],
    mut room: usize,
    per_item: usize,
) -> Vec<usize> {
    let mut buckets: Vec<Vec<usize>> = vec![Vec::new(); BUCKETS];
    for candidate in candidates {
        let d = density(&units[candidate], weights, covered);
        if d > 0 {
            buckets[d].push(candidate);
        }
    }
    let mut chosen = Vec::new();
    let mut top = BUCKETS - 1;
    // Within a bucket the latest unit is taken first: when two say as much, the newer
    // one is likelier to be where the investigation stands.
    while top > 0 {
        let Some(candidate) = buckets[top].pop() else {
            top -= 1;
            continue;
        };
        let unit = &units[candidate];
        let d = density(unit, weights, covered);
        if d < top {
            if d > 0 {
                buckets[d].push(candidate);
            }
            continue;
        }
        let cost = unit.chars() + per_item;
        if cost > room {
            continue;
        }
        room -= cost;
        for &id in &unit.ids {
            covered[id as usize] = true;
        }
        chosen.push(candidate);
    }
    chosen
}
