//! The lanes of Perfetto's scope slices, decided as scopes open and close: a lane is a track on
//! which slices must nest (Perfetto's end event closes the innermost slice of its track), so two
//! scopes that overlap without one holding the other go on two lanes.
//!
//! A scope takes the first lane where every scope still open at its start holds it whole (it ends
//! no later than the innermost of them), or that is empty; else a new lane. That needs its end,
//! and the ends of the scopes open on the lanes before it: a scope whose lane cannot be told yet
//! (it and the innermost scope of a lane both still open) waits, and the scopes that opened after
//! it wait behind it, so that each lane is decided, and written, in time order. What waits is
//! bounded: past [`MAX_WAITING`] scopes the first one takes a lane where nothing is open (a
//! new one if every lane holds an open scope), which is always right, at the cost of a lane that
//! the exact rule would have spared. Memory then holds the open scopes, the lanes' stacks (each as
//! deep as scopes nest) and at most [`MAX_WAITING`] waiting scopes, never the run's scopes.

use std::collections::{HashMap, VecDeque};

/// Scopes that may wait for their lane before the first one is given a free lane.
pub(crate) const MAX_WAITING: usize = 4096;

/// What the lanes hand on, in each lane's time order.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum LaneAction {
    /// The `number`th scope opened, named `name`, begins at `ts` on lane `lane`.
    Begin {
        lane: usize,
        number: u64,
        ts: u64,
        name: String,
    },
    /// The innermost scope on `lane` ends at `ts`.
    End { lane: usize, ts: u64 },
}

/// A scope seen opening: its name until its begin is handed on, its start and its end once seen.
struct Scope {
    name: String,
    start: u64,
    end: Option<u64>,
}

/// Scopes put on lanes as their events come, in time order.
#[derive(Default)]
pub(crate) struct Lanes {
    /// Scopes open or not yet ended on a lane, by their own number.
    scopes: HashMap<u64, Scope>,
    /// The open scope of each key (the recording's slot).
    open: HashMap<u64, u64>,
    /// Scopes whose lane is not told yet, in the order they opened.
    waiting: VecDeque<u64>,
    /// Per lane, its scopes from the outermost: each holds the ones after it.
    stacks: Vec<Vec<u64>>,
    next_number: u64,
    /// The time of the latest event (ns): a scope not seen ending ends at it or later.
    now: u64,
    /// What is to be handed on.
    pub(crate) actions: Vec<LaneAction>,
}

/// Where a scope goes, once it can be told.
enum Fit {
    Lane(usize),
    Wait,
}

impl Lanes {
    /// Time has come to `ts` (an event of that time is next): the scopes that opened before it
    /// may be decided.
    pub(crate) fn advance(&mut self, ts: u64) {
        if ts > self.now {
            self.now = ts;
            self.decide(false);
        }
    }

    /// Scope `key` opens at `ts` (a key still open is ended there first: a slot given again).
    pub(crate) fn open(&mut self, key: u64, name: &str, ts: u64) {
        self.close(key, ts);
        let number = self.next_number;
        self.next_number += 1;
        let scope = Scope {
            name: name.to_string(),
            start: ts,
            end: None,
        };
        self.scopes.insert(number, scope);
        self.open.insert(key, number);
        self.waiting.push_back(number);
        if self.waiting.len() > MAX_WAITING {
            self.decide(true);
        }
    }

    /// Scope `key` closes at `ts`; a key not open is ignored.
    pub(crate) fn close(&mut self, key: u64, ts: u64) {
        if let Some(number) = self.open.remove(&key) {
            if let Some(scope) = self.scopes.get_mut(&number) {
                scope.end = Some(ts.max(scope.start));
            }
        }
    }

    /// The end of the timeline, `last`: the scopes still open end there; every scope gets its
    /// lane and every lane is closed.
    pub(crate) fn finish(&mut self, last: u64) {
        for (_, number) in self.open.drain() {
            if let Some(scope) = self.scopes.get_mut(&number) {
                scope.end = Some(last.max(scope.start));
            }
        }
        self.decide(false);
        for lane in 0..self.stacks.len() {
            while let Some(number) = self.stacks[lane].pop() {
                self.end(lane, number);
            }
        }
    }

    /// Gives the waiting scopes their lanes, in the order they opened, up to the first that
    /// cannot be told yet; with `force`, the first is given a lane whatever its end.
    fn decide(&mut self, force: bool) {
        while let Some(&number) = self.waiting.front() {
            let Some(start) = self.scopes.get(&number).map(|s| s.start) else {
                self.waiting.pop_front();
                continue;
            };
            // A scope opened at the latest event's time may yet see a scope end at its start.
            let fit = match start < self.now || self.open.is_empty() {
                true => self.fit(number, start),
                false => Fit::Wait,
            };
            let lane = match (fit, force && self.waiting.len() > MAX_WAITING) {
                (Fit::Lane(lane), _) => lane,
                (Fit::Wait, true) => self.free_lane(start),
                (Fit::Wait, false) => return,
            };
            self.waiting.pop_front();
            self.begin(lane, number);
        }
    }

    /// The lane of scope `number` (opened at `start`), or that it must wait.
    fn fit(&mut self, number: u64, start: u64) -> Fit {
        let end = self.scopes.get(&number).and_then(|s| s.end);
        for lane in 0..self.stacks.len() {
            self.pop_ended(lane, start);
            let Some(&top) = self.stacks[lane].last() else {
                return Fit::Lane(lane);
            };
            let top_end = self.scopes.get(&top).and_then(|s| s.end);
            match (end, top_end) {
                (Some(end), Some(top_end)) if end <= top_end => return Fit::Lane(lane),
                (Some(_), Some(_)) => {}
                // It ended, the lane's innermost has not: it ends inside.
                (Some(_), None) => return Fit::Lane(lane),
                // The lane's innermost ended, it has not: it ends after.
                (None, Some(_)) => {}
                (None, None) => return Fit::Wait,
            }
        }
        Fit::Lane(self.stacks.len())
    }

    /// The first lane where nothing is open at `start`, or a new one.
    fn free_lane(&mut self, start: u64) -> usize {
        for lane in 0..self.stacks.len() {
            self.pop_ended(lane, start);
            if self.stacks[lane].is_empty() {
                return lane;
            }
        }
        self.stacks.len()
    }

    /// Ends the scopes of `lane` that ended by `start`, innermost first.
    fn pop_ended(&mut self, lane: usize, start: u64) {
        while let Some(&top) = self.stacks[lane].last() {
            match self.scopes.get(&top).and_then(|s| s.end) {
                Some(end) if end <= start => {
                    self.stacks[lane].pop();
                    self.end(lane, top);
                }
                _ => return,
            }
        }
    }

    fn begin(&mut self, lane: usize, number: u64) {
        if lane == self.stacks.len() {
            self.stacks.push(Vec::new());
        }
        let Some(scope) = self.scopes.get_mut(&number) else {
            return;
        };
        self.actions.push(LaneAction::Begin {
            lane,
            number,
            ts: scope.start,
            name: std::mem::take(&mut scope.name),
        });
        self.stacks[lane].push(number);
    }

    fn end(&mut self, lane: usize, number: u64) {
        if let Some(scope) = self.scopes.remove(&number) {
            let ts = scope.end.unwrap_or(scope.start);
            self.actions.push(LaneAction::End { lane, ts });
        }
    }
}

/// The opens and closes of `scopes` (each `(open, close)` in ns, `None` for one never closed)
/// in the order [`Lanes`] is to be given them: by time, at one time closes first, then opens,
/// the longer first (the outer scope takes its lane first). Each is `(ts, opens, index)`.
pub(crate) fn in_time_order(scopes: &[(u64, Option<u64>)]) -> Vec<(u64, bool, usize)> {
    let mut events: Vec<(u64, bool, usize)> = Vec::new();
    for (i, &(open, close)) in scopes.iter().enumerate() {
        events.push((open, true, i));
        if let Some(close) = close {
            events.push((close.max(open), false, i));
        }
    }
    let length = |i: usize| {
        let (open, close) = scopes[i];
        close.map_or(u64::MAX, |c| c.saturating_sub(open))
    };
    events.sort_by_key(|&(ts, opens, i)| (ts, opens, opens.then(|| u64::MAX - length(i))));
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lane of each scope (by index in `scopes`, each `(open, close)` in ns).
    fn scope_lanes(scopes: &[(u64, u64)]) -> Vec<usize> {
        let spans: Vec<(u64, Option<u64>)> = scopes.iter().map(|&(o, c)| (o, Some(c))).collect();
        let events = in_time_order(&spans);
        let mut lanes = Lanes::default();
        for &(ts, opens, i) in &events {
            lanes.advance(ts);
            match opens {
                true => lanes.open(i as u64, "", ts),
                false => lanes.close(i as u64, ts),
            }
        }
        lanes.finish(events.last().map_or(0, |e| e.0));
        // Scope numbers are given in the order they open, which is `events`' order of opens.
        let opened: Vec<usize> = events.iter().filter(|e| e.1).map(|e| e.2).collect();
        let mut lane_of = vec![0; scopes.len()];
        for action in &lanes.actions {
            if let LaneAction::Begin { lane, number, .. } = action {
                lane_of[opened[*number as usize]] = *lane;
            }
        }
        lane_of
    }

    #[test]
    fn lanes_nest_or_separate() {
        // Equal starts: the longer is the outer; one starting as another ends shares its lane.
        let lanes = scope_lanes(&[(0, 1), (0, 5), (1, 2), (3, 9)]);
        assert_eq!(lanes, [0, 0, 0, 1]);
    }

    #[test]
    fn a_scope_overlapping_the_one_it_opened_in_takes_a_lane_of_its_own() {
        // b opens inside a and outlives it; c, inside both, takes the first lane that holds it
        // (a's); d opens after a ended, on lane 0 again.
        let lanes = scope_lanes(&[(0, 10), (5, 20), (6, 7), (12, 13)]);
        assert_eq!(lanes, [0, 1, 0, 0]);
    }

    #[test]
    fn each_lane_is_handed_on_in_time_order_and_nests() {
        let mut lanes = Lanes::default();
        for (ts, key, opens) in [(1, 0, true), (2, 1, true), (3, 1, false), (4, 2, true)] {
            lanes.advance(ts);
            match opens {
                true => lanes.open(key, "s", ts),
                false => lanes.close(key, ts),
            }
        }
        lanes.advance(5);
        lanes.close(0, 5);
        lanes.advance(6);
        lanes.close(2, 6);
        lanes.finish(6);
        let mut depth = [0i32; 4];
        let mut last = [0u64; 4];
        for action in &lanes.actions {
            let (lane, ts, step) = match action {
                LaneAction::Begin { lane, ts, .. } => (*lane, *ts, 1),
                LaneAction::End { lane, ts } => (*lane, *ts, -1),
            };
            assert!(ts >= last[lane], "{:?}", lanes.actions);
            last[lane] = ts;
            depth[lane] += step;
            assert!(depth[lane] >= 0, "{:?}", lanes.actions);
        }
        assert!(depth.iter().all(|&d| d == 0), "{:?}", lanes.actions);
    }

    #[test]
    fn waiting_scopes_are_bounded_by_a_free_lane() {
        // An outer scope open throughout, and one inside it open throughout: every scope after
        // them waits to know whether the second ends inside the first, until too many wait.
        let mut lanes = Lanes::default();
        lanes.open(0, "outer", 0);
        lanes.advance(1);
        lanes.open(1, "long", 1);
        let mut ts = 2;
        for _ in 0..3 * MAX_WAITING {
            lanes.advance(ts);
            lanes.open(2, "step", ts);
            lanes.advance(ts + 1);
            lanes.close(2, ts + 1);
            ts += 2;
        }
        assert!(
            lanes.waiting.len() <= MAX_WAITING + 1,
            "{}",
            lanes.waiting.len()
        );
        assert!(
            lanes.scopes.len() <= MAX_WAITING + 4,
            "{}",
            lanes.scopes.len()
        );
        lanes.advance(ts);
        lanes.close(1, ts);
        lanes.close(0, ts);
        lanes.finish(ts);
        let begins = lanes
            .actions
            .iter()
            .filter(|a| matches!(a, LaneAction::Begin { .. }))
            .count();
        assert_eq!(begins, 2 + 3 * MAX_WAITING);
    }
}
