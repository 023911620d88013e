//! The search of `fit`, apart from any running: which value of the knob to try next on which target,
//! from every outcome known so far.
//!
//! It assumes that more of the knob never needs less memory (monotonic): then a value that fits
//! fits every smaller one, a value that runs out of memory fails every larger one, and across
//! targets a value that fits a smaller target fits a larger one and a value that fails a larger
//! target fails a smaller one. Each target searches exponentially from LO (LO, 2·LO, 4·LO, ... up to
//! HI) until a value fails, then by bisection; with several trials in flight it splits the largest
//! interval still open, so concurrent trials each cut it further.

/// What one trial showed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Fits,
    OutOfMemory,
}

/// How much room a target gives a program, for comparing targets: an emulated card charges the
/// process's context inside its total, a plain ceiling does not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Room {
    pub total: u64,
    pub context_inside: bool,
}

impl Room {
    /// Whether every program that fits `self` fits `other` too. A card of N bytes gives at most as
    /// much as a ceiling of N, so a card is no bigger than a ceiling of its size or more; a
    /// ceiling is no bigger than a card only when we cannot tell (the context is unknown): never.
    pub fn no_bigger_than(&self, other: &Room) -> bool {
        self.total <= other.total && (self.context_inside || !other.context_inside)
    }
}

/// Every outcome known, and each target's search state.
pub struct Search {
    pub lo: u64,
    pub hi: u64,
    pub rooms: Vec<Room>,
    /// (target, value, verdict) of every finished trial that fitted or ran out of memory.
    known: Vec<(usize, u64, Verdict)>,
    /// Values in flight per target.
    in_flight: Vec<Vec<u64>>,
    /// Targets whose search was stopped (a trial failed for another reason).
    stopped: Vec<bool>,
}

impl Search {
    pub fn new(lo: u64, hi: u64, rooms: Vec<Room>) -> Search {
        let n = rooms.len();
        Search {
            lo,
            hi,
            rooms,
            known: Vec::new(),
            in_flight: vec![Vec::new(); n],
            stopped: vec![false; n],
        }
    }

    pub fn targets(&self) -> usize {
        self.rooms.len()
    }

    pub fn in_flight(&self, target: usize) -> usize {
        self.in_flight[target].len()
    }

    pub fn start(&mut self, target: usize, value: u64) {
        self.in_flight[target].push(value);
    }

    /// Records a finished trial; `None` for one that failed for another reason (which stops that
    /// target's search and teaches nothing).
    pub fn finish(&mut self, target: usize, value: u64, verdict: Option<Verdict>) {
        self.in_flight[target].retain(|v| *v != value);
        match verdict {
            Some(v) => self.known.push((target, value, v)),
            None => self.stopped[target] = true,
        }
    }

    /// The largest value known to fit `target`, from its own trials and smaller targets'.
    pub fn largest_fitting(&self, target: usize) -> Option<u64> {
        let room = &self.rooms[target];
        self.known
            .iter()
            .filter(|(t, _, v)| *v == Verdict::Fits && self.rooms[*t].no_bigger_than(room))
            .map(|(_, value, _)| *value)
            .max()
    }

    /// The smallest value known to run out of memory on `target`, from its own trials and larger
    /// targets'.
    pub fn smallest_failing(&self, target: usize) -> Option<u64> {
        let room = &self.rooms[target];
        self.known
            .iter()
            .filter(|(t, _, v)| *v == Verdict::OutOfMemory && room.no_bigger_than(&self.rooms[*t]))
            .map(|(_, value, _)| *value)
            .min()
    }

    /// Why the outcomes contradict the monotonic assumption on `target`, if they do.
    pub fn contradiction(&self, target: usize) -> Option<String> {
        match (self.largest_fitting(target), self.smallest_failing(target)) {
            (Some(fit), Some(fail)) if fail <= fit => Some(format!(
                "{fit} fits but {fail} runs out of memory: the program's memory does not grow \
                 with the value, so the search cannot hold"
            )),
            _ => None,
        }
    }

    /// Whether `target`'s answer is known (or its search stopped).
    pub fn settled(&self, target: usize) -> bool {
        if self.stopped[target] || self.contradiction(target).is_some() {
            return true;
        }
        let fit = self.largest_fitting(target);
        let fail = self.smallest_failing(target);
        fit == Some(self.hi)
            || fail == Some(self.lo)
            || matches!((fit, fail), (Some(a), Some(b)) if b == a + 1)
    }

    /// The value to try next on `target`, given what is known and in flight; `None` when it is
    /// settled or every open value is already being tried.
    pub fn next(&self, target: usize) -> Option<u64> {
        if self.settled(target) {
            return None;
        }
        let fit = self.largest_fitting(target);
        let pending = &self.in_flight[target];
        let untried = |v: u64| !pending.contains(&v);
        match self.smallest_failing(target) {
            None => {
                // Exponential: the next step past the largest value fitting or in flight.
                let from = pending.iter().copied().chain(fit).max();
                let v = match from {
                    None => self.lo,
                    Some(v) if v >= self.hi => return None,
                    Some(v) => v.saturating_mul(2).max(v + 1).min(self.hi),
                };
                untried(v).then_some(v)
            }
            Some(fail) => {
                // Bisection of the widest interval between values known or in flight.
                let floor = fit.map_or(i128::from(self.lo) - 1, i128::from);
                let mut points: Vec<i128> = pending
                    .iter()
                    .map(|v| i128::from(*v))
                    .filter(|v| *v > floor && *v < i128::from(fail))
                    .collect();
                points.push(floor);
                points.push(i128::from(fail));
                points.sort_unstable();
                let (a, b) = points
                    .windows(2)
                    .map(|w| (w[0], w[1]))
                    .max_by_key(|(a, b)| (b - a, -a))?;
                if b - a < 2 {
                    return None;
                }
                Some((a + (b - a) / 2) as u64)
            }
        }
    }

    /// A guess of the trials still to come for every target, for the time left.
    pub fn trials_left(&self) -> u64 {
        (0..self.targets())
            .filter(|t| !self.settled(*t))
            .map(|t| {
                let low = self.largest_fitting(t).unwrap_or(self.lo);
                let high = self.smallest_failing(t).unwrap_or(self.hi);
                let width = high.saturating_sub(low).max(1);
                u64::from(64 - width.leading_zeros())
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CARD: bool = true;
    const CEILING: bool = false;

    fn room(total: u64, context_inside: bool) -> Room {
        Room {
            total,
            context_inside,
        }
    }

    /// Runs the search one trial at a time against a program that fits up to `capacity[t]`;
    /// returns each target's answer and the trials each took.
    fn solve(lo: u64, hi: u64, rooms: Vec<Room>, capacity: &[u64]) -> Vec<(Option<u64>, usize)> {
        let mut s = Search::new(lo, hi, rooms);
        let mut trials = vec![0; s.targets()];
        while let Some((t, v)) = (0..s.targets()).find_map(|t| s.next(t).map(|v| (t, v))) {
            s.start(t, v);
            trials[t] += 1;
            let verdict = if v <= capacity[t] {
                Verdict::Fits
            } else {
                Verdict::OutOfMemory
            };
            s.finish(t, v, Some(verdict));
        }
        (0..s.targets())
            .map(|t| {
                assert!(s.settled(t));
                (s.largest_fitting(t), trials[t])
            })
            .collect()
    }

    #[test]
    fn finds_the_exact_largest_value_anywhere_in_the_range() {
        for cap in 0..=70 {
            let got = solve(1, 64, vec![room(1, CARD)], &[cap]);
            let want = if cap == 0 { None } else { Some(cap.min(64)) };
            assert_eq!(got[0].0, want, "capacity {cap}");
            assert!(got[0].1 <= 13, "capacity {cap}: {} trials", got[0].1);
        }
    }

    #[test]
    fn what_one_target_learns_spares_trials_on_another() {
        let alone = solve(1, 1000, vec![room(20, CARD)], &[300]);
        let after_small = solve(1, 1000, vec![room(10, CARD), room(20, CARD)], &[100, 300]);
        assert_eq!(after_small[1].0, Some(300));
        assert!(after_small[1].1 < alone[0].1, "{after_small:?} {alone:?}");
        let after_big = solve(1, 1000, vec![room(20, CARD), room(10, CARD)], &[300, 100]);
        let small_alone = solve(1, 1000, vec![room(10, CARD)], &[100]);
        assert_eq!(after_big[1].0, Some(100));
        assert!(after_big[1].1 < small_alone[0].1);
    }

    #[test]
    fn a_card_is_no_bigger_than_a_ceiling_of_its_size_but_not_the_other_way() {
        assert!(room(8, CARD).no_bigger_than(&room(8, CEILING)));
        assert!(!room(8, CEILING).no_bigger_than(&room(8, CARD)));
        assert!(!room(8, CEILING).no_bigger_than(&room(100, CARD)));
        assert!(room(8, CEILING).no_bigger_than(&room(9, CEILING)));
    }

    #[test]
    fn trials_in_flight_split_the_open_interval() {
        let mut s = Search::new(1, 64, vec![room(1, CARD)]);
        s.start(0, 1);
        s.finish(0, 1, Some(Verdict::Fits));
        s.start(0, 2);
        s.finish(0, 2, Some(Verdict::OutOfMemory));
        assert!(s.settled(0));
        let mut s = Search::new(0, 100, vec![room(1, CARD)]);
        s.finish(0, 0, Some(Verdict::Fits));
        s.finish(0, 100, Some(Verdict::OutOfMemory));
        let mut seen = Vec::new();
        while let Some(v) = s.next(0) {
            assert!(!seen.contains(&v));
            seen.push(v);
            s.start(0, v);
        }
        assert_eq!(seen.len(), 99, "every open value ends up in flight");
    }
}
