//! The search of `fit`, apart from any running: which value of the knob to try next on which target,
//! from every outcome known so far.
//!
//! It assumes that more of the knob never needs less memory (monotonic): then a value that fits
//! fits every smaller one, a value that runs out of memory fails every larger one, and across
//! targets a value that fits a smaller target fits a larger one and a value that fails a larger
//! target fails a smaller one.
//!
//! [`Strategy::Peaks`] (the default) uses what every fitting trial measured exactly: its peak. Each
//! is a point of the program's peak curve, shared by every target: a value whose peak (with the
//! context charged on a card) is within a target's total fits it, wherever it ran. From two points
//! on, each target's answer is predicted ([`Search::prediction`]: the secant of the points nearest
//! its total) and confirmed by real runs, the predicted value fitting and the next one running
//! out; the answer is always those two real outcomes. A prediction that misses moves the bracket
//! and is made again; after two misses the target falls back to bisection. Before two points, each
//! target searches exponentially from LO (LO, 2·LO, 4·LO, ... up to HI), values in flight on any
//! target counting as tried. [`Strategy::Bisection`] is the search without peaks: exponential, then
//! bisection; with several trials in flight it splits the largest interval still open.

use gpumemhook_reader::format_size;

/// How `fit` chooses the values it tries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Strategy {
    /// Predicted from the peaks measured so far, confirmed by real runs.
    Peaks,
    /// Exponential steps, then bisection, from fits and out-of-memories alone.
    Bisection,
}

/// What one trial showed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Fits {
        /// The program's peak, the context outside it.
        peak: u64,
        /// The context and modules charged inside an emulated card; `None` under a ceiling.
        overhead: Option<u64>,
    },
    OutOfMemory,
}

impl Verdict {
    fn fits(&self) -> bool {
        matches!(self, Verdict::Fits { .. })
    }
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

    /// Whether a run that peaked at `peak` (and was charged `overhead` on a card) fits this room:
    /// the hook's peak is exact. A ceiling's run tells nothing of a card's context.
    fn holds(&self, peak: u64, overhead: Option<u64>) -> bool {
        match (self.context_inside, overhead) {
            (false, _) => peak <= self.total,
            (true, Some(o)) => peak.saturating_add(o) <= self.total,
            (true, None) => false,
        }
    }
}

/// A trial in flight, and what it is expected to show when it confirms a prediction.
#[derive(Clone, Copy, Debug)]
pub struct Pending {
    value: u64,
    expect: Option<bool>,
}

/// Every outcome known, and each target's search state.
pub struct Search {
    pub lo: u64,
    pub hi: u64,
    pub rooms: Vec<Room>,
    strategy: Strategy,
    /// The knob's name, for the contradictions' messages.
    name: String,
    /// (target, value, verdict) of every finished trial that fitted or ran out of memory.
    known: Vec<(usize, u64, Verdict)>,
    in_flight: Vec<Vec<Pending>>,
    /// Targets whose search was stopped (a trial failed for another reason).
    stopped: Vec<bool>,
    /// Predictions each target's confirmations showed wrong.
    misses: Vec<u32>,
}

impl Search {
    pub fn new(lo: u64, hi: u64, rooms: Vec<Room>, strategy: Strategy, name: &str) -> Search {
        let n = rooms.len();
        Search {
            lo,
            hi,
            rooms,
            strategy,
            name: name.to_string(),
            known: Vec::new(),
            in_flight: vec![Vec::new(); n],
            stopped: vec![false; n],
            misses: vec![0; n],
        }
    }

    pub fn targets(&self) -> usize {
        self.rooms.len()
    }

    pub fn in_flight(&self, target: usize) -> usize {
        self.in_flight[target].len()
    }

    /// Records a trial started at the value [`Search::next`] gave.
    pub fn start(&mut self, target: usize, value: u64) {
        let expect = self.confirming(target, value);
        self.in_flight[target].push(Pending { value, expect });
    }

    /// Records a finished trial; `None` for one that failed for another reason (which stops that
    /// target's search and teaches nothing).
    pub fn finish(&mut self, target: usize, value: u64, verdict: Option<Verdict>) {
        let pending = self.withdraw(target, value);
        match verdict {
            Some(v) => {
                if pending
                    .and_then(|p| p.expect)
                    .is_some_and(|e| e != v.fits())
                {
                    self.misses[target] += 1;
                }
                self.known.push((target, value, v));
            }
            None => self.stopped[target] = true,
        }
    }

    /// Forgets a trial in flight that was ended before its outcome (it was moot).
    pub fn withdraw(&mut self, target: usize, value: u64) -> Option<Pending> {
        let flight = &mut self.in_flight[target];
        let at = flight.iter().position(|p| p.value == value)?;
        Some(flight.remove(at))
    }

    /// Whether the outcome of `value` on `target` applies to `to`.
    fn applies(&self, from: usize, verdict: &Verdict, to: usize) -> bool {
        let (a, b) = (&self.rooms[from], &self.rooms[to]);
        match verdict {
            Verdict::OutOfMemory => b.no_bigger_than(a),
            Verdict::Fits { peak, overhead } => {
                a.no_bigger_than(b)
                    || (self.strategy == Strategy::Peaks && b.holds(*peak, *overhead))
            }
        }
    }

    /// The largest value known to fit `target`: its own trials, smaller targets', and (searching by
    /// peaks) any run whose exact peak is within its room.
    pub fn largest_fitting(&self, target: usize) -> Option<u64> {
        self.known
            .iter()
            .filter(|(t, _, v)| v.fits() && self.applies(*t, v, target))
            .map(|(_, value, _)| *value)
            .max()
    }

    /// The smallest value known to run out of memory on `target`, from its own trials and larger
    /// targets'.
    pub fn smallest_failing(&self, target: usize) -> Option<u64> {
        self.known
            .iter()
            .filter(|(t, _, v)| !v.fits() && self.applies(*t, v, target))
            .map(|(_, value, _)| *value)
            .min()
    }

    /// The peak and overhead (0 under a ceiling) of a run of `value` that fitted, preferably on
    /// `target` itself: the program's, whichever target it ran on.
    pub fn peak(&self, target: usize, value: u64) -> Option<(u64, u64)> {
        let runs = self.known.iter().filter(|k| k.1 == value);
        let own = runs.clone().filter(|k| k.0 == target);
        own.chain(runs).find_map(|k| match k.2 {
            Verdict::Fits { peak, overhead } => Some((peak, overhead.unwrap_or(0))),
            Verdict::OutOfMemory => None,
        })
    }

    /// Every fitting run's (value, peak), by value (the largest peak of a value run twice).
    fn points(&self) -> Vec<(u64, u64)> {
        let mut points: Vec<(u64, u64)> = Vec::new();
        for (_, value, verdict) in &self.known {
            if let Verdict::Fits { peak, .. } = verdict {
                match points.iter_mut().find(|p| p.0 == *value) {
                    Some(p) => p.1 = p.1.max(*peak),
                    None => points.push((*value, *peak)),
                }
            }
        }
        points.sort_unstable();
        points
    }

    /// Why the outcomes contradict the monotonic assumption on `target`, naming the two values and
    /// their peaks, if they do: a value fits but a smaller one runs out of memory, or a value's peak
    /// is below a smaller value's.
    pub fn contradiction(&self, target: usize) -> Option<String> {
        let n = &self.name;
        let cannot = "the program's memory does not grow with the value, so the search cannot hold";
        if let (Some(fit), Some(fail)) =
            (self.largest_fitting(target), self.smallest_failing(target))
        {
            if fail <= fit {
                let peak = self.peak(target, fit).map_or(0, |p| p.0 + p.1);
                return Some(format!(
                    "{n}={fit} fits (peak {}) but {n}={fail} runs out of memory (needs more than \
                     {}): {cannot}",
                    format_size(peak),
                    format_size(self.rooms[target].total)
                ));
            }
        }
        let points = self.points();
        points.windows(2).find(|w| w[1].1 < w[0].1).map(|w| {
            format!(
                "{n}={} peaks at {} but {n}={} at {}: {cannot}",
                w[0].0,
                format_size(w[0].1),
                w[1].0,
                format_size(w[1].1)
            )
        })
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

    /// What `target` is known to lie in: the largest value fitting (LO-1 when none) and the
    /// smallest failing (HI+1 when none).
    pub fn bracket(&self, target: usize) -> (i128, i128) {
        let fit = self
            .largest_fitting(target)
            .map_or(i128::from(self.lo) - 1, i128::from);
        let fail = self
            .smallest_failing(target)
            .map_or(i128::from(self.hi) + 1, i128::from);
        (fit, fail)
    }

    /// The value to try next on `target`, given what is known and in flight; `None` when it is
    /// settled or every open value is already being tried.
    pub fn next(&self, target: usize) -> Option<u64> {
        if self.settled(target) {
            return None;
        }
        let untried = |v: u64| !self.in_flight[target].iter().any(|p| p.value == v);
        if let Some(v) = self.learning_context(target) {
            return untried(v).then_some(v);
        }
        if let Some(p) = self.prediction(target) {
            let (fit, fail) = self.bracket(target);
            return [p, p + 1]
                .into_iter()
                .filter(|v| i128::from(*v) > fit && i128::from(*v) < fail)
                .find(|v| untried(*v));
        }
        match self.smallest_failing(target) {
            None => self.exponential(target),
            Some(_) => self.bisection(target),
        }
    }

    /// The largest value seen to fit anywhere with a peak within half a card, to try first on a
    /// card while no card's context is known (a prediction needs it): it should fit, and teaches
    /// the context.
    fn learning_context(&self, target: usize) -> Option<u64> {
        let room = &self.rooms[target];
        if self.strategy != Strategy::Peaks || !room.context_inside || self.card_context().is_some()
        {
            return None;
        }
        let (fit, fail) = self.bracket(target);
        self.points()
            .into_iter()
            .filter(|(v, peak)| *peak <= room.total / 2 && i128::from(*v) > fit)
            .map(|(v, _)| v)
            .filter(|v| i128::from(*v) < fail)
            .max()
    }

    /// The largest context and modules charged inside a card in any run that fitted.
    fn card_context(&self) -> Option<u64> {
        self.known
            .iter()
            .filter_map(|k| match k.2 {
                Verdict::Fits { overhead, .. } => overhead,
                Verdict::OutOfMemory => None,
            })
            .max()
    }

    /// The next exponential step past the largest value fitting `target` or in flight (searching
    /// by peaks: in flight on any target, whose fit would be a point of the curve).
    fn exponential(&self, target: usize) -> Option<u64> {
        let flights: Vec<&Vec<Pending>> = match self.strategy {
            Strategy::Peaks => self.in_flight.iter().collect(),
            Strategy::Bisection => vec![&self.in_flight[target]],
        };
        let from = flights
            .iter()
            .flat_map(|f| f.iter().map(|p| p.value))
            .chain(self.largest_fitting(target))
            .max();
        let v = match from {
            None => self.lo,
            Some(v) if v >= self.hi => return None,
            Some(v) => v.saturating_mul(2).max(v + 1).min(self.hi),
        };
        (!self.in_flight[target].iter().any(|p| p.value == v)).then_some(v)
    }

    /// Bisection of the widest interval between values known or in flight on `target`.
    fn bisection(&self, target: usize) -> Option<u64> {
        let (floor, fail) = self.bracket(target);
        let mut points: Vec<i128> = self.in_flight[target]
            .iter()
            .map(|p| i128::from(p.value))
            .filter(|v| *v > floor && *v < fail)
            .collect();
        points.push(floor);
        points.push(fail);
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

    /// The largest value predicted to fit `target`, within its bracket (its confirmations are it
    /// and the value after it), when searching by peaks with two points or more and fewer than two
    /// misses.
    pub fn prediction(&self, target: usize) -> Option<u64> {
        if self.strategy != Strategy::Peaks || self.misses[target] >= 2 || self.settled(target) {
            return None;
        }
        let points = self.points();
        if points.len() < 2 {
            return None;
        }
        let room = &self.rooms[target];
        // The peak that fills the room: on a card, its total less the largest context seen (a
        // card's first trial learns it: without it, no prediction holds).
        let limit = match (room.context_inside, self.card_context()) {
            (true, Some(o)) => room.total.saturating_sub(o),
            (true, None) => return None,
            (false, _) => room.total,
        };
        let (fit, fail) = self.bracket(target);
        let guess = secant(&points, limit, self.smallest_failing(target))?;
        Some(
            guess
                .clamp(fit.max(i128::from(self.lo) - 1), fail - 1)
                .max(0) as u64,
        )
    }

    /// Whether the outcome of `value` on `target`, in flight, can no longer change any answer:
    /// outside the bracket of `target` and of every target not settled.
    pub fn moot(&self, target: usize, value: u64) -> bool {
        let v = i128::from(value);
        let open = |t: usize| {
            let (fit, fail) = self.bracket(t);
            !self.settled(t) && v > fit && v < fail
        };
        !open(target) && !(0..self.targets()).any(open)
    }

    /// Whether a trial of `value` on `target` would confirm its prediction, and what it should show
    /// (`true`: fits).
    fn confirming(&self, target: usize, value: u64) -> Option<bool> {
        let p = self.prediction(target)?;
        (value == p || value == p + 1).then_some(value == p)
    }

    /// A guess of the trials still to come for every target, for the time left.
    pub fn trials_left(&self) -> u64 {
        (0..self.targets())
            .filter(|t| !self.settled(*t))
            .map(|t| {
                if self.prediction(t).is_some() {
                    return 2;
                }
                let (fit, fail) = self.bracket(t);
                let width = (fail - fit).max(1) as u64;
                u64::from(64 - width.leading_zeros())
            })
            .sum()
    }
}

/// The largest value whose peak the curve through `points` (value, peak; by value) puts at or
/// under `limit`: the secant of the points nearest it, the last point under it and the first over
/// it, or else the two last under it; when that passes `fail` (a value known to need more than
/// `limit`), the secant of the last point under it and `fail`. `None` where the curve does not
/// rise there.
fn secant(points: &[(u64, u64)], limit: u64, fail: Option<u64>) -> Option<i128> {
    let as_f = |p: &(u64, u64)| (p.0 as f64, p.1 as f64);
    let under: Vec<(f64, f64)> = points.iter().filter(|p| p.1 <= limit).map(as_f).collect();
    let over: Vec<(f64, f64)> = points.iter().filter(|p| p.1 > limit).map(as_f).collect();
    let through = |a: (f64, f64), b: (f64, f64)| {
        let slope = (b.1 - a.1) / (b.0 - a.0);
        (slope > 0.0 && slope.is_finite()).then(|| {
            (a.0 + (limit as f64 - a.1) / slope)
                .floor()
                .clamp(-1.0, 1e18) as i128
        })
    };
    let last = under.last().copied();
    if let (Some(a), Some(b)) = (last, over.iter().find(|b| last.is_some_and(|a| b.0 > a.0))) {
        return through(a, *b);
    }
    let guess = match (under.len(), last) {
        (2.., Some(a)) => through(under[under.len() - 2], a),
        (_, None) => through(over[0], *over.get(1)?),
        _ => None,
    };
    match (last, fail) {
        (Some(a), Some(f)) if guess.is_none_or(|g| g >= i128::from(f)) => {
            through(a, (f as f64, limit as f64 + 1.0))
        }
        _ => guess,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CARD: bool = true;
    const CEILING: bool = false;
    const MIB: u64 = 1 << 20;

    fn room(total: u64, context_inside: bool) -> Room {
        Room {
            total,
            context_inside,
        }
    }

    /// Runs the search one trial at a time against a program whose peak at value v is `curve(v)`
    /// (a context of `context` charged on cards); returns each target's answer, the trials each
    /// took, and the search.
    fn solve(
        strategy: Strategy,
        lo: u64,
        hi: u64,
        rooms: Vec<Room>,
        curve: impl Fn(u64) -> u64,
        context: u64,
    ) -> (Vec<(Option<u64>, usize)>, Search) {
        let mut s = Search::new(lo, hi, rooms.clone(), strategy, "n");
        let mut trials = vec![0; s.targets()];
        while let Some((t, v)) = (0..s.targets()).find_map(|t| s.next(t).map(|v| (t, v))) {
            s.start(t, v);
            trials[t] += 1;
            let overhead = rooms[t].context_inside.then_some(context);
            let peak = curve(v);
            let verdict = match rooms[t].holds(peak, overhead.or(Some(0))) {
                true => Verdict::Fits { peak, overhead },
                false => Verdict::OutOfMemory,
            };
            s.finish(t, v, Some(verdict));
        }
        let answers = (0..s.targets())
            .map(|t| {
                assert!(s.settled(t));
                (s.largest_fitting(t), trials[t])
            })
            .collect();
        (answers, s)
    }

    fn cap(capacity: u64) -> impl Fn(u64) -> u64 {
        move |v| if v <= capacity { 1 } else { 1000 }
    }

    #[test]
    fn finds_the_exact_largest_value_anywhere_in_the_range() {
        for strategy in [Strategy::Peaks, Strategy::Bisection] {
            for c in 0..=70 {
                let (got, _) = solve(strategy, 1, 64, vec![room(1, CEILING)], cap(c), 0);
                let want = if c == 0 { None } else { Some(c.min(64)) };
                assert_eq!(got[0].0, want, "{strategy:?}: capacity {c}");
                assert!(got[0].1 <= 14, "capacity {c}: {} trials", got[0].1);
            }
        }
    }

    #[test]
    fn peaks_give_the_same_answers_as_bisection_in_fewer_trials() {
        let rooms = vec![
            room(1000 * MIB, CEILING),
            room(550 * MIB, CEILING),
            room(2048 * MIB, CARD),
        ];
        type Curve = Box<dyn Fn(u64) -> u64>;
        let curves: [(&str, Curve); 3] = [
            ("affine", Box::new(|v| 100 * MIB * v)),
            ("convex", Box::new(|v| 3 * MIB * v * v + 40 * MIB)),
            (
                "step",
                Box::new(|v| {
                    if v <= 7 {
                        300 * MIB
                    } else {
                        900 * MIB + v * MIB
                    }
                }),
            ),
        ];
        for (name, curve) in curves {
            let (peaks, _) = solve(Strategy::Peaks, 1, 200, rooms.clone(), &curve, 500 * MIB);
            let (bisect, _) = solve(
                Strategy::Bisection,
                1,
                200,
                rooms.clone(),
                &curve,
                500 * MIB,
            );
            let answers = |r: &[(Option<u64>, usize)]| r.iter().map(|a| a.0).collect::<Vec<_>>();
            assert_eq!(answers(&peaks), answers(&bisect), "{name}");
            let count = |r: &[(Option<u64>, usize)]| r.iter().map(|a| a.1).sum::<usize>();
            assert!(
                count(&peaks) <= count(&bisect),
                "{name}: {peaks:?} {bisect:?}"
            );
            if name == "affine" {
                assert!(count(&peaks) <= 12, "{peaks:?}");
            }
        }
    }

    #[test]
    fn a_peak_that_shrinks_as_the_value_grows_is_named() {
        let curve = |v: u64| if v == 2 { 50 * MIB } else { 100 * MIB * v };
        let (_, s) = solve(
            Strategy::Peaks,
            1,
            200,
            vec![room(1000 * MIB, CEILING)],
            curve,
            0,
        );
        let why = s.contradiction(0).expect("flagged");
        assert!(
            why.contains("n=1 peaks at 100.0 MiB but n=2 at 50.00 MiB"),
            "{why}"
        );
    }

    #[test]
    fn a_card_is_no_bigger_than_a_ceiling_of_its_size_but_not_the_other_way() {
        assert!(room(8, CARD).no_bigger_than(&room(8, CEILING)));
        assert!(!room(8, CEILING).no_bigger_than(&room(8, CARD)));
        assert!(!room(8, CEILING).no_bigger_than(&room(100, CARD)));
        assert!(room(8, CEILING).no_bigger_than(&room(9, CEILING)));
    }

    #[test]
    fn a_value_outside_every_open_bracket_is_moot() {
        let mut s = Search::new(1, 64, vec![room(1, CEILING)], Strategy::Bisection, "n");
        s.start(0, 8);
        s.start(0, 16);
        s.finish(0, 8, Some(Verdict::OutOfMemory));
        assert!(s.moot(0, 16));
        assert!(!s.moot(0, 4));
    }

    #[test]
    fn trials_in_flight_split_the_open_interval() {
        let mut s = Search::new(0, 100, vec![room(1, CEILING)], Strategy::Bisection, "n");
        let fits = Verdict::Fits {
            peak: 0,
            overhead: None,
        };
        s.finish(0, 0, Some(fits));
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
