//! The counter's order of a recording's changes of `used` ([`ChangeOrder`]): records come merged
//! by time, and each change of a device's `used` carries its number (modulo 2^[`ORDER_BITS`]) and
//! `used` after it, which put it back in the order the counter took it.

use std::collections::{HashMap, HashSet, VecDeque};

use gpumemhook_segment::layout::MemKind;
use gpumemhook_segment::recording::{EventKind, EventRecord, ORDER_BITS};

/// How many records may wait for a change that has not come yet. A thread descheduled between its
/// count and its clock reading brings a record late by as long, and the records of that time come
/// first: 2^19 records hold 0.17 s of four threads each changing `used` 750,000 times a second
/// (a fork storm on the stand-in driver made one record late by 15.7 ms, after 73,215 others),
/// in at most about 64 MiB (a record waiting and its key). Records wait only while a change is
/// missing, so an ordered file keeps none waiting.
const ORDER_WINDOW_EVENTS: usize = 1 << 19;
const ORDER_MODULUS: u8 = 1 << ORDER_BITS;
/// How many changes in a row may find theirs missing before the file's order is taken for noise
/// (hostile bytes) and records are handed on by time alone.
const ORDER_MISSES: u32 = 64;
/// How many changes that did not come in their place are remembered, so that one coming later
/// still is handed on at once (see [`ChangeOrder`]): those given up for missing, and the
/// successors of a ring's changes from before its whole part, the newest kept (a thread
/// descheduled at the boundary brings its next change late; 65,536 keys, about 4 MiB).
const MISSED_KEPT: usize = 1 << 16;

/// A change's place: its device, `used` before it, and its number modulo [`ORDER_MODULUS`].
type Key = (u8, u64, u8);

/// What a ring overwrote, as the order needs it: when the file's records start to be whole (the
/// newest overwritten event's time), and the devices whose changes it overwrote.
#[derive(Default)]
pub(crate) struct Overwritten {
    pub(crate) whole_from_ns: u64,
    pub(crate) devices: HashSet<u8>,
}

/// Puts each device's changes of `used` back in the order the counter took them. Records come
/// merged by time, but a record's time is read just after its count, so two threads' changes close
/// in time may come swapped. Each change carries its number (modulo [`ORDER_MODULUS`]), taken in
/// the same atomic add as its `used`, and `used` after it: the change numbered next that starts
/// from the `used` the device holds now is the next, and is handed on first (at the time of the
/// record it overtakes, so time still runs forward). A peak restart is a change of nothing with a
/// number of its own, so it takes its exact place.
///
/// Records are handed on as soon as their place is known; they wait only while the first of them
/// is a change whose predecessor has not come, up to [`ORDER_WINDOW_EVENTS`]. A change whose
/// predecessor never comes (lost to a full disk, cut by a kill, or later than the window) is then
/// handed on as it is, and the predecessor, should it come after all, is handed on at once without
/// moving the order on: `used` at the end stays the last change's.
///
/// Every process image counts from zero (a forked child and an `exec` make a segment of their own)
/// and records from its first change, so a device's first change is number 1 from `used` 0: the
/// order starts there, not at whichever change came first by time (a first change whose clock was
/// read late would otherwise be handed on last, leaving `used` at the end its value). For a device
/// whose changes a ring overwrote, the changes it kept from before its whole part (some threads'
/// chunks, not others') go by time, and its order starts at the whole part's first change by
/// time (no `used` anchors it: a ring's summary has `used` after the newest change it overwrote
/// by time, not by number, and a value that recurs later would start the order there).
#[derive(Default)]
pub(crate) struct ChangeOrder {
    waiting: VecDeque<Waiting>,
    /// How many waiting changes have each key: whether the next is there, without a walk.
    present: HashMap<Key, u32>,
    /// Per device: `used` after the last change handed on, and the next change's number.
    next: HashMap<u8, (u64, u8)>,
    /// What a ring overwrote, until the whole part of the file starts.
    overwritten: Option<Overwritten>,
    /// Devices whose order starts at the first change handed on (a ring's, in its whole part).
    unanchored: HashSet<u8>,
    /// The changes given up for missing, each with the `used` it left (the `used` the change
    /// handed on in its stead started from), and the order they were given up in (the oldest are
    /// forgotten first; one found again stays in the queue until then).
    missed: HashMap<Key, Option<u64>>,
    missed_order: VecDeque<Key>,
    /// Whether records are reordered at all (not for a file without orders, nor after
    /// [`ORDER_MISSES`] misses in a row).
    pub(crate) enabled: bool,
    /// Changes in a row whose predecessor was not found.
    pub(crate) misses: u32,
    /// How many records may wait ([`ORDER_WINDOW_EVENTS`]; fewer in tests).
    window: usize,
}

struct Waiting {
    ts: u64,
    record: EventRecord,
    tid: u32,
    /// `(used before, used after)` of a change of device memory, `None` for any other record.
    change: Option<(u64, u64)>,
    /// It has the key of the change after one of a ring's from before its whole part: if the
    /// order never reaches it, it came too late for its place.
    maybe_late: bool,
}

impl Waiting {
    fn key(&self) -> Option<Key> {
        let (before, _) = self.change?;
        Some((self.record.device, before, self.record.order))
    }
}

impl ChangeOrder {
    /// An order for a file whose records carry their numbers (`enabled`), starting each device
    /// at its first change, or as `overwritten` says.
    pub(crate) fn new(enabled: bool, overwritten: Option<Overwritten>) -> ChangeOrder {
        ChangeOrder {
            enabled,
            overwritten: overwritten.filter(|o| !o.devices.is_empty()),
            window: ORDER_WINDOW_EVENTS,
            ..ChangeOrder::default()
        }
    }

    /// Takes the next record by time; hands on (to `hand`) every record whose place is known.
    pub(crate) fn push(
        &mut self,
        ts: u64,
        record: EventRecord,
        tid: u32,
        mut hand: impl FnMut(u64, EventRecord, u32) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        if !self.enabled {
            self.flush(&mut hand)?;
            return hand(ts, record, tid);
        }
        let mut waiting = Waiting {
            ts,
            change: change_of(&record),
            record,
            tid,
            maybe_late: false,
        };
        if let Some(o) = &self.overwritten {
            if ts >= o.whole_from_ns {
                self.unanchored = self.overwritten.take().unwrap_or_default().devices;
            } else if waiting.change.is_some() && o.devices.contains(&waiting.record.device) {
                // Kept from before the whole part: some threads' changes, not others'. The next
                // change of its thread may be timed in the whole part (its thread descheduled
                // between count and clock): it is known by its key, and goes outside the order.
                if let Some((device, _, number)) = waiting.key() {
                    let after = waiting.change.map_or(0, |c| c.1);
                    self.remember_missed((device, after, (number + 1) % ORDER_MODULUS), None);
                }
                return self.hand_at_once(waiting, &mut hand);
            }
        }
        if let (Some(key), Some((_, after))) = (waiting.key(), waiting.change) {
            match self.missed.get(&key) {
                Some(&Some(left)) if left == after => {
                    self.missed.remove(&key);
                    return self.hand_outside(waiting, &mut hand);
                }
                // Only its key is known (`used` before and numbers recur): it waits for its
                // place like any other, and goes outside the order only if it never comes.
                Some(None) => {
                    self.missed.remove(&key);
                    waiting.maybe_late = true;
                }
                _ => {}
            }
        }
        if let Some(key) = waiting.key() {
            *self.present.entry(key).or_default() += 1;
        }
        self.waiting.push_back(waiting);
        self.hand_ready(&mut hand)?;
        while self.waiting.len() > self.window {
            self.give_up_front(&mut hand)?;
            self.hand_ready(&mut hand)?;
        }
        Ok(())
    }

    /// Hands on every waiting record: at the end, a change whose predecessor never came goes as
    /// it is.
    pub(crate) fn flush(
        &mut self,
        mut hand: impl FnMut(u64, EventRecord, u32) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        self.hand_ready(&mut hand)?;
        while !self.waiting.is_empty() {
            self.give_up_front(&mut hand)?;
            self.hand_ready(&mut hand)?;
        }
        Ok(())
    }

    /// `used` after the last change of `device` handed on and the next change's number: before
    /// the first, `used` 0 and number 1 (see the type's comment).
    fn expected(&self, device: u8) -> Option<(u64, u8)> {
        match self.next.get(&device) {
            Some(&next) => Some(next),
            None => (!self.unanchored.contains(&device)).then_some((0, 1)),
        }
    }

    /// Hands on records from the front while their place is known: a record that changes no
    /// `used`, the change expected next, or, when the first is another change, the expected one
    /// from further back (at the first's time).
    fn hand_ready(
        &mut self,
        hand: &mut impl FnMut(u64, EventRecord, u32) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        while let Some(front) = self.waiting.front() {
            let (Some(key), Some(device)) =
                (front.key(), front.change.map(|_| front.record.device))
            else {
                self.hand_front(hand)?;
                continue;
            };
            let Some((used, number)) = self.expected(device) else {
                self.hand_front(hand)?;
                continue;
            };
            if key == (device, used, number) {
                self.misses = 0;
                self.hand_front(hand)?;
            } else if self.present.contains_key(&(device, used, number)) {
                self.misses = 0;
                self.bring_forward((device, used, number));
                self.hand_front(hand)?;
            } else {
                return Ok(());
            }
        }
        Ok(())
    }

    /// The front is a change whose predecessor has not come and cannot wait longer: handed on as
    /// it is. Where the front is numbered right after the missing change, the missing one is
    /// remembered (it left `used` where the front starts), so that it is known if it comes: a
    /// change that only has its key (`used` before and number recur) is not taken for it.
    fn give_up_front(
        &mut self,
        hand: &mut impl FnMut(u64, EventRecord, u32) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        if self.waiting.front().is_some_and(|w| self.is_orphan(w)) {
            return match self.take_front() {
                Some(late) => self.hand_outside(late, hand),
                None => Ok(()),
            };
        }
        let front = self
            .waiting
            .front()
            .and_then(|w| Some((w.record.device, w.change?.0, w.record.order)));
        if let Some((device, front_before, front_number)) = front {
            let expected = self.expected(device);
            let follows = |e: &(u64, u8)| front_number == (e.1 + 1) % ORDER_MODULUS;
            if let Some((used, number)) = expected.filter(follows) {
                self.remember_missed((device, used, number), Some(front_before));
            }
            self.misses += 1;
            self.enabled &= self.misses < ORDER_MISSES;
        }
        self.hand_front(hand)
    }

    /// Whether `front`, which cannot wait longer, is a change the order went on without: one
    /// of a ring's boundary that never found its place, or, while the order is whole (its last
    /// expected change came), a change of a device it has handed on others of that nothing
    /// waiting follows (its successor went on already: a change whose predecessor was lost
    /// starts the order again, and is followed).
    fn is_orphan(&self, front: &Waiting) -> bool {
        let Some((_, after)) = front.change else {
            return false;
        };
        let device = front.record.device;
        let followed = || {
            let number = (front.record.order + 1) % ORDER_MODULUS;
            self.present.contains_key(&(device, after, number))
        };
        front.maybe_late || (self.misses == 0 && self.next.contains_key(&device) && !followed())
    }

    /// Remembers a change that did not come in its place: `after`, where known, is the `used` it
    /// must leave to be taken for it.
    fn remember_missed(&mut self, key: Key, after: Option<u64>) {
        if self.missed_order.len() == MISSED_KEPT {
            if let Some(oldest) = self.missed_order.pop_front() {
                self.missed.remove(&oldest);
            }
        }
        self.missed.insert(key, after);
        self.missed_order.push_back(key);
    }

    /// Hands on at once, outside the order, a change that came after the order went on without
    /// it: the changes after it carry `used` with it counted, so it goes with the device's `used`
    /// now (its own value, long past, would end the curve or land after a restart it came
    /// before): its own value is lost to the curve.
    fn hand_outside(
        &mut self,
        mut late: Waiting,
        hand: &mut impl FnMut(u64, EventRecord, u32) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        if let Some((used, _)) = self.next.get(&late.record.device) {
            late.record.used = *used;
        }
        self.hand_at_once(late, hand)
    }

    /// Takes the first waiting record out of the window.
    fn take_front(&mut self) -> Option<Waiting> {
        let front = self.waiting.pop_front()?;
        if let Some(key) = front.key() {
            if let Some(count) = self.present.get_mut(&key) {
                *count -= 1;
                if *count == 0 {
                    self.present.remove(&key);
                }
            }
        }
        Some(front)
    }

    /// Hands on a record at once, outside the order, at the time of the first record still
    /// waiting (time runs forward).
    fn hand_at_once(
        &mut self,
        record: Waiting,
        hand: &mut impl FnMut(u64, EventRecord, u32) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let ts = self
            .waiting
            .front()
            .map_or(record.ts, |w| w.ts.min(record.ts));
        hand(ts, record.record, record.tid)
    }

    /// Hands on the first waiting record and moves its device's order past it.
    fn hand_front(
        &mut self,
        hand: &mut impl FnMut(u64, EventRecord, u32) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let Some(front) = self.take_front() else {
            return Ok(());
        };
        if let Some((_, after)) = front.change {
            let number = (front.record.order + 1) % ORDER_MODULUS;
            self.next.insert(front.record.device, (after, number));
        }
        hand(front.ts, front.record, front.tid)
    }

    /// Moves the waiting change of `key` (there is one) to the front, at the front's time.
    fn bring_forward(&mut self, key: Key) {
        let Some(at) = self.waiting.iter().position(|w| w.key() == Some(key)) else {
            return;
        };
        if at > 0 {
            let ts = self.waiting[0].ts;
            if let Some(mut next) = self.waiting.remove(at) {
                next.ts = ts;
                self.waiting.push_front(next);
            }
        }
    }
}

/// `(used before, used after)` of a record that changes a device's `used` in the counter's order:
/// an allocation or a free of device memory, or a peak restart (a change of nothing).
fn change_of(r: &EventRecord) -> Option<(u64, u64)> {
    match EventKind::from_code(r.kind)? {
        EventKind::PeakReset => Some((r.used, r.used)),
        _ if MemKind::from_code(r.mem) != Some(MemKind::Device) => None,
        EventKind::Alloc => Some((r.used.checked_sub(r.bytes)?, r.used)),
        EventKind::Free => Some((r.used.checked_add(r.bytes)?, r.used)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumemhook_segment::recording::EventKind;

    fn change(kind: EventKind, bytes: u64, used: u64, order: u8) -> EventRecord {
        EventRecord {
            kind: kind as u8,
            bytes,
            used,
            order,
            ..EventRecord::default()
        }
    }

    /// Runs `records` (time, record) through `order`: what comes out, in order.
    fn through(order: &mut ChangeOrder, records: &[(u64, EventRecord)]) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut hand = |ts, r: EventRecord, _| {
            out.push((ts, r.used));
            Ok(())
        };
        for &(ts, r) in records {
            order.push(ts, r, 1, &mut hand).unwrap();
        }
        order.flush(&mut hand).unwrap();
        out
    }

    /// [`through`] a new [`ChangeOrder`].
    fn ordered(records: &[(u64, EventRecord)]) -> Vec<(u64, u64)> {
        through(&mut ChangeOrder::new(true, None), records)
    }

    #[test]
    fn changes_that_came_swapped_are_handed_on_in_the_counters_order() {
        use EventKind::{Alloc, Free, PeakReset};
        // The counter took +10 (0 -> 10, #1), +5 (10 -> 15, #2), -10 (15 -> 5, #3); the second
        // thread's clock was read late, so #2 comes last by time. It is handed on second, at the
        // time of the record it overtook, which keeps its own: time still runs forward.
        let records = [
            (100, change(Alloc, 10, 10, 1)),
            (110, change(Free, 10, 5, 3)),
            (120, change(Alloc, 5, 15, 2)),
        ];
        assert_eq!(ordered(&records), [(100, 10), (110, 15), (110, 5)]);
        // A peak restart takes its place by its number: between #1 and #2 here.
        let records = [
            (100, change(Alloc, 10, 10, 1)),
            (105, change(Alloc, 5, 15, 3)),
            (107, change(PeakReset, 0, 10, 2)),
        ];
        let out = ordered(&records);
        assert_eq!(out.len(), 3);
        assert_eq!(out[1], (105, 10), "the restart came before +5: {out:?}");
        assert_eq!(out[2], (105, 15), "+5 came after the restart: {out:?}");
        // Values only move in time, never change: the peak stays what the records hold.
        assert_eq!(out.iter().map(|p| p.1).max(), Some(15));
    }

    #[test]
    fn a_devices_first_change_comes_first_even_when_its_clock_was_read_last() {
        use EventKind::{Alloc, Free};
        // #1 (0 -> 7) was timed after #2 and #3: it is handed on first, so `used` ends at #3's.
        let records = [
            (100, change(Alloc, 5, 12, 2)),
            (110, change(Free, 5, 7, 3)),
            (120, change(Alloc, 7, 7, 1)),
        ];
        assert_eq!(ordered(&records), [(100, 7), (100, 12), (110, 7)]);
    }

    #[test]
    fn a_ring_keeps_what_came_before_its_whole_part_by_time_and_orders_from_it() {
        use EventKind::{Alloc, Free};
        // A ring overwrote device 0's changes up to time 100; before 100 it kept two changes of
        // one thread (#1 and #9) whose neighbours are gone: they go by time. From 100 on, the
        // order starts at the first change by time (#21); #20, timed after it, is never reached
        // and goes outside the order at the end, with `used` as it stands. #10, counted right
        // after #9 but timed in the whole part (its thread descheduled), has the key of #9's
        // successor: the order never reaches it either. `used` ends at #23's.
        let records = [
            (10, change(Alloc, 7, 7, 1)),
            (20, change(Alloc, 3, 40, 9)),
            (100, change(Alloc, 5, 60, 21)),
            (110, change(Alloc, 5, 55, 20)),
            (115, change(Alloc, 2, 42, 10)),
            (120, change(Free, 55, 5, 22)),
            (130, change(Alloc, 7, 12, 23)),
        ];
        let overwritten = Overwritten {
            whole_from_ns: 100,
            devices: HashSet::from([0]),
        };
        let mut order = ChangeOrder::new(true, Some(overwritten));
        let out = through(&mut order, &records);
        assert_eq!(
            out,
            [
                (10, 7),
                (20, 40),
                (100, 60),
                (110, 5),
                (110, 12),
                (110, 12),
                (115, 12)
            ]
        );
        assert_eq!(order.misses, 0);
    }

    #[test]
    fn a_change_late_by_many_records_takes_its_place_and_one_later_than_the_window_keeps_the_end() {
        use EventKind::{Alloc, Free};
        // #2 (10 -> 15) was timed after #3..#40 (each +1): it still comes second.
        let mut records = vec![(100, change(Alloc, 10, 10, 1))];
        records.extend((3..=40u64).map(|n| (100 + n, change(Alloc, 1, 15 + n - 2, n as u8))));
        records.push((1000, change(Alloc, 5, 15, 2)));
        let out = ordered(&records);
        assert_eq!(
            out.iter().map(|p| p.1).collect::<Vec<_>>()[..4],
            [10, 15, 16, 17]
        );
        assert_eq!(out.last().unwrap().1, 53);
        // With room for 8 records only, #2 is given up and #3 goes on as it is; #2, coming at
        // last, is handed on at once with `used` as it stands: `used` ends at #40's 53.
        let mut small = ChangeOrder::new(true, None);
        small.window = 8;
        let out = through(&mut small, &records);
        assert_eq!(out.len(), records.len());
        assert_eq!(out.last().unwrap().1, 53, "{out:?}");
        assert!(
            out.iter().all(|p| p.1 != 15),
            "#2's own value is lost: {out:?}"
        );
        // A free of the same shape: the late change's value goes in, the end stays.
        let late_free = [
            (1, change(Alloc, 8, 8, 1)),
            (2, change(Alloc, 2, 10, 3)),
            (3, change(Alloc, 2, 12, 4)),
            (9, change(Free, 0, 8, 2)),
        ];
        let mut small = ChangeOrder::new(true, None);
        small.window = 1;
        let out = through(&mut small, &late_free);
        assert_eq!(out.last().unwrap().1, 12, "{out:?}");
    }

    #[test]
    fn a_change_that_only_shares_a_missed_changes_key_is_not_taken_for_it() {
        use EventKind::{Alloc, Free};
        // A ring kept #1 and #2 (the main thread's chunk) and #68 on: #3 is missed. At the end
        // `used` is back where #3 started and #131 (131 = 3 modulo 64) starts from it: its key
        // is #3's, but it does not leave `used` where #68 starts, so it goes in its place and
        // `used` ends at its value.
        let mut records = vec![
            (1, change(Alloc, 1_048_576, 1_048_576, 1)),
            (2, change(Alloc, 4096, 1_052_672, 2)),
            (10, change(Alloc, 100, 5_000_100, 68 % 64)),
            (11, change(Free, 3_947_427, 1_052_673, 69 % 64)),
        ];
        for n in 70..=130u64 {
            let (kind, used) = if n % 2 == 0 {
                (Free, 1_052_672)
            } else {
                (Alloc, 1_052_673)
            };
            records.push((n, change(kind, 1, used, (n % 64) as u8)));
        }
        records.push((200, change(Free, 4096, 1_048_576, 3)));
        let mut order = ChangeOrder::new(true, None);
        order.window = 4;
        let out = through(&mut order, &records);
        assert_eq!(out.last().unwrap().1, 1_048_576, "{out:?}");
    }

    #[test]
    fn a_change_whose_predecessor_never_comes_is_handed_on_as_it_is() {
        use EventKind::Alloc;
        // #2 was lost (a full disk): #3 is handed on as it is.
        let far = 1_000_000_000;
        let records = [
            (100, change(Alloc, 10, 10, 1)),
            (200, change(Alloc, 7, 24, 3)),
            (far, change(Alloc, 1, 25, 4)),
        ];
        assert_eq!(ordered(&records), [(100, 10), (200, 24), (far, 25)]);
        // Numbers wrap at the record's modulus.
        let records = [
            (1, change(Alloc, 1, 1, ORDER_MODULUS - 1)),
            (2, change(Alloc, 1, 3, 1)),
            (3, change(Alloc, 1, 2, 0)),
        ];
        assert_eq!(ordered(&records), [(1, 1), (2, 2), (2, 3)]);
    }

    #[test]
    fn orders_that_never_match_are_given_up_and_records_go_by_time() {
        use EventKind::Alloc;
        // Every record numbered 0 (hostile bytes): after ORDER_MISSES misses in a row, records
        // are handed on as they come, each walk bounded, and none is lost.
        let records: Vec<(u64, EventRecord)> =
            (1..=1000u64).map(|i| (i, change(Alloc, 1, i, 0))).collect();
        let mut order = ChangeOrder::new(true, None);
        let out = through(&mut order, &records);
        assert!(!order.enabled);
        assert_eq!(out.len(), 1000);
        assert_eq!(out.iter().map(|p| p.1).max(), Some(1000));
    }
}
